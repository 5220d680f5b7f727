"""`train` and `smoke` end to end: identities, variants, audit, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import yaml
from conftest import EXAMPLES, run_cli, run_json


def _pilot(tmp_path, tiny_model_dir=None, example="ticket-triage", **train):
    pilot = tmp_path / example
    shutil.copytree(EXAMPLES / example, pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    if tiny_model_dir is not None:
        spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(train)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


def test_train_tiny_records_identity_and_variant(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir, lr=0.01, precision="fp32", max_steps=4)
    out = run_json("train", str(pilot), "--set", "adapter.r=4", "--no-progress")
    assert out["status"] == "completed" and out["variant"] == "one_change"
    assert out["variant_diff"] == {"adapter.r": [16, 4]}
    assert out["update_audit"]["ok"] and out["update_audit"]["unchanged_trainable"] == []
    assert out["trainable_params"] > 0 and out["target_modules"]
    adapter = tmp_path / "ticket-triage" / "runs" / out["run_id"] / "adapter"
    assert {"adapter_model.safetensors", "adapter_config.json", "lorapilot.json"} <= {
        p.name for p in adapter.iterdir()
    }
    assert not list(adapter.glob("*.bin")) and not list(adapter.glob("*.pt"))
    manifest = json.loads((adapter / "lorapilot.json").read_text())
    assert manifest["base"]["sha256"] and manifest["data_version"] == out["data_version"]
    assert manifest["eval_protocol"]["eval_protocol"] == out["eval_protocol"]
    rec = json.loads((adapter.parent / "run.json").read_text())
    assert rec["variant"]["label"] == "one_change" and rec["data_version"] == out["data_version"]
    assert rec["result"]["metrics"]["accuracy"] == out["metrics"]["accuracy"]
    assert rec["result"]["eval_peak_memory_bytes"] > 0
    assert rec["result"]["train"]["precision"] == "fp32"  # as given; `auto` is resolved
    steps = [
        json.loads(x)["step"] for x in (adapter.parent / "steps.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4]


def test_combined_variant_label(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir, precision="fp32", max_steps=2)
    out = run_json(
        "train", str(pilot), "--set", "adapter.r=4", "--set", "train.lr=0.001", "--no-progress"
    )
    assert out["variant"] == "combined" and out["variant_name"] is None  # ad hoc, not planned
    assert out["variant_diff"] == {"adapter.r": [16, 4], "train.lr": [0.0005, 0.001]}


def test_bad_set_value_is_exit_2(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir)
    out = run_json("train", str(pilot), "--set", "adapter.r=-2", expect=2)
    assert "adapter.r" in out["error"]


def test_sigkill_then_resume_completes_one_run(tmp_path, tiny_model_dir):
    pilot = _pilot(
        tmp_path, tiny_model_dir, precision="fp32", max_steps=60, save_every=5, micro_batch=2
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "lorapilot", "train", str(pilot), "--no-progress", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = pilot / "runs"
    deadline = time.time() + 120
    steps_file = None
    while time.time() < deadline:
        found = list(runs.glob("train-*/steps.jsonl")) if runs.exists() else []
        if found and len(found[0].read_text().splitlines()) >= 12:
            steps_file = found[0]
            break
        time.sleep(0.05)
    assert steps_file is not None, proc.stderr.read() if proc.poll() is not None else "no progress"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_id = steps_file.parent.name
    listed = run_json("runs", str(pilot))["runs"]
    assert [(r["id"], r["status"]) for r in listed] == [(run_id, "interrupted")]

    out = run_json("train", str(pilot), "--resume", run_id, "--no-progress")
    assert out["status"] == "completed" and out["run_id"] == run_id and out["resumed_from"] >= 10
    steps = [json.loads(x)["step"] for x in steps_file.read_text().splitlines()]
    assert steps == list(range(1, 61))
    listed = run_json("runs", str(pilot))["runs"]
    assert len(listed) == 1 and listed[0]["status"] == "completed"
    rec = json.loads((steps_file.parent / "run.json").read_text())
    assert len(rec["result"]["resumes"]) == 1


def test_resume_refuses_a_completed_run(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir, precision="fp32", max_steps=2)
    out = run_json("train", str(pilot), "--no-progress")
    again = run_json("train", str(pilot), "--resume", out["run_id"], expect=2)
    assert "already completed" in again["error"]


def test_train_refuses_when_the_probe_exceeds_the_limits(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir, precision="fp32", max_steps=2)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["limits"]["memory_gb"] = 0.0001
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_json("probe", str(pilot), "--no-progress")
    out = run_json("train", str(pilot), "--no-progress", expect=1)
    assert "limits" in out["error"] and "memory_gb" in out["error"]
    assert not list((pilot / "runs").glob("train-*")), "refused before any train run exists"


def test_train_to_a_file_writes_plain_progress_lines_with_an_eta(tmp_path, tiny_model_dir):
    """`lorapilot train PILOT > log.txt`: the bar cannot draw in a file, so the log gets a line
    per interval (here every step) with the step, the loss and an ETA; a terminal gets none."""
    pilot = _pilot(tmp_path, tiny_model_dir, precision="fp32", max_steps=3)
    proc = run_cli("train", str(pilot), env={"LORAPILOT_PROGRESS_EVERY": "0"})
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("train: step ")]
    assert [ln.split()[2] for ln in lines] == ["1/3", "2/3", "3/3"]
    assert all("loss " in ln and "ETA " in ln for ln in lines)
    assert any(ln.startswith("eval (val): ") for ln in proc.stdout.splitlines())
    quiet = run_cli("train", str(pilot), "--no-progress", env={"LORAPILOT_PROGRESS_EVERY": "0"})
    assert quiet.returncode == 0 and "train: step" not in quiet.stdout
