"""Time and cost arithmetic (pure): a run's estimate, limits, rental plans, estimate vs actual.

Every figure comes from the probe's measurements on the real machine (`ProbeFigures`); this
module only multiplies them out, so the arithmetic can be checked by hand and the estimate
set beside what a run actually took (`compare_estimate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lorapilot.sizing.memory import GIB
from lorapilot.spec import LimitsSpec, PilotSpec

RENTAL_DAYS = (3, 7, 30)
HOURS_PER_DAY = 24.0
HUMAN_HOURS_PER_DAY = 8.0
RESUMPTION_SHARE = 0.15
EXPORT_HOURS = 0.5
TIME_PARTS = ("train_s", "eval_s", "checkpoint_s", "setup_s")


@dataclass(frozen=True)
class ProbeFigures:
    """What the probe measured, the inputs of every time estimate."""

    later_step_s: float
    """Median seconds per optimizer step at the typical length, after the first steps
    (which pay for compilation and allocator warm-up)."""
    eval_examples_per_s: float
    """Evaluation throughput with the pilot's evaluation protocol."""
    checkpoint_save_s: float
    """Seconds to write one checkpoint (weights, optimizer state, RNG)."""
    model_load_s: float
    """Seconds to load the base model and attach the adapter."""
    peak_memory_bytes: int | None = None
    """Peak device memory of a training step; None where it could not be measured."""
    eval_peak_memory_bytes: int | None = None
    """Peak memory of the probe's evaluation (the pilot's protocol and eval batch size)."""

    @property
    def pilot_peak_memory_bytes(self) -> int | None:
        """What a memory limit is checked against: the larger of training and evaluation."""
        peaks = [p for p in (self.peak_memory_bytes, self.eval_peak_memory_bytes) if p]
        return max(peaks) if peaks else None

    def __post_init__(self) -> None:
        if not self.later_step_s > 0:
            raise ValueError(f"later_step_s must be positive, got {self.later_step_s!r}")
        if not self.eval_examples_per_s > 0:
            raise ValueError(
                f"eval_examples_per_s must be positive, got {self.eval_examples_per_s!r}"
            )
        for name in ("checkpoint_save_s", "model_load_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")


