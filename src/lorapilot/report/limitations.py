"""The report's limitations: what the records say a reader of the decision must know (a leak
kept, a weak baseline, a test split used twice, a deliverable that answers otherwise than it
was judged). Pure but for the spec: rows and records in, sentences out."""

from __future__ import annotations

from lorapilot.data.dataset import describe_leaks
from lorapilot.evaluate.metrics import per_group
from lorapilot.evaluate.served import generation_warning
from lorapilot.spec import Pilot


def export_warnings(exports: list[dict]) -> list[str]:
    """What an export's check warned of (a GGUF classifier that generates other answers than
    the labels it scored): a limitation of the deliverable, beside the decision."""
    return [
        f"the {e.get('format')} export in {e.get('folder')}: {w}"
        for e in exports
        for w in (e.get("serving_check") or {}).get("warnings") or []
    ]


def label_set_warnings(predictions: list[dict]) -> list[str]:
    """A multi-label adapter that names one label at most where validation examples have
    several has learnt a single-label classifier: its exact-set accuracy and the recall of
    co-occurring labels are capped, which a macro-F1 gain alone does not show."""
    gold = [r for r in predictions if isinstance(r.get("gold"), list)]
    several = sum(len(r["gold"]) > 1 for r in gold)
    named = sum(len(r.get("parsed") or ()) > 1 for r in gold)
    if not several or named:
        return []
    return [
        f"the chosen adapter named one label at most for every validation example, while "
        f"{several} of {len(gold)} have two or more: it answers as a single-label classifier "
        "(compare `labels_per_example` with `predicted_per_example`)"
    ]


def generation_warnings(chosen: dict | None) -> list[str]:
    """The chosen adapter served by a runtime that generates answers other labels than the
    ones it was decided on (`evaluate.served`): a limitation of the decision as deployed."""
    if not chosen or not chosen.get("generation"):
        return []
    who = f"the chosen adapter (train run {chosen['id']})"
    text = generation_warning(who, chosen["generation"])
    return [text] if text else []


def degenerate_baseline(predictions: list[dict] | None, share: float = 0.5) -> list[str]:
    """A classification baseline that puts more than `share` of the examples in one class is
    a weak starting point: any adapter gains against it, so the report says so."""
    if not predictions:
        return []
    counts: dict[str, int] = {}
    for r in predictions:
        label = r.get("parsed")
        if isinstance(label, list):  # a multi-label answer: the same set every time
            label = ", ".join(label)
        if isinstance(label, str):
            counts[label] = counts.get(label, 0) + 1
    if not counts:
        return []
    label, n = max(counts.items(), key=lambda kv: kv[1])
    if n <= share * len(predictions):
        return []
    return [
        f"the baseline predicted {label!r} for {n} of {len(predictions)} validation examples "
        f"({n / len(predictions):.0%}): a near-constant zero-shot baseline is a weak starting "
        "point, and the gain over it says more about the prompt than about the adapter; "
        "`eval.label_scoring: calibrated` (docs/text-tasks.md) divides out the labels the "
        "model prefers without any input, for the baseline and adapters alike (pre-register it "
        "in a new spec: it changes the evaluation protocol)"
    ]


def limitations(
    pilot: Pilot, rows: list[dict], chosen: dict | None, ledger: list[dict], data
) -> list[str]:
    """Collected automatically from the records; the report lists them all."""
    out: list[str] = []
    spec = pilot.spec
    if chosen and chosen.get("metrics"):
        _, per = per_group(chosen["metrics"])
        small = [
            f"{k} ({v.get('support')})"
            for k, v in per.items()
            # a path no gold example fills has nothing to be small about
            if isinstance(v.get("support"), int) and 0 < v["support"] < spec.eval.min_support
        ]
        if small:
            out.append(f"small validation support (< {spec.eval.min_support}): {', '.join(small)}")
    if len(ledger) > 1:
        out.append(
            f"the test split was used {len(ledger)} times; only the first use is an unbiased "
            "estimate"
        )
    bad = [r for r in rows if r["status"] in ("failed", "interrupted", "stopped_by_limit")]
    for r in bad:
        out.append(
            f"run {r['id']} ({r['kind']}) {r['status']}: {(r['reason'] or '').strip()[:160]}"
        )
    if data and data.get("skipped"):
        out.append(f"{len(data['skipped'])} invalid record(s) were skipped by the data policy")
    unlisted = (data or {}).get("unlisted_labels")
    if isinstance(unlisted, dict) and unlisted.get("dropped"):
        out.append(
            f"{unlisted['dropped']} example(s) with labels outside task.labels were left out "
            "(data.unlisted_labels: drop); the decision covers the pilot's labels only"
        )
    conv = (data or {}).get("messages")  # data.fields.messages: the data's own system turns
    if isinstance(conv, dict) and conv.get("system_differs"):
        out.append(
            f"{conv['system_differs']} of {conv['n_examples']} conversations in the data carry "
            "a system turn other than task.system: the adapter was trained and judged with "
            "task.system's prompt, not the one the data was written with (a server that sends "
            "the data's system prompt asks it something else)"
        )
    shared = ((data or {}).get("groups") or {}).get("shared")
    if shared and isinstance(shared, list):
        out.append(
            f"{len(shared)} group(s) of data.split.group are in more than one given split: "
            "their examples share an origin across splits"
        )
    kept = (data or {}).get("duplicates", {}).get("cross_split") or []
    if kept and isinstance(kept, list):  # under data.leakage: warn (or records before it)
        out.append(
            f"{len(kept)} duplicate pair(s) across splits were kept (data.leakage: "
            f"{(data or {}).get('duplicates', {}).get('leakage_policy', 'warn')}): "
            + describe_leaks([p for p in kept if isinstance(p, dict)], limit=5)
            + "; a held-out score on a leaked example measures memory, not the task"
        )
    if data and data.get("duplicates", {}).get("dropped_from_train"):
        out.append(
            f"{len(data['duplicates']['dropped_from_train'])} leaked example(s) were dropped from "
            "train"
        )
    n_val = sum(
        (data or {}).get("per_category", {}).get(c, {}).get("val", 0)
        for c in (data or {}).get("per_category", {})
    )
    if n_val and n_val < 200:
        out.append(
            f"the validation split has {n_val} examples: differences of a few points are within "
            "noise"
        )
    if chosen and chosen.get("flips"):
        f = chosen["flips"]
        if f.get("broken"):
            out.append(f"the adapter broke {len(f['broken'])} example(s) the base model got right")
    return out
