"""`lorapilot run` executes the experiment plan: every variant, one probe per step shape, a
variant killed mid-run resumed (not restarted), the selection rule, the final test with the
base on the same rows, the plan budget and its refusal before anything trains."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import yaml
from conftest import init_tiny_pilot, run_cli, run_json

# The tiny random model cannot overfit smoke's examples in 30 steps (smoke's wiring check is
# tested on the default model); everything else here is the real pipeline, in a child process
# so that it can be killed.
DRIVER = """
import json, sys
import lorapilot.steps.run as R
from lorapilot.errors import LorapilotError
from lorapilot.spec import load_pilot
R.run_smoke = lambda pilot, **kw: {"ok": True}
try:
    out = R.run_pipeline(load_pilot(sys.argv[1]), progress=False,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
except LorapilotError as e:
    print(json.dumps({"error": str(e), "exit_code": e.exit_code, **e.details}, default=str))
    sys.exit(e.exit_code)
print(json.dumps(out, default=str))
"""


def _pilot(tmp_path, tiny_model_dir):
    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=4)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["variants"] = [
        {"name": "long", "set": {"train.max_steps": 100}},  # same step shape as base
        {"name": "r4", "set": {"adapter.r": 4}},  # another shape: its own probe
    ]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (tmp_path / "driver.py").write_text(DRIVER)
    return pilot


def _drive(tmp_path, pilot, expect=0) -> dict:
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(pilot)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == expect, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _train_runs(pilot) -> dict[str, dict]:
    out = {}
    for p in sorted((pilot / "runs").glob("train-*/run.json")):
        rec = json.loads(p.read_text())
        out[rec["id"]] = rec
    return out


def _long_run_checkpointed(pilot):
    """(run dir, checkpoint step) of the `long` variant once it has saved and gone on."""
    for rid, rec in _train_runs(pilot).items():
        if (rec.get("variant") or {}).get("name") != "long":
            continue
        d = pilot / "runs" / rid
        ckpts = [int(c.name.split("-")[1]) for c in (d / "checkpoints").glob("step-*")]
        steps = d / "steps.jsonl"
        if ckpts and steps.is_file() and steps.read_text().count("\n") >= max(ckpts) + 5:
            return d, max(ckpts)
    return None


def test_plan_killed_in_its_second_variant_resumes_it_then_selects_and_tests(
    tmp_path, tiny_model_dir
):
    pilot = _pilot(tmp_path, tiny_model_dir)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(pilot)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline, found = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None and found is None:
        found = _long_run_checkpointed(pilot)
        time.sleep(0.02)
    assert found, "the long variant never checkpointed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_dir, ckpt_step = found
    assert not (killed_dir / "adapter").exists()

    out = _drive(tmp_path, pilot)
    trains = [p for p in out["phases"] if p["phase"] == "train"]
    assert [(p["variant"], p["reused"]) for p in trains] == [
        ("base", True), ("long", False), ("r4", False),
    ]  # fmt: skip
    assert trains[1]["run_id"] == killed_dir.name  # resumed in place, not a new run
    rec = json.loads((killed_dir / "run.json").read_text())
    assert rec["status"] == "completed" and rec["result"]["train"]["resumed_from"] >= ckpt_step > 0
    assert rec["result"]["checkpointing"]["chosen_by"] == "default"
    # one probe per step shape: base and long share one, r4 has its own
    probes = [p for p in out["phases"] if p["phase"] == "probe"]
    assert [p["variant"] for p in probes] == ["base", "r4"]

    assert [v["name"] for v in out["variants"]] == ["base", "long", "r4"]
    assert all(v["status"] == "completed" and v["run_id"] for v in out["variants"])
    assert out["selection_metric"] == "macro_f1" and out["selected"] in ("base", "long", "r4")
    assert (
        out["train_run"]
        == next(v for v in out["variants"] if v["name"] == out["selected"])["run_id"]
    )
    assert out["decision"] in ("GO", "NO-GO", "INCONCLUSIVE")
    gain = out["test_gain"]
    assert gain["metric"] == "macro_f1" and gain["gain"] == gain["adapted"] - gain["baseline"]
    assert gain["bootstrap"]["n"] == out["test_metrics"]["n"]
    assert any(r.startswith("final test: macro_f1") for r in out["reasons"])
    test_dir = pilot / "runs" / next(p for p in out["phases"] if p["phase"] == "test")["run_id"]
    assert (test_dir / "baseline_predictions.jsonl").is_file()

    # the rerun reuses every phase and never touches the test split again
    again = _drive(tmp_path, pilot)
    computing = [p for p in again["phases"] if p["phase"] not in ("inspect", "smoke", "budget",
                                                                  "report")]  # fmt: skip
    assert all(p["reused"] for p in computing), [p for p in computing if not p["reused"]]
    assert again["train_run"] == out["train_run"] and again["decision"] == out["decision"]
    assert len((pilot / "runs" / "test_ledger.jsonl").read_text().splitlines()) == 1

    # compare, report and runs show every variant side by side, the winner marked
    from lorapilot.spec import load_pilot
    from lorapilot.steps.budget import run_budget
    from lorapilot.steps.compare import run_compare
    from lorapilot.steps.report import run_report
    from lorapilot.steps.runs import run_rows

    rep = run_report(load_pilot(pilot))
    assert rep["selection"]["n_tried"] == 3 and rep["selection"]["selected"] == out["selected"]
    md = (pilot / "report" / "report.md").read_text()
    assert "Variants, selected on validation macro_f1" in md and "adapter.r: 8 -> 4" in md
    assert "median step" in md
    assert f"{out['selected']} (selected)" in md
    cmp = run_compare(load_pilot(pilot))
    assert [v["name"] for v in cmp["selection"]["variants"]] == ["base", "long", "r4"]
    assert all(v["peak_memory_bytes"] and v["cost_usd"] is not None and v["median_step_s"] > 0
               for v in cmp["selection"]["variants"])  # fmt: skip
    for v in cmp["selection"]["variants"]:  # the median of the run's own step times
        lines = (pilot / "runs" / v["run_id"] / "steps.jsonl").read_text().splitlines()
        steps = [json.loads(line) for line in lines]
        assert v["median_step_s"] == statistics.median(s["step_time_s"] for s in steps)
    names = {r["id"]: r["variant_name"] for r in run_rows(pilot)}
    assert names[trains[1]["run_id"]] == "long"

    # the budget of the whole plan: every variant from the probe of its shape
    bud = run_budget(load_pilot(pilot))
    rows = {v["name"]: v for v in bud["variants"]}
    assert rows["base"]["probe_run"] == rows["long"]["probe_run"] != rows["r4"]["probe_run"]
    assert rows["long"]["steps"] == 100 and rows["base"]["steps"] == 4
    assert rows["long"]["total_s"] > rows["base"]["total_s"]
    assert set(bud["plan"]["fits"]) == {"3", "7", "30"} and bud["plan"]["ok"]
    assert bud["plan"]["variants_fit"] == 3

    # the same adapter as an uninterrupted run of that variant (CPU, fp32: bit for bit)
    fresh = run_json("train", str(pilot), "--variant", "long", "--no-progress")
    from safetensors.torch import load_file

    a = load_file(killed_dir / "adapter" / "adapter_model.safetensors")
    b = load_file(pilot / "runs" / fresh["run_id"] / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert fresh["variant_name"] == "long" and fresh["variant"] == "one_change"

    # a time limit too small for the plan: refused before anything trains, naming variants
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["limits"]["time_hours"] = 1e-6
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    n_train = len(_train_runs(pilot))
    refused = _drive(tmp_path, pilot, expect=1)
    for name in ("base", "long", "r4"):
        assert f"variant {name} exceeds the spec's limits (time_hours" in refused["error"]
    assert len(_train_runs(pilot)) == n_train
    # the limits are not part of the phases' inputs: nothing measured was redone
    assert all(p["reused"] for p in refused["phases"] if p["phase"] in ("baseline", "probe"))


def test_a_variant_that_fails_stays_on_the_record_and_the_plan_goes_on(monkeypatch):
    """_train_variant: an error in one variant is logged and the plan goes on; a failed gate
    (CheckFailed, e.g. the update audit) stops the plan."""
    import pytest

    import lorapilot.steps.run as R
    from lorapilot.errors import CheckFailed

    class P:
        variant = "r8"
        replicate = 0

    calls, logged = [], []

    def phase(name, kind, fn, where=None, variant=None):
        calls.append((name, variant))
        return fn()

    def oom(*a, **k):
        raise RuntimeError("CUDA out of memory")

    def audit(*a, **k):
        raise CheckFailed("the update audit failed: lora_A did not change")

    monkeypatch.setattr(R, "_resumable", lambda pilot, vp: None)
    monkeypatch.setattr(R, "run_train", oom)
    R._train_variant(P(), P(), phase, True, False, logged.append)
    assert calls == [("train", "r8")]
    assert "r8: failed (RuntimeError: CUDA out of memory); the plan goes on" in logged[-1]
    monkeypatch.setattr(R, "run_train", audit)
    with pytest.raises(CheckFailed, match="update audit"):
        R._train_variant(P(), P(), phase, True, False, logged.append)


def test_seeded_plan_trains_every_seed_selects_on_the_mean_and_tests_the_median_seed(
    tmp_path, tiny_model_dir
):
    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=2, seed=5)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["variants"] = [{"name": "lr", "set": {"train.lr": 3e-3}}]
    spec["selection"] = {"seeds": 2}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (tmp_path / "driver.py").write_text(DRIVER)
    plan = run_json("check", str(pilot))["plan"]
    assert plan == {"variants": ["base", "lr"], "seeds": 2, "train_runs": 4}
    out = _drive(tmp_path, pilot)
    trains = [p for p in out["phases"] if p["phase"] == "train"]
    assert [p["variant"] for p in trains] == ["base", "base seed+1", "lr", "lr seed+1"]
    recs = {p["variant"]: _train_runs(pilot)[p["run_id"]] for p in trains}
    assert [r["config"]["train"]["seed"] for r in recs.values()] == [5, 6, 5, 6]
    assert [r["variant"].get("replicate", 0) for r in recs.values()] == [0, 1, 0, 1]
    assert recs["lr seed+1"]["variant"]["diff"] == recs["lr"]["variant"]["diff"]

    from lorapilot.spec import load_pilot
    from lorapilot.steps.budget import run_budget
    from lorapilot.steps.compare import run_compare

    sel = run_compare(load_pilot(pilot))["selection"]
    assert sel["seeds"] == 2 and "median seed" in sel["rule"]
    by_name = {v["name"]: v for v in sel["variants"]}
    for v in by_name.values():
        values = [s["value"] for s in v["seeds"]]
        assert v["seeds_done"] == 2 and v["value"] == statistics.fmean(values)
        assert (v["low"], v["high"]) == (min(values), max(values))
        # the lower of two seeds represents the variant (ties: the earlier run, seed 0 here)
        low = min(v["seeds"], key=lambda s: (s["value"], s["replicate"]))
        assert v["run_id"] == low["run_id"]
    chosen = by_name[out["selected"]]
    assert chosen["value"] == max(v["value"] for v in by_name.values())
    assert out["train_run"] == chosen["run_id"]  # verified and tested: the median seed
    assert [v.get("seeds_done") for v in out["variants"]] == [2, 2]
    noise = out["seed_noise"]
    assert noise["variant"] == out["selected"] and noise["seeds"] == 2
    assert noise["runner_up"] == ({"base", "lr"} - {out["selected"]}).pop()
    text = run_cli("compare", str(pilot)).stdout
    assert "mean over seeds" in text and f"seeds: {out['selected']} " in text
    md = (pilot / "report" / "report.md").read_text()
    assert "Seeds: each variant trained 2 times" in md and "macro_f1 (mean of 2 seeds)" in md
    assert "median: carried to verify and the test" in md

    bud = run_budget(load_pilot(pilot))
    for row in bud["variants"]:  # the plan holds every seed's run
        assert row["seeds"] == 2 and row["total_s"] == 2 * row["run_s"]

    # one more seed registered: only the new replicates train, the rest is reused
    spec["selection"] = {"seeds": 3}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    more = _drive(tmp_path, pilot)
    trains = [(p["variant"], p["reused"]) for p in more["phases"] if p["phase"] == "train"]
    assert trains == [("base", True), ("base seed+1", True), ("base seed+2", False),
                      ("lr", True), ("lr seed+1", True), ("lr seed+2", False)]  # fmt: skip
    assert all(p["reused"] for p in more["phases"] if p["phase"] in ("data", "baseline", "probe"))

    # a replicate by hand is the same run as the plan's (CPU, fp32: bit for bit)
    by_hand = run_json("train", str(pilot), "--variant", "lr", "--replicate", "1",
                       "--no-progress")  # fmt: skip
    assert by_hand["replicate"] == 1 and by_hand["seed"] == 6
    from safetensors.torch import load_file

    a, b = (load_file(pilot / "runs" / rid / "adapter" / "adapter_model.safetensors")
            for rid in (recs["lr seed+1"]["id"], by_hand["run_id"]))  # fmt: skip
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    bad = run_json("train", str(pilot), "--variant", "lr", "--replicate", "3", expect=2)
    assert "selection.seeds: 3" in bad["error"]
