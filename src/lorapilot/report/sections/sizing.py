"""The probe (time and memory, measured beside the memory model) and the budget (estimate,
actual and the 3/7/30-day rental plans)."""

from __future__ import annotations

from lorapilot.report.blocks import (
    KV,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import (
    fbytes,
    fmt,
    fpct,
    fraw,
    fsec,
    fusd,
    mark,
)
from lorapilot.report.sections.state import _get


def _probe(s: dict) -> list:
    p = s.get("probe")
    if not isinstance(p, dict):
        return [NotRun("`lorapilot probe PILOT` measures full training steps")]
    shown = p.get("variant") or "base"
    out: list = [Para(f"the probe of variant `{shown}` (its latest completed probe run)")]
    others = [v for v in s.get("probes") or [] if isinstance(v, dict) and v.get("variant") != shown]
    if others:
        out.append(
            Para(
                "other variants' probes (each variant whose step shape differs is probed on its "
                "own; the budget uses each one's): "
                + "; ".join(
                    f"`{v.get('variant')}` ({v.get('run_id')}, quantization "
                    f"{v.get('quantization')}): typical step {fsec(v.get('later_step_s'))}, "
                    f"peak {fbytes(v.get('peak_memory_bytes'))}"
                    for v in others
                )
            )
        )
    if p.get("estimate_only"):
        out.append(
            Para("estimate only: no step was run, memory figures are the model's estimates", "warn")
        )
    rows = []
    for m in p.get("measurements") or []:
        if not isinstance(m, dict):
            continue
        rows.append(
            [
                m.get("length"),
                fmt(m.get("seq_len")),
                fmt(m.get("micro_batch")),
                "on" if m.get("grad_checkpointing") else "off",
                fsec(m.get("first_step_s")),
                fsec(m.get("later_step_s")),
                fmt(m.get("tokens_per_s"), 1),
                fbytes(m.get("peak_memory_bytes")),
                fbytes(m.get("estimated_peak_memory_bytes")),
                fpct(m.get("estimate_error")),
                mark(m.get("ok")),
                m.get("error"),
            ]
        )
    if rows:
        out.append(
            Table(
                [
                    "length",
                    "seq_len",
                    "micro_batch",
                    "grad ckpt",
                    "first step",
                    "later step",
                    "tokens/s",
                    "peak memory",
                    "estimated",
                    "estimate error",
                    "ok",
                    "error",
                ],
                rows,
            )
        )
    else:
        out.append(NotRun("the probe recorded no measurement"))
    load = p.get("load") or {}
    env = p.get("environment") or {}
    out.append(
        KV(
            [
                ("model load", fsec(load.get("seconds"))),
                ("load peak RSS", fbytes(load.get("peak_rss_bytes"))),
                ("evaluation throughput", f"{fmt(p.get('eval_examples_per_s'), 2)} examples/s"),
                ("evaluation peak", fbytes(p.get("eval_peak_memory_bytes"))),
                (
                    "widest eval batch: measured / estimated",
                    f"{fbytes(_get(p, 'eval_estimate', 'measured_peak_memory_bytes'))} / "
                    f"{fbytes(_get(p, 'eval_estimate', 'estimated_peak_memory_bytes'))} "
                    f"({fpct(_get(p, 'eval_estimate', 'estimate_error'))})",
                ),
                ("checkpoint save", fsec(p.get("checkpoint_save_s"))),
                ("trainable parameters", p.get("trainable_params")),
                ("accelerator", env.get("accelerator")),
                (
                    "device memory free / total",
                    f"{fbytes(env.get('available_device_memory_bytes'))} / "
                    f"{fbytes(env.get('device_memory_bytes'))}"
                    if env.get("device_memory_bytes")
                    else None,
                ),
                (
                    "host memory free / total",
                    f"{fbytes(env.get('available_memory_bytes'))} / "
                    f"{fbytes(env.get('total_memory_bytes'))}"
                    if env.get("total_memory_bytes")
                    else None,
                ),
            ]
        )
    )
    search = p.get("batch_search")
    if isinstance(search, dict) and search:
        out += [
            Sub("Largest micro-batch that fits"),
            Table(
                ["grad checkpointing", "largest ok micro_batch", "stopped because"],
                [
                    [k, fmt(_get(v, "largest_ok_micro_batch")), _get(v, "stopped_because")]
                    for k, v in search.items()
                ],
            ),
        ]
    out.append(Para("estimate error = (estimate - measured) / measured: positive overestimates."))
    return out


def _budget(s: dict) -> list:
    b = s.get("budget")
    if not isinstance(b, dict) or not isinstance(b.get("estimate"), dict):
        return [NotRun("`lorapilot budget PILOT` needs a probe with measured steps")]
    e = b["estimate"]
    out: list = [
        Sub("Estimate of one training run"),
        KV(
            [
                ("optimizer steps", e.get("steps")),
                ("training", fsec(e.get("train_s"))),
                ("evaluation", f"{fsec(e.get('eval_s'))} ({fmt(e.get('n_evals'))} evaluations)"),
                (
                    "checkpoints",
                    f"{fsec(e.get('checkpoint_s'))} ({fmt(e.get('n_checkpoints'))} saves)",
                ),
                ("setup (model load)", fsec(e.get("setup_s"))),
                ("safety margin", fsec(e.get("margin_s"))),
                ("total", fsec(e.get("total_s"))),
                ("cost", f"{fusd(e.get('cost_usd'))} at {fusd(e.get('usd_per_hour'))} / h"),
                ("step time", e.get("step_s_definition")),
                ("probe run", b.get("probe_run")),
            ]
        ),
    ]
    limits = {k: v for k, v in (b.get("limits") or {}).items() if isinstance(v, dict)}
    if limits:
        out += [
            Sub("Limits"),
            Table(
                ["limit", "allowed", "value", "ok", "detail"],
                [
                    [
                        k,
                        fraw(v.get("limit")),
                        fmt(v.get("value"), 2),
                        mark(v.get("ok")),
                        v.get("detail"),
                    ]
                    for k, v in limits.items()
                ],
            ),
        ]
    out += _pre_rental(b.get("pre_rental"))
    out.append(Sub("Estimate vs actual"))
    errors = b.get("errors")
    if isinstance(errors, dict) and errors:
        fmt_of = {"steps": fmt}
        out.append(
            Table(
                ["component", "estimate", "actual", "error", "relative error"],
                [
                    [
                        k,
                        fmt_of.get(k, fsec)(v.get("estimate")),
                        fmt_of.get(k, fsec)(v.get("actual")),
                        fmt_of.get(k, fsec)(v.get("error")),
                        fpct(v.get("rel_error")),
                    ]
                    for k, v in errors.items()
                    if isinstance(v, dict)
                ],
            )
        )
        out += [Para(f"train run {b.get('train_run')}: {b.get('comparison_basis') or ''}")]
        if b.get("comparison_note"):
            out.append(Para(str(b["comparison_note"]), "warn"))
    else:
        out.append(NotRun("no completed train run to set the estimate against"))
    rental = {k: v for k, v in (b.get("rental") or {}).items() if isinstance(v, dict)}
    if rental:
        chosen = str(b.get("rental_days") or "")
        phases = ("initial_check", "experiments", "evaluation", "resumption_margin", "export")
        out += [
            Sub("Rental plans"),
            Table(
                [
                    "days",
                    "rental hours",
                    "hours per run",
                    "runs that fit",
                    "cost",
                    *(p.replace("_", " ") + " (h)" for p in phases),
                ],
                [
                    [
                        f"{k} (chosen)" if k == chosen else k,
                        fmt(v.get("rental_hours"), 1),
                        fmt(v.get("run_hours"), 2),
                        fmt(v.get("variants_fit")),
                        fusd(v.get("cost_usd")),
                        *(fmt(_get(v, "phases", p), 1) for p in phases),
                    ]
                    for k, v in rental.items()
                ],
            ),
        ]
    return out


def _pre_rental(pr) -> list:
    """`budget --gpu`'s estimate for the probe's GPU class beside what the probe measured."""
    if not isinstance(pr, dict):
        return []
    out: list = [Sub("Pre-rental estimate vs the probe")]
    if not pr.get("gpu"):
        return out + [
            Para(f"No pre-rental estimate to compare: {pr.get('why') or 'no GPU class'}.")
        ]
    return out + [
        Table(
            ["figure", "pre-rental estimate", "measured by the probe", "relative error"],
            [
                [
                    "step time (s)",
                    fmt(pr.get("estimated_step_s"), 3),
                    fmt(pr.get("measured_step_s"), 3),
                    fpct(pr.get("step_error")),
                ],
                [
                    "training peak (GiB)",
                    fmt(pr.get("estimated_peak_gib"), 2),
                    fmt(pr.get("measured_peak_gib"), 2),
                    "",
                ],
            ],
        ),
        Para(
            f"GPU class {pr['gpu']} ({pr.get('device')}); {pr.get('calibration') or ''}. The "
            "measurement replaces the estimate in every figure above."
        ),
    ]
