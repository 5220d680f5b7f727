"""Budget arithmetic, checked against figures worked out by hand."""

from __future__ import annotations

import pytest

from lorapilot.sizing.budget import (
    ProbeFigures,
    check_limits,
    compare_estimate,
    estimate_run,
    plans,
    rental_plan,
)
from lorapilot.sizing.memory import GIB
from lorapilot.spec import LimitsSpec

FIG = ProbeFigures(
    later_step_s=2.0, eval_examples_per_s=10.0, checkpoint_save_s=5.0, model_load_s=30.0,
    peak_memory_bytes=20 * GIB,
)  # fmt: skip


def run(**kw) -> dict:
    args = dict(
        n_train=1000, n_val=200, epochs=2, max_steps=None, micro_batch=8, grad_accum=2,
        eval_every=None, save_every=None, margin=0.2, usd_per_hour=3.0,
    )  # fmt: skip
    return estimate_run(FIG, **{**args, **kw})


def test_epochs_give_the_steps_and_every_part():
    est = run()
    # ceil(2 x 1000 / 16) = 125 steps
    assert est["steps"] == 125
    assert est["train_s"] == 250.0
    # no eval_every: final + verify = 2 evaluations of 200 examples at 10/s
    assert est["n_evals"] == 2 and est["eval_s"] == 40.0
    # no save_every: the default interval, floor(10% of 125) = 12 steps (saving 5 s every
    # 12 x 2 s = 21% of the time: the loss bound wins over the 5% time share) -> 10 + final
    assert est["n_checkpoints"] == 11 and est["checkpoint_s"] == 55.0
    assert est["setup_s"] == 30.0
    # margin 20% of 250 + 40 + 55 + 30 = 375
    assert est["margin_s"] == pytest.approx(75.0)
    assert est["total_s"] == pytest.approx(450.0)
    assert est["cost_usd"] == pytest.approx(450 / 3600 * 3.0)
    assert est["usd_per_hour"] == 3.0


def test_max_steps_overrides_epochs_and_sets_eval_and_save_counts():
    est = run(max_steps=100, eval_every=30, save_every=25)
    assert est["steps"] == 100
    assert est["n_evals"] == 3 + 2  # steps 30, 60, 90 + final + verify
    assert est["eval_s"] == 5 * 200 / 10
    assert est["n_checkpoints"] == 4 + 1  # steps 25, 50, 75, 100 + the final adapter
    assert est["checkpoint_s"] == 25.0


def test_world_size_divides_steps_and_fractional_epochs_round_up():
    assert run(world_size=4)["steps"] == 32  # ceil(2000 / 64)
    assert run(epochs=0.5, n_train=10)["steps"] == 1  # at least one step
    assert run(epochs=1.5, n_train=100, micro_batch=4, grad_accum=1)["steps"] == 38


def test_zero_margin_and_free_machine():
    est = run(margin=0.0, usd_per_hour=0.0)
    assert est["margin_s"] == 0
    assert est["total_s"] == 250 + 40 + 55 + 30  # 11 checkpoints by the default interval
    assert est["cost_usd"] == 0


def test_probe_figures_are_checked():
    with pytest.raises(ValueError, match="later_step_s"):
        ProbeFigures(0.0, 1.0, 0.0, 0.0, None)
    with pytest.raises(ValueError, match="eval_examples_per_s"):
        ProbeFigures(1.0, 0.0, 0.0, 0.0, None)
    with pytest.raises(ValueError, match="model_load_s"):
        ProbeFigures(1.0, 1.0, 0.0, -1.0, None)
    with pytest.raises(ValueError):
        run(micro_batch=0)


# --------------------------------------------------------------------------- limits


def test_limits_within():
    est = run()
    out = check_limits(est, 20 * GIB, LimitsSpec(memory_gb=24, time_hours=1, cost_cap_usd=5))
    assert out["ok"] is True
    assert out["memory_gb"] == {"limit": 24, "value": 20.0, "ok": True, "detail": "20 <= 24"}
    assert out["time_hours"]["value"] == pytest.approx(450 / 3600)
    assert out["cost_cap_usd"]["ok"] is True


def test_limits_exceeded_each_reported():
    est = run(max_steps=10_000)  # 20,000 s of training
    out = check_limits(est, 30 * GIB, LimitsSpec(memory_gb=24, time_hours=1, cost_cap_usd=5))
    assert out["ok"] is False
    assert [k for k in ("memory_gb", "time_hours", "cost_cap_usd") if not out[k]["ok"]] == [
        "memory_gb", "time_hours", "cost_cap_usd",
    ]  # fmt: skip
    assert ">" in out["memory_gb"]["detail"]


def test_only_limits_that_are_set_and_unmeasured_memory_fails():
    est = run()
    assert check_limits(est, None, LimitsSpec()) == {"ok": True}
    out = check_limits(est, None, LimitsSpec(memory_gb=24))
    assert set(out) == {"memory_gb", "ok"}
    assert out["memory_gb"]["ok"] is False and out["memory_gb"]["value"] is None
    assert out["ok"] is False


# --------------------------------------------------------------------------- rental plans


