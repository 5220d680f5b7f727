"""scripts/gpu_check.sh: it parses, and --help answers without running anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text


def test_help_lists_the_options_and_runs_nothing(tmp_path):
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    for word in ("--quick", "--full", "--keep", "--work", "GPU_CHECK_PYTHON", "one JSON object"):
        assert word in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_unknown_option_exits_2():
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--nope"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "unknown option --nope" in proc.stderr and proc.stdout == ""


def test_targets_without_a_gpu_says_so_in_one_json_object(tmp_path):
    """--targets (#36's GPU benches alone, for a short lease) refuses a machine without a GPU
    in the script's one JSON object, after the environment step, and runs no bench."""
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--targets", "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["gpu"] is False
    assert "--targets measures a GPU" in out["error"]
    assert not any(k.startswith("targets_") for k in out)


def _bench(shape, case, **sides):
    return {"shapes": {shape: {"cases": {case: {k: {"step_s": v} for k, v in sides.items()}}}}}


TARGETS_RESULT = {  # the four --targets steps, as bench/gpu_shapes.py writes them
    "targets_135m": _bench("135m", "ticket", lorapilot=0.25, plain_peft=0.30,
                           lorapilot_peft_forward=0.24),
    "targets_135m_compiled": _bench("135m", "ticket", plain_peft=0.32, lorapilot=0.26,
                                    lorapilot_compiled=0.12, lorapilot_cudagraphs=0.04),
    "targets_8b": _bench("8b", "long", lorapilot=0.31, plain_peft=0.5),
    "targets_8b_compiled": _bench("8b", "long", lorapilot=0.3, lorapilot_compiled=0.2),
    "targets_capped": {"capped": [
        {"cap_gib": 24, "ok": True, "peak_gib": 21.0, "estimated_gib": 22.5,
         "estimate_error": 0.0714, "step_s": 2.0},
        {"cap_gib": 40, "ok": True, "peak_gib": 21.0, "estimated_gib": 22.5,
         "estimate_error": 0.0714, "step_s": 1.9},
    ]},
}  # fmt: skip


def test_the_targets_summary_names_the_side_that_met_each_target():
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_targets import summarize

    out = summarize(TARGETS_RESULT)
    small = out["135m_ticket"]
    # each side against the plain PEFT step of its own run
    assert small["ratios"] == {
        "lorapilot": 1.231,  # the eager side timed again beside the compiled ones: the last
        "lorapilot_peft_forward": 1.25,
        "lorapilot_compiled": 2.667,
        "lorapilot_cudagraphs": 8.0,
    }
    assert (small["best"], small["met"]) == ("lorapilot_cudagraphs", True)
    big = out["8b_long"]
    assert (big["best"], big["best_step_s"], big["met"]) == ("lorapilot_compiled", 0.2, False)
    assert out["8b_capped_24gib"]["met"] is True and "met" not in out["8b_capped_40gib"]
    # an estimate 12% off, an out-of-memory, a step not timed: not met, or not there
    bad = {**TARGETS_RESULT, "targets_capped": {"capped": [
        {"cap_gib": 24, "ok": True, "peak_gib": 20.0, "estimated_gib": 22.4,
         "estimate_error": 0.12}]}}  # fmt: skip
    assert summarize(bad)["8b_capped_24gib"]["met"] is False
    oom = {"targets_capped": {"capped": [{"cap_gib": 24, "ok": False, "error": "CUDA out of"}]}}
    assert summarize(oom) == {"8b_capped_24gib": {
        "ok": False, "error": "CUDA out of", "target": summarize(oom)["8b_capped_24gib"]["target"],
        "met": False}}  # fmt: skip
    assert summarize({}) == {}


def test_the_script_adds_the_summary_to_its_json(tmp_path):
    """What the steps left in the work folder is summarised in the one JSON object, even when
    the run stopped early (here: no GPU, after the figures were written)."""
    out_dir = tmp_path / "w" / "out"
    out_dir.mkdir(parents=True)
    for name, figures in TARGETS_RESULT.items():
        (out_dir / f"{name}.json").write_text(json.dumps(figures))
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--targets", "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert "targets_summary_error" not in out, out["targets_summary_error"]
    assert out["targets_summary"]["135m_ticket"]["best"] == "lorapilot_cudagraphs"
    assert out["targets_135m"] == TARGETS_RESULT["targets_135m"]


def test_gpu_wheels_script_parses_and_says_how_to_use_the_wheels(tmp_path):
    """scripts/gpu_wheels.sh (the wheels an offline GPU machine needs): valid bash, and its
    --help names the install line the GPU machine runs, without downloading anything."""
    wheels = ROOT / "scripts" / "gpu_wheels.sh"
    assert subprocess.run(["bash", "-n", str(wheels)]).returncode == 0
    proc = subprocess.run(
        ["bash", str(wheels), "--help"], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install -q --no-index --no-deps --target" in proc.stdout
    assert "gpu_check.sh --targets" in proc.stdout
    assert list(tmp_path.iterdir()) == []
