"""Baseline against adapted on validation: overall, per category or field, confusions."""

from __future__ import annotations

from functools import partial
from typing import Any

from lorapilot.decision.rule import short_text
from lorapilot.evaluate.metrics import most_confused, per_group
from lorapilot.report import plots
from lorapilot.report.blocks import (
    KV,
    Image,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import (
    fdelta,
    fmt,
    isnum,
)
from lorapilot.report.sections.state import MAX_LISTED, _dict, _get, _list, _metric, _numeric_keys


def _overall_table(bm: Any, cm: Any, deltas: Any, first: str | None) -> Table:
    keys = _numeric_keys(bm, cm)
    if first in keys:
        keys = [first] + [k for k in keys if k != first]
    rows = []
    for k in keys:
        b, c = _metric(bm, k), _metric(cm, k)
        d = _get(deltas, "overall", k)
        if d is None and isnum(b) and isnum(c):
            d = c - b
        rows.append([k + (" (success metric)" if k == first else ""), fmt(b), fmt(c), fdelta(d)])
    return Table(["metric", "baseline", "adapted", "delta"], rows)


def _pair(b: Any, c: Any) -> str:
    if isnum(b) and isnum(c):
        return f"{fmt(b)} \u2192 {fmt(c)} ({fdelta(c - b)})"
    return fmt(c if c is not None else b)


def _label_scoring(s: dict) -> str | None:
    """How a classification's labels were ranked (None for other tasks or generation)."""
    ev = _dict(s, "eval")
    if _get(s, "task", "kind") != "classification" or ev.get("mode", "score") != "score":
        return None
    if ev.get("label_scoring") == "calibrated":
        return (
            "calibrated: score + offset from the content-free inputs N/A, '' and [MASK], each "
            "model its own (calibration.json beside its predictions)"
        )
    return "sum of each label's token log-probabilities"


def _generated(base: dict | None, chosen: dict | None) -> list:
    """eval.generation_check: the same validation answers generated greedily, as a chat server
    (vLLM, TGI, Ollama) serves the model, freely and constrained to the labels, beside the
    scored ones the decision was made on."""
    pairs = [(name, g) for name, g in (("baseline", base), ("adapted", chosen)) if g]
    if not pairs:
        return []
    keys = list(dict.fromkeys(k for _, g in pairs for k in g.get("metrics") or {}))
    ways = [
        (name, way, f)
        for name, g in pairs
        for way, f in (("free", g), ("constrained to the labels", g.get("constrained")))
        if f
    ]
    rows = [
        [
            name,
            way,
            f"{f['n_same']} of {f['n']} ({f['agreement']:.1%})",
            f"{f['n_labels']} of {f['n']}",
            *(_pair(_get(f, "metrics", k, "scored"), _get(f, "metrics", k, "generated"))
              for k in keys),
        ]
        for name, way, f in ways
    ]  # fmt: skip
    return [
        Sub("As a chat server answers"),
        Para(
            "The decision is made on label scoring. A runtime that generates (vLLM, TGI, "
            "Ollama, a transformers pipeline) answers greedily to the end of the turn: freely, "
            "or constrained to the labels' text where the server is given them as a choice "
            "(vLLM guided_choice, a TGI or llama.cpp grammar), which picks the likeliest "
            "allowed token one at a time. Here is how often that answer is the scored label, "
            "how often it is any label, and each metric scored \u2192 generated (reported, "
            "not gated; eval.generation_check)."
        ),
        Table(["model", "generation", "the scored label", "a label", *keys], rows),
    ]


def _results(s: dict) -> list:
    base, chosen = _dict(s, "baseline"), _dict(s, "chosen")
    bm, cm = base.get("metrics"), chosen.get("metrics")
    if not bm and not cm:
        return [
            NotRun(
                "no baseline and no adapted evaluation (`lorapilot baseline`, `lorapilot train`)"
            )
        ]
    out: list = [
        KV(
            [
                ("baseline run", base.get("id")),
                ("adapted run", chosen.get("id")),
                ("evaluation protocol", base.get("eval_protocol") or chosen.get("eval_protocol")),
                ("label scoring", _label_scoring(s)),
            ]
        )
    ]
    if not cm:
        out.append(NotRun("no completed, comparable train run: only the baseline is shown"))
    if chosen and chosen.get("comparable") is False:
        out.append(
            Para(f"not comparable with the baseline: {chosen.get('not_comparable_reason')}", "warn")
        )
    out += [
        Sub("Overall"),
        _overall_table(bm, cm, chosen.get("deltas"), _get(s, "success", "metric")),
    ]
    out += _generated(base.get("generation"), chosen.get("generation"))
    group, bper = per_group(bm)
    group_c, cper = per_group(cm)
    group = group_c if cm else group
    names = list(dict.fromkeys([*bper, *cper]))
    if names:
        entries = [v for v in [*bper.values(), *cper.values()] if isinstance(v, dict)]
        # leaf_f1: a structured field's leaves beneath it, beside its whole-value scores
        ms = [
            m
            for m in ("accuracy", "precision", "recall", "f1", "leaf_f1")
            if any(m in v for v in entries)
        ]
        out += [
            Sub("Per " + ("field" if group == "per_field" else "category")),
            Table(
                [group.replace("per_", ""), "support", *ms],
                [
                    [
                        n,
                        fmt(
                            _get(cper, n, "support")
                            if _get(cper, n, "support") is not None
                            else _get(bper, n, "support")
                        ),
                        *(_pair(_get(bper, n, m), _get(cper, n, m)) for m in ms),
                    ]
                    for n in names
                ],
            ),
        ]
        metric = "f1" if "f1" in ms else (ms[0] if ms else None)
        if metric:
            out.append(
                Image(
                    partial(plots.per_group_bars, bper, cper, metric),
                    f"{metric} per group",
                    f"{metric} per {group.replace('per_', '')}: baseline (grey) vs adapted (blue).",
                )
            )
    for who, m in (("baseline", bm), ("adapted", cm)):
        conf = _get(m, "confusion")
        if isinstance(conf, dict) and conf.get("matrix") and conf.get("labels"):
            labels = [str(x) for x in conf["labels"]]
            if len(labels) > CONFUSION_MAX_LABELS:  # a heatmap this size is unreadable
                out += _confused_pairs(who, conf["matrix"], labels)
                continue
            out += [
                Sub(f"Confusion matrix: {who}"),
                Image(
                    partial(
                        plots.confusion,
                        conf["matrix"],
                        labels,
                        f"{who}: rows gold, columns predicted",
                    ),
                    f"confusion matrix {who}",
                    f"{who}: rows are the gold label, columns the prediction.",
                ),
                Table(
                    ["gold \\ predicted", *labels],
                    [
                        [lab, *(fmt(v) for v in row)]
                        for lab, row in zip(labels, conf["matrix"], strict=False)
                    ],
                    only="md",
                ),
            ]
    f = chosen.get("flips")
    if isinstance(f, dict):
        fixed, broken = f.get("fixed") or [], f.get("broken") or []
        out += [
            Sub("Flips: examples whose correctness changed"),
            KV(
                [
                    ("fixed (wrong before, right after)", len(fixed)),
                    ("broken (right before, wrong after)", len(broken)),
                    ("examples in both runs", f.get("n_common")),
                    ("only in the baseline", f.get("only_base")),
                    ("only in the adapted run", f.get("only_candidate")),
                    (f"fixed ids (first {MAX_LISTED})", fixed[:MAX_LISTED] or None),
                    (f"broken ids (first {MAX_LISTED})", broken[:MAX_LISTED] or None),
                ]
            ),
        ]
        for direction in ("fixed", "broken"):
            shown = [e for e in _list(_dict(f, "examples"), direction) if isinstance(e, dict)]
            if shown:
                out += [
                    Sub(f"{direction.capitalize()} examples (first {len(shown)})"),
                    Table(
                        ["id", "text", "gold", "baseline", "adapted"],
                        [
                            [
                                e.get("id"),
                                e.get("text"),
                                short_text(e.get("gold"), 120),
                                short_text(e.get("baseline"), 120),
                                short_text(e.get("adapted"), 120),
                            ]
                            for e in shown
                        ],
                    ),
                ]
    return out


CONFUSION_MAX_LABELS = 12  # above: the most confused pairs, the full matrix as a CSV


def _confused_pairs(who: str, matrix: list, labels: list[str]) -> list:
    pairs = most_confused(matrix, labels)
    return [
        Sub(f"Most confused pairs: {who}"),
        Table(
            ["gold", "predicted", "count", "share of gold"],
            [[p["gold"], p["predicted"], p["count"], f"{p['share']:.0%}"] for p in pairs],
        )
        if pairs
        else Para("no confusion: every prediction is its gold label"),
        Para(
            f"{len(labels)} labels: the full matrix is in deliverable/confusion_{who}.csv "
            "(rows gold, columns predicted)."
        ),
    ]
