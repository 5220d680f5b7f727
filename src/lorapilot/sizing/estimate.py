"""What the `budget` verb reports, gathered from the run records: a run's time and cost from
the latest probe, the limits checked, 3/7/30-day rental plans, and the estimate set against a
real run. `train`, `report` and `run` call `budget_of` too (never the budget step).

Inputs: the latest completed probe run that measured steps (an `--estimate-only` probe has
no times and is skipped), the data size (the latest completed data run's `splits` when it
was made with the same data section of the spec, else the data is prepared here), and the
spec. The arithmetic is `budget.py`'s; this module only gathers its inputs:

- later_step_s: the probe's median step time at the typical length, the spec's
  micro_batch and grad_checkpointing, times grad_accum. A probe step is ONE micro-batch
  and one optimizer update; a training step is grad_accum micro-batches and one update,
  so this slightly over-counts the (small, for LoRA) update.
- peak_memory_bytes: the largest `peak_total_bytes` among the probe's measurements at the
  spec's micro_batch and grad_checkpointing (both lengths). That is the whole figure a
  memory limit is about (CPU: the process's peak RSS, weights included; CUDA: max
  reserved), not the RSS increase the probe compares with its memory model.
- estimate vs actual: for the latest completed train run, the estimate is redone for the
  number of steps that run took and its own train settings (eval_every, save_every,
  micro_batch, grad_accum), without the verify evaluation (a separate run), and set beside
  the run's steps.jsonl step times (train_s), its final evaluation (eval_s) and its record's
  duration (total_s, the margin included in the estimate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot.decision.plan import step_shape, variant_pilots
from lorapilot.errors import CheckFailed, LorapilotError, UsageError
from lorapilot.fsutil import read_jsonl
from lorapilot.records import registry
from lorapilot.sizing.budget import (
    RENTAL_DAYS,
    ProbeFigures,
    check_limits,
    checkpoint_interval,
    compare_estimate,
    estimate_run,
    exceeded,
    plan_fits,
    plans,
    smoke_steps_of,
    steps_of,
)
from lorapilot.spec import Pilot, variant_label

COMPARISON_BASIS = (
    "the estimate redone for the train run's own number of steps and train settings, without "
    "the verify evaluation (a separate run); actual train_s = the sum of its steps.jsonl "
    "step_time_s, eval_s = its final evaluation, total_s = its record's duration_s"
)


def _measured(rec: registry.RunRecord) -> bool:
    return (
        rec.status == "completed"
        and not rec.result.get("estimate_only")
        and any(m.get("ok") and m.get("measured") for m in rec.result.get("measurements", []))
    )


def latest_probe(pilot_dir: Path) -> registry.RunRecord | None:
    """The newest completed probe run that measured steps (not --estimate-only)."""
    for rec in reversed(registry.list_runs(pilot_dir, "probe")):
        if _measured(rec):
            return rec
    return None


def probe_for(pilot: Pilot, strict: bool = False) -> registry.RunRecord | None:
    """The newest measured probe of this pilot's step shape (`plan.step_shape`: variants that
    only change the learning rate, duration or seed share one). Not strict: else the newest
    measured probe of any shape (a probe from before the spec's last change)."""
    shape = step_shape(pilot.spec.model_dump(mode="json"))
    for rec in reversed(registry.list_runs(pilot.dir, "probe")):
        if _measured(rec) and step_shape(rec.config or {}) == shape:
            return rec
    return None if strict else latest_probe(pilot.dir)


def _at_settings(
    measurements: list[dict], micro_batch: int, grad_checkpointing: bool
) -> list[dict]:
    return [
        m
        for m in measurements
        if m.get("ok")
        and m.get("measured")
        and m["micro_batch"] == micro_batch
        and m["grad_checkpointing"] == grad_checkpointing
    ]


def probe_figures(probe: dict, train_cfg: dict, run_id: str) -> ProbeFigures:
    """ProbeFigures for `train_cfg` (a spec's train section as a dict) from a probe result."""
    mb, ckpt = train_cfg["micro_batch"], bool(train_cfg["grad_checkpointing"])
    rows = _at_settings(probe.get("measurements", []), mb, ckpt)
    typical = [m for m in rows if m["length"] == "typical" and not m.get("search")]
    if not typical:
        raise UsageError(
            f"probe run {run_id} did not measure micro_batch={mb}, grad_checkpointing={ckpt} at "
            "the "
            "typical length (the spec changed since?); run `lorapilot probe PILOT` again"
        )
    if not probe.get("eval_examples_per_s"):
        raise UsageError(
            f"probe run {run_id} has no evaluation throughput; run `lorapilot probe PILOT` again"
        )
    peaks = [m.get("peak_total_bytes", m.get("peak_memory_bytes")) for m in rows]
    peaks = [p for p in peaks if p is not None]
    return ProbeFigures(
        later_step_s=typical[-1]["later_step_s"] * train_cfg["grad_accum"],
        eval_examples_per_s=probe["eval_examples_per_s"],
        checkpoint_save_s=probe.get("checkpoint_save_s") or 0.0,
        model_load_s=(probe.get("load") or {}).get("seconds") or 0.0,
        peak_memory_bytes=max(peaks) if peaks else None,
        eval_peak_memory_bytes=probe.get("eval_peak_memory_bytes"),
    )


def data_sizes(pilot: Pilot) -> dict:
    """{train, val, test, source}: the latest completed data run's splits when its data
    section matches the spec's, else prepared now (tokenizer only, no weights)."""
    data_section = pilot.spec.model_dump(mode="json")["data"]
    rec = registry.latest_run(pilot.dir, "data")
    if rec is not None and rec.result.get("splits") and rec.config.get("data") == data_section:
        return {**rec.result["splits"], "source": rec.id}
    from lorapilot.modality import modality_of

    prepared = modality_of(pilot).prepare(enforce_leakage=False)
    return {**{s: len(v) for s, v in prepared.splits.items()}, "source": "prepared"}


def _estimate(
    figures: ProbeFigures, train: dict, limits, sizes: dict, max_steps: int | None
) -> dict:
    return estimate_run(
        figures,
        n_train=sizes.get("train", 0),
        n_val=sizes.get("val", 0),
        epochs=train["epochs"],
        max_steps=max_steps,
        micro_batch=train["micro_batch"],
        grad_accum=train["grad_accum"],
        world_size=1,
        eval_every=train.get("eval_every"),
        save_every=train.get("save_every"),
        margin=limits.margin,
        usd_per_hour=limits.usd_per_hour,
    )


def actual_of(rec: registry.RunRecord, pilot_dir: Path) -> dict:
    """What a completed train run took: {train_s, eval_s, total_s, steps}."""
    train = rec.result.get("train") or {}
    rows = read_jsonl(registry.runs_dir(pilot_dir) / rec.id / "steps.jsonl")
    times = [r["step_time_s"] for r in rows if isinstance(r.get("step_time_s"), int | float)]
    return {
        "train_s": sum(times) if times else train.get("train_wall_s"),
        "eval_s": rec.result.get("eval_seconds"),
        "total_s": rec.duration_s,
        "steps": train.get("steps") or len(rows) or None,
    }


def compare_with_run(
    rec: registry.RunRecord, pilot: Pilot, probe: registry.RunRecord, sizes: dict
) -> dict:
    """{actual, errors, estimate (the comparison one), basis} for a completed train run."""
    actual = actual_of(rec, pilot.dir)
    train = {**pilot.spec.train.model_dump(mode="json"), **(rec.config.get("train") or {})}
    note = None
    try:
        figures = probe_figures(probe.result, train, probe.id)
    except UsageError:  # the run used settings the probe did not measure: the spec's figures
        figures = probe_figures(probe.result, pilot.spec.train.model_dump(mode="json"), probe.id)
        note = (
            "the train run's micro_batch/grad_checkpointing were not probed; "
            "the spec's step time was used"
        )
    steps = actual["steps"] or 1
    est = _estimate(figures, train, pilot.spec.limits, sizes, steps)
    # The train run evaluates at every eval_every point and at the end; verify is another run.
    one_eval = est["eval_s"] / est["n_evals"]
    est["n_evals"] -= 1
    est["eval_s"] -= one_eval
    parts = est["train_s"] + est["eval_s"] + est["checkpoint_s"] + est["setup_s"]
    est["margin_s"] = pilot.spec.limits.margin * parts
    est["total_s"] = parts + est["margin_s"]
    est["cost_usd"] = est["total_s"] / 3600 * est["usd_per_hour"]
    return {
        "actual": actual,
        "errors": compare_estimate(est, actual),
        "comparison_estimate": est,
        "comparison_basis": COMPARISON_BASIS,
        "comparison_note": note,
        "train_run": rec.id,
    }


def budget_of(pilot: Pilot, only=None, pre_rental: bool = True) -> dict[str, Any]:
    """Time/cost estimate of one training run, limits, 3/7/30-day plans, estimate vs actual;
    `pre_rental=False` leaves out `budget --gpu`'s estimate beside the probe (it tokenizes the
    data again: not worth it where only the limits are asked, as before training)."""
    spec = pilot.spec
    probe = probe_for(pilot)
    if probe is None:
        raise UsageError(
            f"{pilot.dir}: no completed probe run with measured steps yet; run "
            "`lorapilot probe PILOT` first (an --estimate-only probe measures no times)"
        )
    train = spec.train.model_dump(mode="json")
    figures = probe_figures(probe.result, train, probe.id)
    sizes = data_sizes(pilot)
    estimate = _estimate(figures, train, spec.limits, sizes, spec.train.max_steps)
    estimate["step_s_definition"] = (
        "the probe's median time of one micro-batch step at the typical length, times grad_accum"
    )
    out: dict[str, Any] = {
        "estimate": estimate,
        "window": spec.limits.window,
        "limits": check_limits(estimate, figures.pilot_peak_memory_bytes, spec.limits),
        "pilot": pilot_time(pilot, figures, estimate, sizes, probe),
        "rental": plans(estimate),
        "rental_days": spec.limits.rental_days,
        "probe_run": probe.id,
        "figures": {
            "later_step_s": figures.later_step_s,
            "eval_examples_per_s": figures.eval_examples_per_s,
            "checkpoint_save_s": figures.checkpoint_save_s,
            "model_load_s": figures.model_load_s,
            "peak_memory_bytes": figures.peak_memory_bytes,
            "peak_memory_source": "the largest peak_total_bytes of the probe at the spec's "
            "settings",
            "eval_peak_memory_bytes": figures.eval_peak_memory_bytes,
            "eval_peak_memory_source": "the probe's evaluations with the pilot's protocol: up "
            "to 32 validation examples, and one batch of the longest validation prompts",
            "limit_checked_against": "the larger of the training and evaluation peaks",
            "accelerator": (probe.result.get("environment") or {}).get("accelerator"),
        },
        "data": sizes,
        "actual": None,
        "errors": None,
    }
    out["pre_rental"] = _pre_rental(pilot, probe, figures) if pre_rental else None
    rec = registry.latest_run(pilot.dir, "train")
    if rec is not None:
        out.update(compare_with_run(rec, pilot, probe, sizes))
    out.update(plan_budget(pilot, out["pilot"], sizes, only))
    return out


def _pre_rental(pilot: Pilot, probe: registry.RunRecord, figures: ProbeFigures) -> dict | None:
    """`budget --gpu`'s estimate for the class the probe ran on, beside the probe's figures
    (None for an image pilot, which `budget --gpu` does not plan)."""
    if pilot.spec.task.modality == "image":
        return None
    from lorapilot.sizing.gpus import gpu_classes
    from lorapilot.sizing.rental import beside_probe

    return beside_probe(
        pilot, probe.environment or {}, figures.later_step_s, figures.peak_memory_bytes,
        gpu_classes(),
    )  # fmt: skip


def plan_budget(pilot: Pilot, pilot_phases: dict, sizes: dict, only=None) -> dict:
    """The whole plan: every variant's train run from the probe of its step shape (times
    `selection.seeds`: `run_s` is one run, `total_s` all its seeds), the plan's total
    (baseline, smoke, the probes, every variant, the final test), whether it fits 3/7/30
    days and the spec's limits. -> {variants: [...], plan: {...}}."""
    spec = pilot.spec
    rows, probes = [], {}
    for vp in variant_pilots(pilot, only):
        probe = probe_for(vp, strict=vp.variant != "base")
        row: dict[str, Any] = {
            "name": vp.variant,
            "label": "base" if vp.variant == "base" else variant_label(vp.diff),
            "diff": vp.diff,
            "step_shape": step_shape(vp.spec.model_dump(mode="json")),
            "probe_run": probe and probe.id,
            "estimate": None,
            "total_s": None,
            "cost_usd": None,
            "peak_memory_bytes": None,
        }
        if probe is None:
            row["note"] = (
                f"not probed: run `lorapilot probe PILOT --variant {vp.variant}` (its step shape "
                "differs from every probed one)"
            )
            rows.append(row)
            continue
        probes[probe.id] = probe.duration_s or 0.0
        train = vp.spec.train.model_dump(mode="json")
        try:
            figures = probe_figures(probe.result, train, probe.id)
        except UsageError as e:
            row["note"] = str(e)
            rows.append(row)
            continue
        est = _estimate(figures, train, vp.spec.limits, sizes, vp.spec.train.max_steps)
        limits = check_limits(est, figures.pilot_peak_memory_bytes, vp.spec.limits)
        seeds = spec.selection.seeds  # the limits hold per run; the plan holds every seed
        row.update(
            estimate=est,
            steps=est["steps"],
            seeds=seeds,
            run_s=est["total_s"],
            total_s=est["total_s"] * seeds,
            cost_usd=est["cost_usd"] * seeds,
            peak_memory_bytes=figures.pilot_peak_memory_bytes,
            limits=limits,
            over_limits=sorted(exceeded(limits)),
        )
        rows.append(row)
    fixed = (
        pilot_phases["baseline_s"] + pilot_phases["smoke_s"] + pilot_phases["test_s"]
        + sum(probes.values())
    )  # fmt: skip
    totals = [r["total_s"] for r in rows]
    fits = {str(d): plan_fits(fixed, totals, d) for d in RENTAL_DAYS}
    chosen = fits[str(spec.limits.rental_days)]
    over = [r["name"] for r in rows if r.get("over_limits")]
    beyond = [r["name"] for r in rows[chosen["variants_fit"] :]]
    total = None if None in totals else fixed + sum(totals)
    return {
        "variants": rows,
        "plan": {
            "variants": [r["name"] for r in rows],
            "fixed_s": fixed,
            "total_s": total,
            "cost_usd": None if total is None else total / 3600 * spec.limits.usd_per_hour,
            "fits": fits,
            "rental_days": spec.limits.rental_days,
            "variants_fit": chosen["variants_fit"],
            "over_limits": over,
            "not_in_rental": beyond,
            "ok": not over and not beyond,
        },
    }


def plan_refusal(plan: dict) -> str | None:
    """Why a plan must not start (the variants over a limit or past the rental), or None."""
    parts = []
    over = [r for r in plan["variants"] if r.get("over_limits")]
    for r in over:
        detail = ", ".join(f"{k} {r['limits'][k]['detail']}" for k in r["over_limits"])
        parts.append(f"variant {r['name']} exceeds the spec's limits ({detail})")
    p = plan["plan"]
    if p["not_in_rental"]:
        parts.append(
            f"variants {', '.join(p['not_in_rental'])} do not fit in the {p['rental_days']}-day "
            "rental after the phases before them"
        )
    return "; ".join(parts) or None


def pilot_time(pilot: Pilot, figures, estimate: dict, sizes: dict, probe) -> dict:
    """The whole pilot, phase by phase, not only one train run: the baseline and the final
    test at the probe's evaluation throughput (each with a model load), the smoke's most
    steps (`SmokeSpec.steps_for`) at the probe's step time, the probe as it took, the train
    run's estimate (its final evaluation, verify's and its margin included), the final test
    (adapter and base on the test split). Seconds; no margin on the others."""
    load = figures.model_load_s
    phases = {
        "baseline_s": load + sizes.get("val", 0) / figures.eval_examples_per_s,
        "smoke_s": load + smoke_steps_of(pilot.spec, sizes) * figures.later_step_s,
        "probe_s": probe.duration_s or 0.0,
        "train_s": estimate["total_s"],
        # the final test evaluates the adapter and the base on the same rows
        "test_s": load + 2 * sizes.get("test", 0) / figures.eval_examples_per_s,
    }
    total = sum(phases.values())
    return {**phases, "total_s": total, "cost_usd": total / 3600 * estimate["usd_per_hour"]}


def checkpoint_policy(pilot: Pilot, n_train: int, world_size: int = 1) -> dict:
    """How often a train run saves: the spec's `train.save_every`, else the default interval
    (`budget.checkpoint_interval`) from the probe's step and checkpoint times, recorded."""
    t = pilot.spec.train
    if t.save_every:
        return {"save_every": t.save_every, "chosen_by": "spec"}
    steps = steps_of(n_train, t.epochs, t.max_steps, t.micro_batch, t.grad_accum, world_size)
    probe = probe_for(pilot)
    step_s = save_s = None
    if probe is not None:
        try:
            figures = probe_figures(probe.result, t.model_dump(mode="json"), probe.id)
            step_s, save_s = figures.later_step_s, figures.checkpoint_save_s
        except UsageError:
            probe = None
    return {
        **checkpoint_interval(steps, step_s, save_s),
        "chosen_by": "default",
        "probe_run": probe and probe.id,
    }


def refuse_over_limits(pilot: Pilot, log=print) -> None:
    """Before training: refuse (exit 1) when the latest probe's measured memory or the budget
    estimate exceeds the spec's limits. Without a probe there is nothing measured to check."""
    try:
        budget = budget_of(pilot, pre_rental=False)
    except LorapilotError as e:
        log(f"limits not checked before training: {e}")
        return
    limits = budget.get("limits") or {}
    over = exceeded(limits)
    if over:
        detail = "; ".join(
            f"{k}: {v.get('detail') or (str(v.get('value')) + ' > ' + str(v.get('limit')))}"
            for k, v in over.items()
        )
        raise CheckFailed(
            f"the measured probe / budget estimate exceeds the spec's limits ({detail}); "
            "raise limits in pilot.yaml or shrink the run",
            {"limits": limits},
        )


def budget_or_none(pilot: Pilot) -> dict | None:
    """budget_of, or None when there is no probe yet (the report says so)."""
    try:
        return budget_of(pilot)
    except LorapilotError:
        return None
