"""The runs of the plan, the training curves, verify and the one test of the chosen run."""

from __future__ import annotations

from functools import partial
from typing import Any

from lorapilot.evaluate.metrics import per_group
from lorapilot.report import plots
from lorapilot.report.blocks import (
    KV,
    Image,
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
    fdelta,
    fmt,
    fsec,
    fusd,
    isnum,
    mark,
    support_text,
)
from lorapilot.report.sections.model import _record
from lorapilot.report.sections.results import _pair
from lorapilot.report.sections.state import _dict, _get, _list, _metric, _numeric_keys


def _runs(s: dict) -> list:
    runs = [r for r in _list(s, "runs") if isinstance(r, dict)]
    if not runs:
        return [NotRun("no run recorded in runs/")]
    metric = _get(s, "success", "metric")
    chosen_id, base_id = _get(s, "chosen", "id"), _get(s, "baseline", "id")
    rows = []
    for r in runs:
        tag = (
            " (chosen)"
            if r.get("id") == chosen_id
            else " (baseline)"
            if r.get("id") == base_id
            else ""
        )
        status = str(r.get("status"))
        note = r.get("reason") or (
            r.get("not_comparable_reason") if r.get("comparable") is False else None
        )
        rows.append(
            [
                f"{r.get('id')}{tag}",
                r.get("kind"),
                r.get("split"),
                Mark(status, {"completed": True, "running": None}.get(status, False)),
                r.get("variant"),
                fmt(r.get("diff")) if r.get("diff") else DASH,
                fmt(r.get("seed")),
                r.get("data_version"),
                r.get("eval_protocol"),
                fsec(r.get("wall_s")),
                fusd(r.get("cost_usd")),
                fmt(_metric(r.get("metrics"), metric)),
                fdelta(_get(r, "deltas", "overall", metric)),
                " ".join(str(note).split())[:400] if note else DASH,
            ]
        )
    out: list = [
        Table(
            [
                "run",
                "kind",
                "split",
                "status",
                "variant",
                "change",
                "seed",
                "data",
                "eval protocol",
                "wall time",
                "cost",
                metric or "metric",
                "delta",
                "reason / note",
            ],
            rows,
        )
    ]
    smoke = s.get("smoke")
    if isinstance(smoke, dict):
        out.append(
            Para(
                f"smoke test (wiring, not quality): {'ok' if smoke.get('ok') else 'FAILED'}, "
                f"{fmt(smoke.get('n_correct'))}/{fmt(smoke.get('n_examples'))} memorised, "
                f"final loss {fmt(smoke.get('final_loss'), 4)}",
                None if smoke.get("ok") else "warn",
            )
        )
    return out


def _curves(s: dict) -> list:
    curves = {k: v for k, v in _dict(s, "curves").items() if isinstance(v, dict)}
    if not any(c.get("train") or c.get("val") for c in curves.values()):
        return [NotRun("loss curves are written by train runs")]

    def last(pts: Any, i: int = -1) -> Any:
        return pts[i][1] if pts and len(pts[i]) > 1 else None

    stopping = any(isinstance(c.get("early_stopping"), dict) for c in curves.values())
    rows = []
    for rid, c in curves.items():
        tr, va = c.get("train") or [], c.get("val") or []
        vals = [p[1] for p in va if len(p) > 1 and isnum(p[1])]
        rows.append(
            [
                rid,
                c.get("label"),
                fmt(tr[-1][0] if tr else None),
                fmt(last(tr, 0), 4),
                fmt(last(tr), 4),
                fmt(last(va, 0), 4),
                fmt(last(va), 4),
                fmt(min(vals) if vals else None, 4),
                *([_adapter_step(c.get("early_stopping"))] if stopping else []),
            ]
        )
    return [
        Image(
            partial(plots.loss_curves, curves),
            "training and validation loss",
            "Training loss per optimizer step (solid) and validation loss (dashed), one colour "
            "per run.",
        ),
        Table(
            [
                "run",
                "variant",
                "steps",
                "first train loss",
                "last train loss",
                "first val loss",
                "last val loss",
                "best val loss",
                *(["adapter weights (train.early_stopping)"] if stopping else []),
            ],
            rows,
        ),
    ]


def _adapter_step(es: Any) -> str:
    """Which step's weights the adapter holds, for a run with train.early_stopping."""
    if not isinstance(es, dict):
        return "last step"
    stopped = f"stopped early at {es.get('stopped_at_step')}" if es.get("stopped_early") else ""
    if es.get("restored"):
        return f"step {es.get('best_step')} (best val loss)" + (f"; {stopped}" if stopped else "")
    return "last step" + (f" ({stopped})" if stopped else "")


