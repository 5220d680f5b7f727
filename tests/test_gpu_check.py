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
