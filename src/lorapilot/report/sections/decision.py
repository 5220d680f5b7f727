"""The decision and the hypothesis with its pre-registered criteria, and the limitations."""

from __future__ import annotations

from typing import Any

from lorapilot.decision.rule import short_text
from lorapilot.report.blocks import (
    KV,
    NOT_RUN,
    Banner,
    Items,
    Mark,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import (
    DASH,
    ci_text,
    fbytes,
    fdelta,
    fmt,
    fraw,
    fsec,
    fusd,
    isnum,
    support_text,
)
from lorapilot.report.prompting import shown
from lorapilot.report.sections.state import _dict, _get, _list


def _decision(s: dict) -> list:
    d = s.get("decision")
    if not isinstance(d, dict) or not d.get("decision"):
        return [
            Banner(None),
            NotRun(
                "no decision: it needs a baseline evaluation and a completed, "
                "comparable train run (`lorapilot baseline`, `lorapilot train`)"
            ),
        ]
    out: list = [Banner(str(d["decision"])), Items([str(r) for r in d.get("reasons") or []])]
    sel = _dict(s, "selection")
    out.append(
        KV(
            [
                ("adapted run (chosen)", _get(s, "chosen", "id")),
                ("variant", _get(s, "chosen", "name")),
                ("baseline run", _get(s, "baseline", "id")),
                ("variants tried", f"{sel.get('n_tried', DASH)} of {len(_list(sel, 'variants'))}"),
                ("chosen by", d.get("chosen_by")),
            ]
        )
    )
    variants = [v for v in _list(sel, "variants") if isinstance(v, dict)]
    if variants:
        seeds = sel.get("seeds") or 1
        out.append(Sub(f"Variants, selected on validation {sel.get('metric')}"))
        metric = _get(s, "success", "metric")
        # extraction compares fields, classification categories: say which the delta is over
        group = next(
            (v["worst"].get("group") for v in variants if isinstance(v.get("worst"), dict)),
            "per_category",
        )
        out.append(
            Table(
                [
                    "variant",
                    "change",
                    "run",
                    "status",
                    f"{sel.get('metric')} (mean of {seeds} seeds)"
                    if seeds > 1
                    else str(sel.get("metric")),
                    f"{metric} delta" + (" (median seed)" if seeds > 1 else ""),
                    f"worst {str(group).replace('_', '-')} delta",
                    "time",
                    "median step",
                    "cost",
                    "peak memory",
                    "tries",
                    "note",
                ],  # fmt: skip
                [
                    [
                        Mark(f"{v.get('name')} (selected)", True)
                        if v.get("selected")
                        else v.get("name"),
                        _change(v.get("diff")),
                        v.get("run_id") or DASH,
                        v.get("status"),
                        fmt(v.get("value")),
                        fdelta(v.get("delta")),
                        _worst(v.get("worst")),
                        fsec(v.get("seconds")),
                        fsec(v.get("median_step_s")),
                        fusd(v.get("cost_usd")),
                        fbytes(v.get("peak_memory_bytes")),
                        fmt(v.get("tries")),
                        short_text(v.get("reason") or "", 80) if v.get("reason") else "",
                    ]
                    for v in variants
                ],
            )
        )
        if seeds > 1:
            out += _seeds(sel, variants, metric)
        ad_hoc = _list(sel, "ad_hoc_runs")
        if ad_hoc:
            out.append(
                Para(
                    f"{len(ad_hoc)} ad-hoc train run(s) (`train --set`, not in the plan) are "
                    "listed under Runs but were not eligible for selection"
                )
            )
    b = d.get("bootstrap")
    rules = []
    if isinstance(d.get("success"), dict):
        rules.append(("success", d["success"]))
    rules += [("guard", g) for g in d.get("guards") or [] if isinstance(g, dict)]
    if rules:
        out.append(Sub("Pre-registered checks"))
        out.append(
            Table(
                [
                    "check",
                    "metric",
                    "rule",
                    "baseline",
                    "adapted",
                    "threshold",
                    "support",
                    "95% CI",
                    "status",
                    "detail",
                ],  # fmt: skip
                [
                    [
                        kind,
                        r.get("metric"),
                        r.get("rule"),
                        fmt(r.get("baseline")),
                        fmt(r.get("candidate")),
                        fmt(r.get("threshold")),
                        support_text(r),
                        ci_text(r, b if kind == "success" else None),
                        Mark(
                            str(r.get("status")), {"pass": True, "fail": False}.get(r.get("status"))
                        ),
                        r.get("detail"),
                    ]
                    for kind, r in rules
                ],
            )
        )
    if isinstance(b, dict):
        level = f"{100 * b['ci']:g}%" if isnum(b.get("ci")) else "95%"
        out.append(Sub("Paired bootstrap"))
        out.append(
            KV(
                [
                    ("statistic", b.get("stat")),
                    ("gain (point estimate)", fdelta(b.get("delta"))),
                    (f"{level} CI", f"[{fdelta(b.get('ci_low'))}, {fdelta(b.get('ci_high'))}]"),
                    ("P(gain \u2264 0)", fmt(b.get("p_le_zero"))),
                    ("paired examples", fmt(b.get("n"))),
                    ("resamples", fmt(b.get("n_boot"))),
                    ("note", b.get("note")),
                ]
            )
        )
    else:
        out.append(Para("no paired bootstrap: the gain cannot be told from noise"))
    return out + _prompting(s) + _probe(s)


def _prompting(s: dict) -> list:
    """The chosen adapter against the base prompted with K training examples, if measured."""
    p = s.get("prompting")
    if not isinstance(p, dict):
        return []
    rows = [
        ("few-shot run", p.get("run_id")),
        (f"{p.get('metric')}, {p.get('shots')}-shot base", fmt(p.get("few_shot"))),
    ]
    words = (
        "Reported, not part of the decision: the success criterion is pre-registered "
        "against the zero-shot baseline. Beating prompting means a gain of at least "
        f"success.min_gain ({fdelta(p.get('min_gain'))}) with the CI above 0."
    )
    title = f"Against prompting: the base shown {shown(p)}"
    return _alternative(p, title, rows, "prompting", p.get("adapter_beats_prompting"), words)


def _probe(s: dict) -> list:
    """The chosen adapter against a logistic regression on the base's features, if fitted."""
    p = s.get("linear_probe")
    if not isinstance(p, dict):
        return []
    rows = [
        ("linear-probe run", p.get("run_id")),
        (f"{p.get('metric')}, linear probe", fmt(p.get("probe"))),
    ]
    words = (
        "A multinomial logistic regression on the frozen base's final hidden state at "
        f"each prompt's last token, fitted on {fmt(p.get('fitted_on'))} training examples "
        "(`lorapilot baseline --linear-probe`): the base as an encoder, no adapter, one "
        "forward pass per input. Reported, not part of the decision; beating it means a "
        f"gain of at least success.min_gain ({fdelta(p.get('min_gain'))}) with the CI "
        "above 0."
    )
    title = "Against an embedding classifier: a linear probe on the base's features"
    return _alternative(p, title, rows, "the probe", p.get("adapter_beats_probe"), words)


def _alternative(p: dict, title: str, rows: list, what: str, beats: Any, words: str) -> list:
    """One alternative to adapting set against the chosen adapter (report/prompting.py)."""
    out: list = [Sub(title)]
    if p.get("why_not"):
        return out + [Para(f"not compared ({p.get('run_id')}): {p['why_not']}")]
    ci = (
        f"[{fdelta(p.get('ci_low'))}, {fdelta(p.get('ci_high'))}]"
        if isnum(p.get("ci_low"))
        else DASH
    )
    rows = [
        *rows,
        (f"{p.get('metric')}, adapted", fmt(p.get("adapted"))),
        (f"gain over {what}", fdelta(p.get("gain"))),
        ("95% CI (paired bootstrap)", ci),
        (f"adapter beats {what}", Mark("yes" if beats else "no", bool(beats))),
    ]
    return out + [KV(rows), Para(words)]


def _change(diff: Any) -> str:
    """{key: [old, new]} as `key: old -> new`, one per key."""
    if not isinstance(diff, dict) or not diff:
        return DASH
    parts = []
    for k, v in diff.items():
        old, new = v if isinstance(v, list) and len(v) == 2 else (None, v)
        parts.append(f"{k}: {short_text(old, 30)} -> {short_text(new, 30)}")
    return "; ".join(parts)


def _worst(w: Any) -> str:
    if not isinstance(w, dict):
        return DASH
    return f"{fdelta(w.get('delta'))} ({w.get('name')})"


def _rule_text(g: dict) -> str:
    if g.get("max_drop") is not None:
        return f"{g.get('metric')} may drop by at most {fmt(g['max_drop'])}"
    if g.get("min") is not None:
        return f"{g.get('metric')} must be at least {fmt(g['min'])}"
    if g.get("min_gain") is not None:
        return f"{g.get('metric')} must gain at least {fmt(g['min_gain'])}"
    if g.get("max") is not None:
        return f"{g.get('metric')} must be at most {fmt(g['max'])}"
    if g.get("max_rise") is not None:
        return f"{g.get('metric')} may rise by at most {fmt(g['max_rise'])}"
    return str(g.get("metric"))


def _hypothesis(s: dict) -> list:
    out: list = [Para(str(s.get("hypothesis") or NOT_RUN + ": no hypothesis recorded"))]
    task = _dict(s, "task")
    fields = [f.get("name") if isinstance(f, dict) else f for f in task.get("fields") or []]
    out.append(
        KV([("task", task.get("kind")), ("labels", task.get("labels")), ("fields", fields or None)])
    )
    out.append(Sub("Success criterion"))
    succ = s.get("success")
    if isinstance(succ, dict) and succ.get("metric"):
        out.append(
            Para(
                f"{succ['metric']} must gain at least {fdelta(succ.get('min_gain'))} over the "
                "baseline, with the lower bound of the paired bootstrap CI above 0."
            )
        )
    else:
        out.append(Para("no success criterion set: the decision cannot be GO"))
    out.append(Sub("Guards"))
    guards = [g for g in _list(s, "guards") if isinstance(g, dict)]
    out.append(Items([_rule_text(g) for g in guards]) if guards else Para("no guards set"))
    lim = s.get("limits")
    if isinstance(lim, dict):
        out.append(Sub("Limits"))
        out.append(
            KV(
                [
                    ("peak memory", f"{lim['memory_gb']} GB" if lim.get("memory_gb") else None),
                    ("time per run", f"{lim['time_hours']} h" if lim.get("time_hours") else None),
                    ("price", f"{fusd(lim.get('usd_per_hour'))} / h"),
                    ("cost cap", fusd(lim.get("cost_cap_usd"))),
                    ("rental days", lim.get("rental_days")),
                    ("estimate margin", fraw(lim.get("margin"))),
                    ("operating window", lim.get("window")),
                ]
            )
        )
    return out


def _seeds(sel: dict, variants: list[dict], metric: Any) -> list:
    """selection.seeds > 1: every seed of every variant, and what their spread says about the
    choice and the gain."""
    rows = [
        [
            Mark(f"{v.get('name')} (selected)", True) if v.get("selected") else v.get("name"),
            fmt(sd.get("seed")),
            sd.get("run_id") or DASH,
            sd.get("status"),
            fmt(sd.get("value")),
            fdelta(sd.get("delta")),
            "median: carried to verify and the test"
            if v.get("selected") and sd.get("run_id") == v.get("run_id")
            else "",
        ]
        for v in variants
        for sd in _list(v, "seeds")
        if isinstance(sd, dict)
    ]
    out: list = [
        Sub(f"Seeds: each variant trained {sel.get('seeds')} times"),
        Table(
            [
                "variant",
                "train.seed",
                "run",
                "status",
                str(sel.get("metric")),
                f"{metric} delta",
                "",
            ],
            rows,
        ),  # fmt: skip
    ]
    noise = _dict(sel, "seed_noise")
    if noise:
        spread = f"{fmt(noise.get('low'))}-{fmt(noise.get('high'))}, sd {fmt(noise.get('sd'))}"
        text = f"{noise.get('variant')}'s seeds range {spread}. "
        if noise.get("runner_up") is not None:
            text += (
                f"The runner-up, {noise['runner_up']}, ranges "
                f"{fmt(noise.get('runner_up_low'))}-{fmt(noise.get('runner_up_high'))}: "
                + (
                    "the chosen variant's worst seed beats its best."
                    if noise.get("separated")
                    else "the ranges overlap, so the choice between them is within seed noise."
                )
            )
        short = _list(noise, "short_of_criterion")
        text += (
            f" {len(short)} of {noise.get('seeds')} seeds fall short of the success criterion's "
            "gain on their own."
            if short
            else f" Every seed meets the success criterion's gain (+{fmt(noise.get('min_gain'))})."
        )
        out.append(Para(text.strip()))
    return out


def _limitations(s: dict) -> list:
    lims = [str(x) for x in _list(s, "limitations")]
    return [Items(lims)] if lims else [Para("No limitation was recorded.")]
