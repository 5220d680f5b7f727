"""The environment snapshot: every library a result depends on, and the ones that only record
or mirror it, read from package metadata without importing them."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

from lorapilot.records import environment

ADDED = ("datasets", "mlflow", "tensorboard", "typer", "pydantic")


def test_snapshot_records_data_tracking_and_cli_libraries():
    libs = environment.snapshot()["libraries"]
    assert set(ADDED) <= set(libs)
    assert libs["typer"] == md.version("typer") and libs["pydantic"] == md.version("pydantic")
    assert libs["torch"] == md.version("torch")  # the compute stack is still there


def test_mlflow_version_comes_from_mlflow_skinny_too(monkeypatch):
    """lorapilot[mlflow] installs mlflow-skinny, whose module is `mlflow`."""
    installed = {"mlflow-skinny": "3.1.0", "typer": "0.1"}

    def fake_version(dist: str) -> str:
        if dist in installed:
            return installed[dist]
        raise md.PackageNotFoundError(dist)

    monkeypatch.setattr(environment.md, "version", fake_version)
    libs = environment.library_versions()
    assert libs["mlflow"] == "3.1.0" and libs["typer"] == "0.1"
    # not installed: present, and None
    assert libs["datasets"] is None and libs["tensorboard"] is None and libs["torch"] is None
    installed["mlflow"] = "3.2.0"  # the full package, when both are there
    assert environment.library_versions()["mlflow"] == "3.2.0"


def test_library_versions_import_nothing():
    """Reading versions must not import datasets/mlflow/tensorboard (seconds each)."""
    code = (
        "import sys; from lorapilot.records.environment import library_versions; "
        "v = library_versions(); "
        "heavy = [m for m in ('datasets', 'mlflow', 'tensorboard', 'torch', 'transformers') if m "
        "in sys.modules]; "
        "assert v['typer'] and not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_platform_fingerprint_ignores_the_added_libraries():
    """Installing a tracker or datasets changes no result: `run` must not redo its launch
    checks, and fingerprints of runs recorded before these were added stay equal."""
    env = {
        "accelerator": "cpu",
        "devices": [],
        "cuda": None,
        "hip": None,
        "python": "3.12.0",
        "libraries": {"torch": "2.0", "peft": "0.1"},
    }
    newer = {
        **env,
        "libraries": {
            **env["libraries"],
            "datasets": "4.0",
            "mlflow": None,
            "tensorboard": "2.0",
            "typer": "0.9",
        },
    }
    assert environment.platform_fingerprint(newer) == environment.platform_fingerprint(env)
    changed = {**env, "libraries": {**env["libraries"], "torch": "2.1"}}
    assert environment.platform_fingerprint(changed) != environment.platform_fingerprint(env)


def test_bitsandbytes_joins_the_platform_fingerprint_only_when_installed():
    """A new bitsandbytes redoes the launch checks (it quantizes bases); a machine without it
    keeps the fingerprint that records made before it existed carry."""
    env = environment.snapshot()
    with_bnb = {**env, "libraries": {**env["libraries"], "bitsandbytes": "0.50.2"}}
    without = {**env, "libraries": {**env["libraries"], "bitsandbytes": None}}
    assert environment.platform_fingerprint(with_bnb)["libraries"]["bitsandbytes"] == "0.50.2"
    assert "bitsandbytes" not in environment.platform_fingerprint(without)["libraries"]
    newer = {**with_bnb, "libraries": {**with_bnb["libraries"], "bitsandbytes": "0.51.0"}}
    assert environment.platform_fingerprint(newer) != environment.platform_fingerprint(with_bnb)