def test_rental_plan_phases_by_hand():
    est = run(
        max_steps=1800, save_every=10**6
    )  # one checkpoint (the adapter); 3600 s train; total = 1.2 x (3600 + 40 + 5 + 30) = 4410 s
    plan = rental_plan(est, 3, setup_hours=1.0)
    ph = plan["phases"]
    assert plan["rental_hours"] == 72
    assert ph["initial_check"] == pytest.approx(1 + (30 + 20) / 3600)  # load + one eval
    assert ph["evaluation"] == pytest.approx(2 * 40 / 3600)
    assert ph["resumption_margin"] == pytest.approx(0.15 * 72)
    assert ph["export"] == 0.5
    assert sum(ph.values()) == pytest.approx(72)
    assert plan["run_hours"] == pytest.approx(4410 / 3600)
    assert plan["variants_fit"] == int(ph["experiments"] // (4410 / 3600))
    assert plan["variants_fit"] == 48
    assert plan["cost_usd"] == pytest.approx(72 * 3.0)


def test_plans_for_3_7_30_days_grow_with_days():
    out = plans(run(max_steps=1800))
    assert list(out) == ["3", "7", "30"]
    fits = [out[d]["variants_fit"] for d in ("3", "7", "30")]
    assert fits == sorted(fits) and fits[0] < fits[2]
    assert [out[d]["days"] for d in out] == [3, 7, 30]


def test_a_run_longer_than_the_rental_fits_zero_times():
    est = run(max_steps=200_000)  # ~111 h
    plan = rental_plan(est, 3)
    assert plan["variants_fit"] == 0
    assert plan["phases"]["experiments"] > 0


# --------------------------------------------------------------------------- estimate vs actual


def test_compare_estimate_errors():
    est = {"train_s": 100.0, "eval_s": 40.0, "steps": 50, "note": "x", "only_here": 1.0}
    actual = {"train_s": 125.0, "eval_s": 0.0, "steps": 50, "note": "y", "peak": 3.0}
    out = compare_estimate(est, actual)
    assert set(out) == {"train_s", "eval_s", "steps"}
    assert out["train_s"] == {"estimate": 100.0, "actual": 125.0, "error": 25.0, "rel_error": 0.2}
    assert out["eval_s"]["error"] == -40.0 and out["eval_s"]["rel_error"] is None
    assert out["steps"]["error"] == 0 and out["steps"]["rel_error"] == 0


def test_the_memory_limit_takes_the_larger_of_the_training_and_evaluation_peaks():
    fig = dict(later_step_s=1.0, eval_examples_per_s=1.0, checkpoint_save_s=0, model_load_s=0)
    assert ProbeFigures(**fig, peak_memory_bytes=3, eval_peak_memory_bytes=5)\
        .pilot_peak_memory_bytes == 5  # fmt: skip
    assert ProbeFigures(**fig, peak_memory_bytes=7, eval_peak_memory_bytes=5)\
        .pilot_peak_memory_bytes == 7  # fmt: skip
    assert ProbeFigures(**fig, peak_memory_bytes=7).pilot_peak_memory_bytes == 7
    assert ProbeFigures(**fig).pilot_peak_memory_bytes is None


def test_default_checkpoint_interval_bounds_lost_work_then_saving_time():
    from lorapilot.sizing.budget import checkpoint_interval

    # 1000 steps of 1 s, 2 s to save: 5% of the time -> every 40 steps; 10% loss -> 100
    c = checkpoint_interval(1000, 1.0, 2.0)
    assert c["save_every"] == 40 and c["save_share"] == pytest.approx(0.05)
    assert c["max_lost_share"] == pytest.approx(0.04) and c["basis"] == "probe"
    # saving is slow: the 10% loss bound wins (every 100 steps, 20% of the time saving)
    slow = checkpoint_interval(1000, 1.0, 20.0)
    assert slow["save_every"] == 100 and slow["save_share"] == pytest.approx(0.2)
    # short runs save every step; no probe: the loss bound alone
    assert checkpoint_interval(5, 1.0, 0.01)["save_every"] == 1
    assert checkpoint_interval(50, None, None) == {
        "save_every": 5, "steps": 50, "save_share": None, "max_lost_share": 0.1,
        "basis": "no probe: the 10% loss bound alone",
    }  # fmt: skip


def test_plan_fits_counts_the_variants_that_fit_in_order():
    from lorapilot.sizing.budget import plan_fits

    # 3 days = 72 h: available 72 - 1 (setup) - 10.8 (15%) - 0.5 (export) = 59.7 h
    out = plan_fits(3600.0, [20 * 3600.0, 30 * 3600.0, 20 * 3600.0], 3)
    assert out["available_hours"] == pytest.approx(59.7)
    assert out["plan_hours"] == pytest.approx(71.0) and not out["fits"]
    assert out["variants_fit"] == 2  # 1 + 20 + 30 = 51 h fit, the third does not
    week = plan_fits(3600.0, [20 * 3600.0, 30 * 3600.0, 20 * 3600.0], 7)
    assert week["fits"] and week["variants_fit"] == 3
    unknown = plan_fits(0.0, [3600.0, None, 3600.0], 30)
    assert unknown["plan_hours"] is None and not unknown["fits"] and unknown["variants_fit"] == 1