def _verify(s: dict) -> list:
    v = s.get("verify")
    if not isinstance(v, dict):
        return [
            NotRun(
                "`lorapilot verify PILOT` reloads the adapter in a fresh process and re-evaluates"
            )
        ]
    trained_sha = _get(_record(s), "result", "base", "sha256")
    same = (
        None if not (trained_sha and v.get("base_sha256")) else trained_sha == v.get("base_sha256")
    )
    mismatches = v.get("n_mismatched_predictions", v.get("mismatches"))
    return [
        KV(
            [
                ("verify run", v.get("id")),
                ("status", v.get("status")),
                ("ok", mark(v.get("ok"))),
                ("metrics match", mark(v.get("metrics_match"))),
                (
                    "mismatched predictions",
                    fmt(mismatches) if not isinstance(mismatches, list) else len(mismatches),
                ),
                ("base sha256 at verify", v.get("base_sha256")),
                ("same base as trained", mark(same, "yes", "NO")),
            ]
        ),
        *([Sub("Problems"), Items([str(p) for p in v["problems"]])] if v.get("problems") else []),
    ]


def _test(s: dict) -> list:
    ledger = [e for e in _list(s, "test_ledger") if isinstance(e, dict)]
    out: list = [KV([("uses of the test split", len(ledger))])]
    if len(ledger) > 1:
        out.append(
            Para(
                f"the test split was used {len(ledger)} times: only the first use is an unbiased "
                "estimate",
                "warn",
            )
        )
    if ledger:
        out.append(
            Table(
                ["run", "evaluated", "time"],
                [[e.get("run"), e.get("evaluated"), e.get("time")] for e in ledger],
            )
        )
    t = s.get("test")
    if not isinstance(t, dict) or not t.get("metrics"):
        out.append(
            NotRun(
                "no final test evaluation of the chosen adapter "
                "(`lorapilot eval PILOT --split test --final`)"
            )
        )
        return out
    m = t["metrics"]
    val_m = _get(s, "chosen", "metrics") or {}
    gain = _dict(t, "gain")
    boot = _dict(gain, "bootstrap")
    if gain:
        out += [
            Sub("Test gain over the base (same test rows, paired)"),
            KV(
                [
                    ("metric", gain.get("metric")),
                    ("base on test", fmt(gain.get("baseline"))),
                    ("adapted on test", fmt(gain.get("adapted"))),
                    ("gain", fdelta(gain.get("gain"))),
                    ("95% CI", f"[{fdelta(boot.get('ci_low'))}, {fdelta(boot.get('ci_high'))}]"),
                    (
                        "confirms the validation decision",
                        mark(_get(s, "decision", "gates", "test_confirms")),
                    ),
                ]
            ),
        ]
    else:
        out.append(Para("the base was not evaluated on the test split: no test gain", "warn"))
    out += [
        Sub("Final test metrics"),
        KV([("eval run", t.get("id")), ("examples", t.get("n"))]),
        Table(
            ["metric", "adapted on val", "adapted on test"],
            [[k, fmt(_metric(val_m, k)), fmt(m[k])] for k in _numeric_keys(m)],
        ),
    ]
    group, per = per_group(m)
    if per:
        _, val_per = per_group(val_m)
        entries = [v for v in per.values() if isinstance(v, dict)]
        ms = [x for x in ("f1", "accuracy", "precision", "recall") if any(x in v for v in entries)]
        out += [
            Sub("Per " + ("field" if group == "per_field" else "category") + " on test"),
            Table(
                [group.replace("per_", ""), "support", *(f"{x} val -> test" for x in ms)],
                [
                    [
                        n,
                        fmt(_get(per, n, "support")),
                        *(_pair(_get(val_per, n, x), _get(per, n, x)) for x in ms),
                    ]
                    for n in per
                ],
            ),
        ]
    guards = [g for g in _list(t, "guards") if isinstance(g, dict)]
    relative = [
        g
        for g in _list(s, "guards")
        if isinstance(g, dict) and g.get("min") is None and g.get("max") is None
    ]
    if guards:
        out += [
            Sub("Guards on test"),
            Table(
                ["guard", "support", "95% CI", "status", "detail"],
                [
                    [
                        g.get("metric"),
                        support_text(g),
                        ci_text(g),
                        Mark(
                            str(g.get("status")), {"pass": True, "fail": False}.get(g.get("status"))
                        ),
                        g.get("detail"),
                    ]
                    for g in guards
                ],
            ),
        ]
    if relative and not gain:
        out.append(
            Para(
                f"{len(relative)} relative guard(s) (max_drop / min_gain / max_rise) compare "
                "with the "
                "baseline, which is evaluated on validation only: they are checked there."
            )
        )
    return out
