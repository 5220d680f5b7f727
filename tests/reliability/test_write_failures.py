"""Disk full / read-only output: a write failure ends the verb with exit 1 and a one-line
message (no traceback), and the records written before stay exactly as they were.

Disk full is simulated in the subprocess by making lorapilot.fsutil.atomic_write_bytes (the
one function every JSON/text record goes through) raise ENOSPC; a read-only `runs/` is
tried for real when the tests do not run as root (root writes through chmod).
"""

from __future__ import annotations

import json
import os

import pytest
from rel_helpers import cli_args, run_measured, run_ok, small_pilot, wrapped_args

DISK_FULL = """
    import errno, os
    from pathlib import Path
    import lorapilot.fsutil as fsutil
    _real = fsutil.atomic_write_bytes
    def _full(path, data):
        if os.environ["FAIL_WRITES_TO"] in ("*", Path(path).name):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return _real(path, data)
    fsutil.atomic_write_bytes = _full
"""


@pytest.fixture
def pilot_with_a_run(tmp_path, tiny_model_dir):
    pilot = small_pilot(tmp_path / "pilot", tiny_model_dir)
    first = run_ok("data", str(pilot))["run_id"]
    before = {p: p.read_bytes() for p in (pilot / "runs").rglob("*") if p.is_file()}
    return pilot, first, before


def _unchanged(before: dict) -> None:
    for path, content in before.items():
        assert path.read_bytes() == content, path


def _run_with_full_disk(pilot, verb: str, fail_writes_to: str, *flags: str):
    res = run_measured(
        wrapped_args(DISK_FULL, verb, str(pilot), "--json", *flags),
        env={"FAIL_WRITES_TO": fail_writes_to},
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    out = res.json()
    assert out["exit_code"] == 1 and "No space left on device" in out["error"]
    assert "error: cannot write" in " ".join(res.stderr.split())
    return out


def test_disk_full_when_the_run_record_is_created_exits_1(pilot_with_a_run):
    pilot, first, before = pilot_with_a_run
    out = _run_with_full_disk(pilot, "data", "*")
    assert out["error"].startswith("cannot write ") and "run.json" in out["error"]
    _unchanged(before)
    listed = run_ok("runs", str(pilot))["runs"]  # the new, empty run folder is not a run
    assert [(r["id"], r["status"]) for r in listed] == [(first, "completed")]


def test_disk_full_mid_run_marks_that_run_failed_and_keeps_the_others(pilot_with_a_run):
    pilot, first, before = pilot_with_a_run
    out = _run_with_full_disk(pilot, "baseline", "predictions.jsonl", "--no-progress")
    assert "predictions.jsonl" in out["error"]
    _unchanged(before)
    listed = {r["id"]: r for r in run_ok("runs", str(pilot))["runs"]}
    assert listed.pop(first)["status"] == "completed"
    (failed,) = listed.values()
    assert failed["kind"] == "baseline" and failed["status"] == "failed"
    assert "No space left on device" in failed["error"]


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes through a read-only mode; the ENOSPC tests cover it"
)
def test_read_only_runs_folder_exits_1(pilot_with_a_run):
    pilot, first, before = pilot_with_a_run
    runs = pilot / "runs"
    os.chmod(runs, 0o555)
    try:
        res = run_measured(cli_args("data", str(pilot), "--json"))
    finally:
        os.chmod(runs, 0o755)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "Permission denied" in json.loads(res.stdout)["error"]
    _unchanged(before)
