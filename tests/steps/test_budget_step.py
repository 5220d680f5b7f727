"""`budget` from a real probe of the tiny model: every estimate component, the limits, the
3/7/30-day plans, the refusal without a probe, and estimate vs actual after a short train run."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import yaml
from conftest import EXAMPLES

from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot
from lorapilot.steps.budget import run_budget
from lorapilot.steps.probe import run_probe

PARTS = ("train_s", "eval_s", "checkpoint_s", "setup_s")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pilot(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("plan") / "ticket-triage"
    shutil.copytree(EXAMPLES / "ticket-triage", folder, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((folder / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    # Pinned here, so that editing the example does not break the arithmetic checked below.
    spec["train"].update(micro_batch=8, grad_accum=1, epochs=2, grad_checkpointing=False)
    spec["train"].pop("max_steps", None)
    spec["limits"] = {
        "memory_gb": 8,
        "time_hours": 1,
        "usd_per_hour": 2.5,
        "margin": 0.2,
        "window": "weekdays 09:00-17:00 UTC, results by Friday",
    }
    (folder / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def test_budget_without_a_probe_says_to_run_it(pilot):
    with pytest.raises(UsageError, match="lorapilot probe PILOT"):
        run_budget(load_pilot(pilot))
    assert not (pilot / "runs").exists() or not any((pilot / "runs").iterdir())  # read-only


@pytest.fixture(scope="module")
def probe_out(pilot):
    return run_probe(load_pilot(pilot), steps=5, progress=False, log=lambda s: None)


def test_budget_from_the_probe(pilot, probe_out):
    runs_before = sorted(p.name for p in (pilot / "runs").iterdir())
    out = run_budget(load_pilot(pilot))
    assert sorted(p.name for p in (pilot / "runs").iterdir()) == runs_before  # no run record
    est = out["estimate"]
    for key in (*PARTS, "margin_s", "total_s", "cost_usd"):
        assert isinstance(est[key], float) and est[key] > 0, key
    assert math.isclose(est["total_s"], sum(est[k] for k in PARTS) * 1.2)  # margin 0.2
    assert math.isclose(est["cost_usd"], est["total_s"] / 3600 * 2.5)
    typical = next(
        m
        for m in probe_out["measurements"]
        if m["length"] == "typical" and not m["grad_checkpointing"]
    )
    assert math.isclose(est["train_s"], est["steps"] * typical["later_step_s"])
    n_train = out["data"]["train"]
    assert est["steps"] == math.ceil(2 * n_train / 8)  # 2 epochs, micro_batch 8
    assert math.isclose(est["eval_s"], 2 * out["data"]["val"] / probe_out["eval_examples_per_s"])
    assert math.isclose(est["setup_s"], probe_out["load"]["seconds"])
    assert out["window"] == "weekdays 09:00-17:00 UTC, results by Friday"
    assert set(out["limits"]) == {"memory_gb", "time_hours", "ok"} and out["limits"]["ok"] is True
    assert out["figures"]["peak_memory_bytes"] == max(
        m["peak_total_bytes"] for m in probe_out["measurements"] if not m["grad_checkpointing"]
    )
    assert set(out["rental"]) == {"3", "7", "30"}
    for days, plan in out["rental"].items():
        assert plan["days"] == int(days) and plan["variants_fit"] >= 1
    assert out["probe_run"] == probe_out["run_id"]
    assert out["actual"] is None and out["errors"] is None
    json.loads(json.dumps(out))  # the --json output is plain JSON

    # evaluation has a measured peak too, and the memory limit takes the larger of the two
    eval_peak = probe_out["eval_peak_memory_bytes"]
    assert eval_peak > 0 and out["figures"]["eval_peak_memory_bytes"] == eval_peak
    larger = max(out["figures"]["peak_memory_bytes"], eval_peak)
    assert math.isclose(out["limits"]["memory_gb"]["value"], larger / 2**30)
    # the whole pilot, phase by phase: baseline and test at the eval rate, smoke, probe, train
    pt = out["pilot"]
    eps, load = probe_out["eval_examples_per_s"], probe_out["load"]["seconds"]
    assert math.isclose(pt["baseline_s"], load + out["data"]["val"] / eps)
    # the final test evaluates the adapter and the base on the same test rows
    assert math.isclose(pt["test_s"], load + 2 * out["data"]["test"] / eps)
    # the smoke's most steps: its 8 examples (3 labels x 1, topped up) x 20 passes, at least 40
    assert math.isclose(pt["smoke_s"], load + 40 * typical["later_step_s"])
    assert pt["train_s"] == est["total_s"] and pt["probe_s"] > 0
    assert math.isclose(
        pt["total_s"], sum(pt[k] for k in ("baseline_s", "smoke_s", "probe_s", "train_s", "test_s"))
    )

    # the plan: base only (no variants in this spec), its total = the whole pilot's
    assert [v["name"] for v in out["variants"]] == ["base"]
    assert out["variants"][0]["probe_run"] == probe_out["run_id"]
    assert out["variants"][0]["total_s"] == est["total_s"]
    assert math.isclose(out["plan"]["total_s"], pt["total_s"])
    assert set(out["plan"]["fits"]) == {"3", "7", "30"} and out["plan"]["ok"] is True

    accum = run_budget(load_pilot(pilot, ["train.grad_accum=2"]))["estimate"]
    assert math.isclose(accum["train_s"], accum["steps"] * 2 * typical["later_step_s"])
    with pytest.raises(UsageError, match="probe PILOT"):  # a setting the probe did not measure
        run_budget(load_pilot(pilot, ["train.micro_batch=4"]))


def test_estimate_only_probe_is_skipped_and_a_train_run_is_compared(pilot, probe_out):
    from lorapilot.steps.train import run_train

    run_probe(load_pilot(pilot), estimate_only=True, log=lambda s: None)  # newer, but no times
    train = run_train(load_pilot(pilot, ["train.max_steps=3"]), progress=False, log=lambda s: None)
    out = run_budget(load_pilot(pilot))
    assert out["probe_run"] == probe_out["run_id"]
    assert out["estimate"]["steps"] > 3  # the spec's own run is still what is estimated
    actual = out["actual"]
    assert out["train_run"] == train["run_id"] and actual["steps"] == 3
    assert actual["train_s"] > 0 and actual["eval_s"] > 0 and actual["total_s"] > actual["train_s"]
    errors = out["errors"]
    assert set(errors) == {"steps", "train_s", "eval_s", "total_s"}
    assert errors["steps"]["estimate"] == errors["steps"]["actual"] == 3  # same number of steps
    for key in ("train_s", "eval_s", "total_s"):
        e = errors[key]
        assert e["estimate"] > 0 and math.isclose(e["error"], e["actual"] - e["estimate"])
    assert out["comparison_estimate"]["n_evals"] == 1  # the final evaluation; verify is another run
    assert "steps" in out["comparison_basis"]