def estimate_run(
    figures: ProbeFigures,
    *,
    n_train: int,
    n_val: int,
    epochs: float,
    max_steps: int | None,
    micro_batch: int,
    grad_accum: int,
    world_size: int = 1,
    eval_every: int | None,
    save_every: int | None,
    margin: float,
    usd_per_hour: float,
) -> dict:
    """Seconds and dollars of one training run, by part.

    steps = max_steps, else ceil(epochs x n_train / (micro_batch x grad_accum x
    world_size)) (at least 1), as the training loop counts them. Evaluations: one every
    `eval_every` steps, plus the final evaluation, plus the verify re-evaluation in a fresh
    process, each over the n_val validation examples at the probe's throughput (one
    device: evaluation is not sharded). Checkpoints: one every `save_every` steps plus the
    final adapter. setup = one model load. margin_s = margin x the sum of the parts, for
    what the probe cannot see (slower long batches, a noisy neighbour).

    -> {steps, train_s, eval_s, checkpoint_s, setup_s, margin_s, total_s, cost_usd,
    n_evals, n_checkpoints, usd_per_hour}.
    """
    if n_train < 0 or n_val < 0:
        raise ValueError("n_train and n_val must be >= 0")
    if min(micro_batch, grad_accum, world_size) <= 0:
        raise ValueError("micro_batch, grad_accum and world_size must be positive")
    if margin < 0 or usd_per_hour < 0:
        raise ValueError("margin and usd_per_hour must be >= 0")
    steps = steps_of(n_train, epochs, max_steps, micro_batch, grad_accum, world_size)
    if save_every is None:
        save_every = checkpoint_interval(steps, figures.later_step_s, figures.checkpoint_save_s)[
            "save_every"
        ]
    n_evals = (steps // eval_every if eval_every else 0) + 2  # + final + verify
    n_checkpoints = (steps // save_every if save_every else 0) + 1  # + the final adapter
    out: dict = {
        "steps": steps,
        "train_s": steps * figures.later_step_s,
        "eval_s": n_evals * n_val / figures.eval_examples_per_s,
        "checkpoint_s": n_checkpoints * figures.checkpoint_save_s,
        "setup_s": figures.model_load_s,
    }
    out["margin_s"] = margin * sum(out[k] for k in TIME_PARTS)
    out["total_s"] = sum(out[k] for k in TIME_PARTS) + out["margin_s"]
    out["cost_usd"] = out["total_s"] / 3600 * usd_per_hour
    out["usd_per_hour"] = usd_per_hour
    out["n_evals"] = n_evals
    out["n_checkpoints"] = n_checkpoints
    return out


def steps_of(
    n_train: int,
    epochs: float,
    max_steps: int | None,
    micro_batch: int,
    grad_accum: int,
    world_size: int = 1,
) -> int:
    """Optimizer steps of a run, as the training loop counts them."""
    if max_steps:
        return int(max_steps)
    return max(1, math.ceil(epochs * n_train / (micro_batch * grad_accum * world_size)))


CHECKPOINT_TIME_SHARE = 0.05  # at most this share of the run spent saving checkpoints...
CHECKPOINT_LOSS_SHARE = 0.10  # ...unless that would lose more than this share of the steps


def checkpoint_interval(steps: int, step_s: float | None, save_s: float | None) -> dict:
    """The default `save_every` when the spec sets none: a killed run must not lose more than
    10% of its steps, and (within that) saving should take at most 5% of the run's time.

    every_for_time = ceil(save_s / (0.05 x step_s)) keeps saving under 5%; every_for_loss =
    max(1, floor(0.1 x steps)) bounds the loss; save_every = the smaller (the loss bound wins
    when the two disagree). Unmeasured times (no probe): the loss bound alone.
    -> {save_every, steps, save_share (of the run's step time, None unmeasured),
    max_lost_share, basis}.
    """
    for_loss = max(1, math.floor(CHECKPOINT_LOSS_SHARE * steps))
    measured = bool(step_s and step_s > 0 and save_s is not None and save_s >= 0)
    every = for_loss
    if measured:
        for_time = max(1, math.ceil(save_s / (CHECKPOINT_TIME_SHARE * step_s)))
        every = min(for_loss, for_time)
    return {
        "save_every": every,
        "steps": steps,
        "save_share": save_s / (every * step_s) if measured else None,
        "max_lost_share": min(1.0, every / steps) if steps else None,
        "basis": "probe" if measured else "no probe: the 10% loss bound alone",
    }


def plan_fits(
    fixed_s: float, variant_s: list[float | None], days: int, setup_hours: float = 1.0
) -> dict:
    """Does the whole plan fit a rental of `days`: the fixed phases (baseline, smoke, probes,
    final test), then the variants in order, inside what is left after the setup, the 15%
    resumption margin and the export. -> {days, available_hours, plan_hours, fits,
    variants_fit (how many variants, in order, fit)}; an unestimated variant fits nowhere."""
    rental_h = days * HOURS_PER_DAY
    available = rental_h - setup_hours - RESUMPTION_SHARE * rental_h - EXPORT_HOURS
    used = fixed_s / 3600
    n_fit = 0
    for s in variant_s:
        if s is None or used + s / 3600 > available:
            break
        used += s / 3600
        n_fit += 1
    total = None if any(s is None for s in variant_s) else (fixed_s + sum(variant_s)) / 3600
    return {
        "days": days,
        "available_hours": available,
        "plan_hours": total,
        "fits": total is not None and total <= available,
        "variants_fit": n_fit,
    }


def _limit(limit: float, value: float | None, what: str) -> dict:
    if value is None:  # a limit that cannot be checked must not pass
        return {"limit": limit, "value": None, "ok": False, "detail": f"no {what} to check"}
    ok = value <= limit
    return {
        "limit": limit,
        "value": value,
        "ok": ok,
        "detail": f"{value:.3g} {'<=' if ok else '>'} {limit:g}",
    }


def check_limits(estimate: dict, peak_memory_bytes: int | None, limits: LimitsSpec) -> dict:
    """Each limit the spec sets -> {limit, value, ok, detail}, and "ok" for all of them.

    memory_gb is checked against the measured peak in GiB (2^30 bytes, the unit GPU
    memory is sold in); an unmeasured peak fails the limit rather than passing it.
    time_hours against the estimate's total_s, cost_cap_usd against its cost_usd. With no
    limit set, "ok" is True.
    """
    out: dict = {}
    if limits.memory_gb is not None:
        value = peak_memory_bytes / GIB if peak_memory_bytes is not None else None
        out["memory_gb"] = _limit(limits.memory_gb, value, "measured peak memory")
    if limits.time_hours is not None:
        out["time_hours"] = _limit(limits.time_hours, estimate["total_s"] / 3600, "time estimate")
    if limits.cost_cap_usd is not None:
        out["cost_cap_usd"] = _limit(limits.cost_cap_usd, estimate["cost_usd"], "cost estimate")
    out["ok"] = all(entry["ok"] for entry in out.values())
    return out


def exceeded(limits: dict) -> dict:
    """The entries of check_limits' result that are over their limit ({} when none is)."""
    return {k: v for k, v in limits.items() if isinstance(v, dict) and not v.get("ok", True)}


def rental_plan(estimate: dict, days: int, *, setup_hours: float = 1.0) -> dict:
    """How a rental of `days` splits into phases, and how many runs fit in it.

    Assumptions: the machine is rented 24 h a day; a person works ~8 h a day, so runs
    back to back are launched by a script (`lorapilot run`, `lorapilot train --set ...`),
    not by hand. Phases, in hours:

    - initial_check: setup_hours (install, data, probe) + one model load and one
      baseline evaluation (the estimate's setup_s and eval_s / n_evals);
    - evaluation: 2 x the estimate's eval_s (final test evaluation, verify, report, with
      room to repeat one);
    - resumption_margin: 15% of the rental, for pre-emption and restarts from checkpoints;
    - export: 0.5 h (adapter, manifest, copying the pilot folder back);
    - experiments: what is left, for training runs (variants).

    variants_fit = floor(experiments / the estimate's total_s in hours), the runs of this
    estimate's size that fit (0 when the fixed phases do not). cost_usd: the whole rental
    at the estimate's usd_per_hour.
    """
    if days <= 0:
        raise ValueError("days must be positive")
    if setup_hours < 0:
        raise ValueError("setup_hours must be >= 0")
    rental_h = days * HOURS_PER_DAY
    n_evals = estimate.get("n_evals") or 0
    one_eval_s = estimate["eval_s"] / n_evals if n_evals else 0.0
    phases = {
        "initial_check": setup_hours + (estimate["setup_s"] + one_eval_s) / 3600,
        "evaluation": 2 * estimate["eval_s"] / 3600,
        "resumption_margin": RESUMPTION_SHARE * rental_h,
        "export": EXPORT_HOURS,
    }
    fixed = sum(phases.values())
    phases["experiments"] = max(0.0, rental_h - fixed)
    run_h = estimate["total_s"] / 3600
    fits = math.floor(phases["experiments"] / run_h) if run_h > 0 else 0
    return {
        "days": days,
        "rental_hours": rental_h,
        "phases": phases,
        "run_hours": run_h,
        "variants_fit": fits,
        "cost_usd": rental_h * estimate.get("usd_per_hour", 0.0),
        "human_hours": days * HUMAN_HOURS_PER_DAY,
    }


def plans(estimate: dict, *, setup_hours: float = 1.0) -> dict:
    """rental_plan for 3, 7 and 30 days, keyed "3", "7", "30" (JSON keys are strings)."""
    return {str(d): rental_plan(estimate, d, setup_hours=setup_hours) for d in RENTAL_DAYS}


def compare_estimate(estimate: dict, actual: dict) -> dict:
    """Each numeric component present in both -> {estimate, actual, error, rel_error}.

    error = actual - estimate (positive: the run took more than estimated); rel_error is
    relative to the actual value, None when that is 0.
    """
    out = {}
    for key, est in estimate.items():
        act = actual.get(key)
        if not (_is_number(est) and _is_number(act)):
            continue
        error = act - est
        out[key] = {
            "estimate": est,
            "actual": act,
            "error": error,
            "rel_error": error / act if act else None,
        }
    return out


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def limit_checks(lim: LimitsSpec, started: float):
    """(deadline, cost_check) from the spec's limits: stop gracefully at the time/cost cap."""
    deadline = started + lim.time_hours * 3600 if lim.time_hours else None
    cost_check = None
    if lim.cost_cap_usd and lim.usd_per_hour:

        def cost_check(status: dict) -> str | None:
            spent = status["wall_s"] / 3600 * lim.usd_per_hour
            return (
                f"the cost cap of ${lim.cost_cap_usd:.2f} was reached (${spent:.2f})"
                if spent >= lim.cost_cap_usd
                else None
            )

    return deadline, cost_check


def smoke_steps_of(spec: PilotSpec, sizes: dict) -> int:
    """The most steps the smoke of this pilot trains (its examples from the labels, one
    category where they are not known before the data is read)."""
    smoke = spec.smoke
    n_categories = len(spec.task.labels or []) or 1
    return smoke.steps_for(smoke.examples_for(n_categories, sizes.get("train", 0)))
