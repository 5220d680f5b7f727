"""What a batch of predictions holds when there is no answer key to score them against (pure):
for a classification how many inputs went to each label (and how many answers were none,
when the labels are generated; a multi-label input counts for each of its labels); for
extraction and format tasks how many outputs were valid JSON, valid under the target schema
(or the format's regex); for every task how many inputs were cut to fit `data.max_length`."""

from __future__ import annotations

from typing import Any

from lorapilot.data.inputs import SHOWN_IDS
from lorapilot.evaluate.metrics import label_set_invalid
from lorapilot.evaluate.structured import Scorer, format_metrics
from lorapilot.spec import EvalNormalize, TaskSpec


def prediction_summary(task: TaskSpec, rows: list[dict]) -> dict[str, Any]:
    """The summary of prediction rows (evaluate.runner.score_predictions' rows, or the image
    ones)."""
    n = len(rows)
    out: dict[str, Any] = {"n": n}
    if task.multi_label:  # each input counts once for every label it was given
        counts = dict.fromkeys(task.labels or [], 0)
        for r in rows:
            for label in r["parsed"] or ():
                counts[label] += 1
        out["predicted"] = counts
        out["not_a_label"] = sum(
            label_set_invalid(r["parsed"], r.get("unknown_labels")) for r in rows
        )
    elif task.labelled:
        counts = dict.fromkeys(task.labels or [], 0)
        none = 0
        for r in rows:
            if r["parsed"] in counts:
                counts[r["parsed"]] += 1
            else:
                none += 1
        out["predicted"] = counts
        out["not_a_label"] = none
    else:
        checked = format_metrics([r.get("raw_output") or "" for r in rows], task)
        out.update(
            {
                k: v
                for k, v in checked.items()
                if k not in ("n", "valid", "parsed", "correct") and not isinstance(v, list)
            }
        )
        if task.kind == "extraction":  # valid under the target schema: the evaluation's name
            out["schema_valid_rate"] = out.pop("format_valid_rate")
        if task.grounded:  # values the input does not contain, as the evaluation counts them
            scorer = Scorer(task, EvalNormalize())
            strings = ungrounded = 0
            for r in rows:
                c, _, _ = scorer.counts(None, r.get("raw_output") or "", text=r.get("text") or "")
                strings += c.get("strings", 0)
                ungrounded += c.get("ungrounded", 0)
            out["ungrounded_value_rate"] = ungrounded / strings if strings else 0.0
    cut = [r["id"] for r in rows if r.get("tokens_cut")]
    out["truncated"] = {"n": len(cut), "ids": cut[:SHOWN_IDS]}
    return out
