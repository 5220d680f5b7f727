"""The report's content: the pilot state turned into sections of blocks (`build_sections`).

Each builder reads only the state keys it needs; any of them may be missing or None (a pilot
that has not trained yet): its section then says "not run yet" and which verb fills it. A
builder that fails on odd data costs only its own section (`build_sections` says so in place).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from lorapilot.decision.rule import short_text
from lorapilot.evaluate.metrics import most_confused, per_group
from lorapilot.report import plots
from lorapilot.report.blocks import (
    KV,
    NOT_RUN,
    Banner,
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
    fbytes,
    fdelta,
    fmt,
    fpct,
    fraw,
    fsec,
    fusd,
    isnum,
    mark,
)

SECTIONS: tuple[tuple[str, str], ...] = (
    ("decision", "Decision"),
    ("hypothesis", "Hypothesis and pre-registered criteria"),
    ("data", "Data"),
    ("base-model", "Base model and revision"),
    ("adapter", "Adapter"),
    ("environment", "Environment"),
    ("probe", "Probe: time and memory"),
    ("budget", "Budget: estimate, actual and rental plans"),
    ("results", "Results: baseline vs adapted"),
    ("runs", "Runs"),
    ("training-curves", "Training curves"),
    ("verify", "Verification"),
    ("test", "Test split"),
    ("limitations", "Limitations"),
)
"""(HTML id, heading) of every section, in report order: a stable contract for tests."""

MAX_LISTED = 20

# --------------------------------------------------------------------------- reading the state


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _dict(d: dict, key: str) -> dict:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    return v if isinstance(v, list) else []


def _metric(metrics: Any, name: str | None) -> Any:
    """A metric by name; `per_category.billing.f1` style names walk into the dict."""
    if not isinstance(metrics, dict) or not name:
        return None
    if name in metrics:
        return metrics[name]
    return _get(metrics, *name.split("."))


def _numeric_keys(*metrics: Any) -> list[str]:
    keys: list[str] = []
    for m in metrics:
        if isinstance(m, dict):
            keys += [k for k, v in m.items() if isnum(v) and k not in keys]
    return keys


# --------------------------------------------------------------------------- sections


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
        out.append(Sub(f"Variants, selected on validation {sel.get('metric')}"))
        metric = _get(s, "success", "metric")
        out.append(
            Table(
                [
                    "variant",
                    "change",
                    "run",
                    "status",
                    str(sel.get("metric")),
                    f"{metric} delta",
                    "worst per-category delta",
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
        ad_hoc = _list(sel, "ad_hoc_runs")
        if ad_hoc:
            out.append(
                Para(
                    f"{len(ad_hoc)} ad-hoc train run(s) (`train --set`, not in the plan) are "
                    "listed under Runs but were not eligible for selection"
                )
            )
    rules = []
    if isinstance(d.get("success"), dict):
        rules.append(("success", d["success"]))
    rules += [("guard", g) for g in d.get("guards") or [] if isinstance(g, dict)]
    if rules:
        out.append(Sub("Pre-registered checks"))
        out.append(
            Table(
                ["check", "metric", "rule", "baseline", "adapted", "threshold", "status", "detail"],
                [
                    [
                        kind,
                        r.get("metric"),
                        r.get("rule"),
                        fmt(r.get("baseline")),
                        fmt(r.get("candidate")),
                        fmt(r.get("threshold")),
                        Mark(
                            str(r.get("status")), {"pass": True, "fail": False}.get(r.get("status"))
                        ),
                        r.get("detail"),
                    ]
                    for kind, r in rules
                ],
            )
        )
    b = d.get("bootstrap")
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
    return out


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


def _data(s: dict) -> list:
    d = s.get("data")
    if not isinstance(d, dict):
        return [NotRun("`lorapilot data PILOT` validates, versions and splits the data")]
    dups = d.get("duplicates") or {}
    splits = d.get("splits") or {}
    out: list = [
        KV(
            [
                ("data version", d.get("version")),
                ("source", d.get("source")),
                ("permission", d.get("permission")),
                ("examples", d.get("n_examples")),
                ("splits", ", ".join(f"{k} {fmt(v)}" for k, v in splits.items()) or None),
            ]
        )
    ]
    per = d.get("per_category") or {}
    if per:
        cols = list(splits) or list(dict.fromkeys(k for v in per.values() for k in v))
        out += [
            Sub("Examples per category"),
            Table(
                ["category", *cols],
                [[c, *(fmt((n or {}).get(sp, 0)) for sp in cols)] for c, n in per.items()],
            ),
        ]
    if isinstance(d.get("images"), dict):
        out += _images(d, s.get("contact_sheets") or [])
    out.append(Sub("Duplicates and leaks"))
    counts = dups.get("counts") or {}
    cross = dups.get("cross_split") or []
    dropped = dups.get("dropped_from_train") or []
    out.append(
        KV(
            [
                ("exact duplicate pairs", counts.get("exact")),
                ("near duplicate pairs", counts.get("near")),
                ("pairs within a split", counts.get("within_split")),
                ("leaks (pairs across splits)", mark(not cross, "none", str(len(cross)))),
                ("leakage policy", dups.get("leakage_policy")),
                ("dropped from train (leaks)", len(dropped)),
            ]
        )
    )
    if cross:
        out.append(
            Table(
                ["example", "duplicate of", "kind", "similarity"],
                [
                    [
                        f"{p.get('a_split')}:{p.get('a_id')}",
                        f"{p.get('b_split')}:{p.get('b_id')}",
                        p.get("kind"),
                        fmt(p.get("similarity")),
                    ]
                    for p in cross[:MAX_LISTED]
                ],
            )
        )
    skipped = d.get("skipped") or []
    out.append(
        KV(
            [
                ("invalid records skipped", len(skipped)),
                ("dropped by cleaning", len(d.get("dropped_by_cleaning") or [])),
                ("excluded: target too long", len(d.get("target_excluded") or [])),
            ]
        )
    )
    if skipped:
        out.append(
            Table(
                ["file", "line", "problem"],
                [
                    [x.get("file"), x.get("line"), x.get("problem")]
                    for x in skipped[:MAX_LISTED]
                    if isinstance(x, dict)
                ],
            )
        )
    mask = d.get("mask_audit")
    if isinstance(mask, dict):
        out += [
            Sub("Loss-mask audit"),
            KV(
                [
                    ("ok", mark(mask.get("ok"))),
                    ("loss on", mask.get("loss_on")),
                    ("examples checked", mask.get("n_examples")),
                    ("share of tokens in the loss", fmt(mask.get("loss_token_fraction"))),
                    ("examples with no loss token", len(mask.get("zero_loss_examples") or [])),
                    ("mismatched examples", len(mask.get("mismatched") or [])),
                ]
            ),
        ]
    lengths = d.get("lengths") or {}
    if lengths:
        keys = ("n", "p50", "p95", "max", "max_length", "n_truncated", "n_target_truncated")
        out += [
            Sub("Token lengths"),
            Table(
                ["split", *keys],
                [[sp, *(fmt((v or {}).get(k)) for k in keys)] for sp, v in lengths.items()],
            ),
            Image(
                partial(plots.length_histogram, d),
                "token lengths per split",
                "The data run records only p50, p95 and max per split, not the whole "
                "distribution: the bars show those three figures; the dotted line is max_length.",
            ),
        ]
    return out


def _images(d: dict, sheets: list[str]) -> list:
    """Image pilots: properties per category, the shortcut warnings, the transforms, and the
    contact sheets `inspect` drew."""
    per = (d.get("images") or {}).get("per_category") or {}

    def rng(v: Any) -> str:
        if not isinstance(v, dict):
            return "-"
        return (
            fmt(v.get("min"))
            if v.get("min") == v.get("max")
            else (f"{fmt(v.get('min'))}-{fmt(v.get('max'))}")
        )

    def counts(v: Any) -> str:
        return ", ".join(f"{k} {n}" for k, n in (v or {}).items()) if isinstance(v, dict) else "-"

    out: list = [
        Sub("Images per category (all splits)"),
        Table(
            ["category", "images", "width", "height", "modes", "formats", "median bytes"],
            [
                [
                    c,
                    fmt(v.get("n")),
                    rng(v.get("width")),
                    rng(v.get("height")),
                    counts(v.get("mode")),
                    counts(v.get("format")),
                    fmt((v.get("bytes") or {}).get("median")),
                ]
                for c, v in per.items()
                if isinstance(v, dict)
            ],
        ),  # fmt: skip
    ]
    shortcuts = [w for w in d.get("warnings") or [] if "differs from the others" in str(w)]
    out.append(
        Items(shortcuts) if shortcuts else Para("No category differs from the others in size, "
                                                "mode, format or file size.")
    )  # fmt: skip
    t = d.get("transforms")
    if isinstance(t, dict):
        out.append(
            KV([(k, ", ".join(map(str, v)) if isinstance(v, list) else v) for k, v in t.items()])
        )
    for path in sheets:
        name = path.rsplit("/", 1)[-1].removeprefix("contact-").removesuffix(".png")
        out.append(
            Image(
                partial(plots.png_file, path),
                f"contact sheet: {name}",
                f"{name}: sampled originals (left) beside what the model sees (right), as "
                "`lorapilot inspect` drew them",
            )
        )
    return out


def _record(s: dict) -> dict:
    rec = s.get("chosen_record")
    return rec if isinstance(rec, dict) else {}


def _base_model(s: dict) -> list:
    model = _dict(s, "model")
    base = _get(_record(s), "result", "base")
    spec_rows = [
        ("requested base", model.get("base")),
        ("requested revision", model.get("revision")),
        ("dtype", model.get("dtype")),
        ("trust_remote_code", model.get("trust_remote_code")),
    ]
    if not isinstance(base, dict):
        return [
            KV(spec_rows),
            NotRun("the resolved base (path, revision, sha256) is recorded by a train run"),
        ]
    return [
        KV(
            [
                ("id", base.get("id")),
                ("path", base.get("path")),
                ("revision", base.get("revision")),
                ("weights sha256", base.get("sha256")),
                ("source", base.get("source")),
                *spec_rows[2:],
                *_quantization_rows(_get(_record(s), "result", "base_identity")),
            ]
        )
    ]


def _quantization_rows(identity: Any) -> list[tuple[str, Any]]:
    """The exact base an adapter on a quantized base is bound to (verify checks all of it)."""
    q = identity.get("quantization") if isinstance(identity, dict) else None
    if not isinstance(q, dict):
        return [("quantization", "none (the base in its stored dtype)")]
    what = f"{q.get('bits')}-bit"
    if q.get("bits") == 4:
        what += (
            f" {q.get('type')}, double quantization {q.get('double_quant')}, compute "
            f"{q.get('compute_dtype')}, block {q.get('block_size')}"
        )
    return [
        ("quantization", what),
        ("bitsandbytes", identity.get("bitsandbytes")),
        ("adapter bound to", "these weights quantized this way: a reload must match all of it"),
    ]


def _adapter(s: dict) -> list:
    spec = _dict(s, "adapter")
    out: list = [
        Sub("Configuration"),
        KV(
            [
                (k, fraw(spec.get(k)))
                for k in ("method", "r", "alpha", "dropout", "target_modules", "modules_to_save")
                if k in spec
            ]
            or [("configuration", None)]
        ),
    ]
    res = _record(s).get("result") or {}
    info = res.get("adapter")
    if not isinstance(info, dict):
        return [
            *out,
            NotRun("trainable parameters and the update audit are recorded by a train run"),
        ]
    frac = info.get("trainable_fraction")
    if not isnum(frac) and isnum(info.get("trainable_params")) and info.get("total_params"):
        frac = info["trainable_params"] / info["total_params"]
    out += [
        Sub("Trainable parameters"),
        KV(
            [
                ("trainable parameters", info.get("trainable_params")),
                ("total parameters", info.get("total_params")),
                ("trainable share", f"{100 * frac:.3f}%" if isnum(frac) else None),
                ("adapted modules", len(info.get("target_modules") or [])),
                ("module types", info.get("target_module_types")),
                ("modules_to_save", info.get("modules_to_save") or None),
            ]
        ),
    ]
    audit = res.get("update_audit")
    out.append(Sub("Update audit"))
    if isinstance(audit, dict):
        out.append(
            KV(
                [
                    ("ok", mark(audit.get("ok"))),
                    ("optimizer steps", audit.get("steps")),
                    ("trainable tensors", audit.get("n_trainable")),
                    ("frozen tensors", audit.get("n_frozen")),
                    ("frozen tensors changed", len(audit.get("changed_frozen") or [])),
                    ("trainable tensors unchanged", len(audit.get("unchanged_trainable") or [])),
                    ("problems", audit.get("problems") or None),
                ]
            )
        )
    else:
        out.append(NotRun("no update audit in the chosen run's record"))
    return out


def _environment(s: dict) -> list:
    env = _record(s).get("environment")
    if not isinstance(env, dict) or not env:
        return [NotRun("the environment is recorded with the chosen train run")]
    libs = env.get("libraries") or {}
    devices = [
        f"{x.get('name')} ({fbytes(x.get('memory_bytes'))})" if isinstance(x, dict) else str(x)
        for x in env.get("devices") or []
    ]
    return [
        KV(
            [
                ("lorapilot", env.get("lorapilot")),
                ("git commit", env.get("git_commit")),
                ("python", env.get("python")),
                ("platform", env.get("platform")),
                *(
                    (lib, libs.get(lib) or env.get(lib))
                    for lib in ("torch", "transformers", "peft", "accelerate")
                ),
                ("accelerator", env.get("accelerator")),
                ("cuda", env.get("cuda")),
                ("hip", env.get("hip")),
                ("devices", devices or "none (CPU)"),
                ("cpu", env.get("cpu")),
                ("cpu count", env.get("cpu_count")),
                ("ram", fbytes(env.get("ram_bytes"))),
            ]
        )
    ]


def _probe(s: dict) -> list:
    p = s.get("probe")
    if not isinstance(p, dict):
        return [NotRun("`lorapilot probe PILOT` measures full training steps")]
    out: list = []
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
                        fraw(v.get("value")),
                        mark(v.get("ok")),
                        v.get("detail"),
                    ]
                    for k, v in limits.items()
                ],
            ),
        ]
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
    group, bper = per_group(bm)
    group_c, cper = per_group(cm)
    group = group_c if cm else group
    names = list(dict.fromkeys([*bper, *cper]))
    if names:
        entries = [v for v in [*bper.values(), *cper.values()] if isinstance(v, dict)]
        ms = [m for m in ("accuracy", "precision", "recall", "f1") if any(m in v for v in entries)]
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
            ],
            rows,
        ),
    ]


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
                ["guard", "status", "detail"],
                [
                    [
                        g.get("metric"),
                        Mark(str(g.get("status")), g.get("status") == "pass"),
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


def _limitations(s: dict) -> list:
    lims = [str(x) for x in _list(s, "limitations")]
    return [Items(lims)] if lims else [Para("No limitation was recorded.")]


_BUILDERS = {
    "decision": _decision,
    "hypothesis": _hypothesis,
    "data": _data,
    "base-model": _base_model,
    "adapter": _adapter,
    "environment": _environment,
    "probe": _probe,
    "budget": _budget,
    "results": _results,
    "runs": _runs,
    "training-curves": _curves,
    "verify": _verify,
    "test": _test,
    "limitations": _limitations,
}


def build_sections(state: dict | None) -> list[tuple[str, str, list]]:
    """[(id, heading, blocks)] in report order; a section that fails says why instead."""
    state = state if isinstance(state, dict) else {}
    out = []
    for sid, title in SECTIONS:
        try:
            blocks = _BUILDERS[sid](state)
        except Exception as e:  # odd data in one section must not cost the whole report
            blocks = [Para(f"this section could not be rendered: {type(e).__name__}: {e}", "warn")]
        out.append((sid, title, blocks))
    return out


def meta_rows(state: dict) -> list[tuple[str, Any]]:
    """The header line under the title: (label, value) pairs, empty values left out by the
    renderers."""
    return [
        ("pilot", state.get("pilot")),
        ("task", _get(state, "task", "kind")),
        ("generated", state.get("generated_at")),
    ]
