"""SIGKILL at any moment: during training, during a checkpoint write, during any verb.

What a user sees is what is tested: the CLI in a subprocess, killed with SIGKILL (no
handler runs), then `runs` and `train --resume` / a rerun. Already covered elsewhere and not
repeated here: the in-process bitwise resume after a limit or a crash, and a one-bit
corruption of the newest checkpoint (tests/train/test_loop.py); SIGKILL of one train run and its
resume to a complete steps.jsonl (tests/steps/test_train_step.py); a torn run.json skipped by
`runs` (tests/test_registry.py).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import psutil
import pytest
from rel_helpers import (
    adapter_tensors,
    assert_same_tensors,
    cli_args,
    existing_runs,
    new_run_json,
    run_measured,
    run_ok,
    sigkill,
    small_pilot,
    start,
    wrapped_args,
)

from lorapilot.fsutil import read_jsonl

MAX_STEPS = 12  # save_every 2, micro_batch 2, fp32, dropout 0.1 (see rel_helpers.small_spec)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> dict:
    """One uninterrupted train run: what every interrupted-and-resumed run must equal."""
    pilot = small_pilot(tmp_path_factory.mktemp("reference") / "pilot", tiny_model_dir)
    out = run_ok("train", str(pilot), "--no-progress")
    run_dir = pilot / "runs" / out["run_id"]
    return {
        "pilot": pilot,
        "run_id": out["run_id"],
        "run_dir": run_dir,
        "adapter": adapter_tensors(run_dir / "adapter"),
        "steps": read_jsonl(run_dir / "steps.jsonl"),
    }


def _copy_pilot(reference: dict, dest: Path) -> Path:
    shutil.copytree(
        reference["pilot"], dest, ignore=shutil.ignore_patterns("runs", "report", "deliverable")
    )
    return dest


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _assert_resumed_like_reference(pilot: Path, run_id: str, reference: dict) -> None:
    run_dir = pilot / "runs" / run_id
    steps = read_jsonl(run_dir / "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(1, MAX_STEPS + 1)), (
        "duplicated or missing steps"
    )
    for mine, ref in zip(steps, reference["steps"], strict=True):
        assert (mine["loss"], mine["lr"], mine["grad_norm"]) == (
            ref["loss"],
            ref["lr"],
            ref["grad_norm"],
        ), mine["step"]
    assert [r["step"] for r in read_jsonl(run_dir / "val.jsonl")] == [0, MAX_STEPS]
    assert_same_tensors(adapter_tensors(run_dir / "adapter"), reference["adapter"])
    listed = run_ok("runs", str(pilot))["runs"]
    assert [(r["id"], r["kind"], r["status"]) for r in listed] == [(run_id, "train", "completed")]
    rec = json.loads((run_dir / "run.json").read_text())
    assert len(rec["result"]["resumes"]) == 1


# Kill points: after 3, 1 and 4 lines of steps.jsonl (random.Random(seed).randint(1, 9)):
# mid-way between checkpoints, before the first checkpoint, and right at a checkpoint step.
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_a_random_step_then_resume_is_bitwise_identical(seed, reference, tmp_path):
    kill_after = random.Random(seed).randint(1, 9)
    pilot = _copy_pilot(reference, tmp_path / "pilot")
    proc = start(cli_args("train", str(pilot), "--json", "--no-progress"))
    run_dir = new_run_json(pilot / "runs", set())
    assert run_dir is not None, (
        proc.stderr.read().decode() if proc.poll() is not None else "no run.json"
    )
    deadline = time.time() + 120
    while (
        _lines(run_dir / "steps.jsonl") < kill_after
        and proc.poll() is None
        and time.time() < deadline
    ):
        time.sleep(0.005)
    assert sigkill(proc) == -9, "the run ended before the kill landed"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    listed = run_ok("runs", str(pilot))["runs"]
    assert [(r["id"], r["status"]) for r in listed] == [(run_dir.name, "interrupted")]

    ckpts = run_dir / "checkpoints"
    latest = (
        json.loads((ckpts / "latest.json").read_text())["step"]
        if (ckpts / "latest.json").exists()
        else None
    )
    out = run_ok("train", str(pilot), "--resume", run_dir.name, "--no-progress")
    assert (
        out["run_id"] == run_dir.name and out["status"] == "completed" and out["steps"] == MAX_STEPS
    )
    assert out["resumed_from"] == latest  # the last checkpoint whose write completed (None: from 0)
    _assert_resumed_like_reference(pilot, run_dir.name, reference)


CRASH_IN_CHECKPOINT_RENAME = """
    import os, signal
    _real_replace = os.replace
    def _replace(src, dst, *a, **k):
        # step-6 is fully written and checksummed in .tmp-step-6; die before the rename
        if os.path.basename(os.fspath(src)) == ".tmp-step-6":
            os.kill(os.getpid(), signal.SIGKILL)
        return _real_replace(src, dst, *a, **k)
    os.replace = _replace
"""


def test_crash_between_checkpoint_write_and_rename_keeps_the_previous_one(reference, tmp_path):
    """A kill inside save_checkpoint leaves only a temp folder; a truncated checkpoint (a
    partial copy, a bad disk) fails its sha256 and is never loaded: resume takes the one
    before, and the result is still the uninterrupted one, bit for bit."""
    pilot = _copy_pilot(reference, tmp_path / "pilot")
    res = run_measured(
        wrapped_args(CRASH_IN_CHECKPOINT_RENAME, "train", str(pilot), "--json", "--no-progress")
    )
    assert res.returncode == -9, res.stderr
    (run_dir,) = (pilot / "runs").iterdir()
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [
        ".tmp-step-6",
        "latest.json",
        "step-2",
        "step-4",
    ]
    assert (ckpts / ".tmp-step-6" / "checksums.json").is_file()  # written, never renamed
    assert json.loads((ckpts / "latest.json").read_text()) == {"step": 4}

    weights = ckpts / "step-4" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated

    # a resume must use the spec the run started with (the checkpoints were made with it)
    out = run_ok("train", str(pilot), "--resume", run_dir.name, "--set", "train.lr=0.02", expect=2)
    assert "differs from the one the run started with" in out["error"]

    res = run_measured(
        cli_args("train", str(pilot), "--resume", run_dir.name, "--json", "--no-progress")
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    out = res.json()
    assert out["resumed_from"] == 2
    flat = " ".join(res.stderr.split())  # rich wraps long log lines
    assert (
        "step-4 is not usable" in flat
        and "adapter_model.safetensors does not match its checksum" in flat
    )
    assert not (ckpts / ".tmp-step-6").exists()
    _assert_resumed_like_reference(pilot, run_dir.name, reference)


def _kill_with_children(proc, run_dir: Path) -> int:
    """SIGKILL the verb; `verify` also has a child (python -m lorapilot.decision.reload RUN_DIR)
    that a SIGKILL of its parent leaves running: it is ours, so it goes too (by pid)."""
    rc = sigkill(proc)
    for p in psutil.process_iter(["pid", "cmdline"]):
        if str(run_dir) in " ".join(p.info["cmdline"] or []):
            p.kill()
            p.wait(10)
    return rc


@pytest.mark.parametrize(
    "verb, rerun_flags",
    [
        ("data", []),
        ("baseline", ["--no-progress"]),
        # the rerun only has to show that the dead run blocks nothing: the estimate is enough
        ("probe", ["--estimate-only"]),
        ("verify", []),
    ],
)
def test_sigkill_during_a_verb_leaves_an_interrupted_run_and_a_rerun_works(
    verb, rerun_flags, reference
):
    pilot = reference["pilot"]  # it has a completed train run, which verify needs
    before = existing_runs(pilot)
    flags = ["--no-progress"] if verb in ("baseline", "probe") else []
    proc = start(cli_args(verb, str(pilot), "--json", *flags))
    run_dir = new_run_json(pilot / "runs", before)
    assert run_dir is not None, (
        proc.stderr.read().decode() if proc.poll() is not None else "no run.json"
    )
    assert _kill_with_children(proc, run_dir) == -9

    raw = json.loads((run_dir / "run.json").read_text())
    assert (raw["status"], raw["pid"]) == ("running", proc.pid)  # exactly as the process left it
    assert not psutil.pid_exists(proc.pid)
    listed = {r["id"]: r for r in run_ok("runs", str(pilot))["runs"]}
    assert listed[run_dir.name]["status"] == "interrupted"
    assert "killed" in listed[run_dir.name]["error"]

    out = run_ok(verb, str(pilot), *rerun_flags)
    assert out["run_id"] != run_dir.name and out["status"] == "completed"
    listed = {r["id"]: r for r in run_ok("runs", str(pilot))["runs"]}
    assert listed[out["run_id"]]["status"] == "completed"
    assert listed[run_dir.name]["status"] == "interrupted"  # the dead run stays on record


def test_sigkill_during_report_then_rerun_writes_a_whole_report(reference):
    """`report` writes no run record; a kill leaves at most an old or a whole file (atomic
    writes), and a rerun writes the report."""
    pilot = reference["pilot"]
    proc = start(cli_args("report", str(pilot), "--json"))
    deadline = time.time() + 60
    while not (pilot / "report").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    sigkill(proc)
    for name in ("index.html", "report.md"):
        f = pilot / "report" / name
        assert not f.exists() or f.stat().st_size > 0
    out = run_ok("report", str(pilot))
    html = Path(out["html"]).read_text()
    assert html.rstrip().endswith("</html>")
    assert Path(out["markdown"]).read_text().strip()


def test_sigterm_during_a_verb_is_a_message_not_a_traceback(reference):
    """SIGTERM (a scheduler's or a rental's shutdown) ends the verb with exit 143 and one
    line, and the run is recorded as interrupted by the signal."""
    import signal as _signal

    pilot = reference["pilot"]
    before = existing_runs(pilot)
    proc = start(cli_args("baseline", str(pilot), "--no-progress"))
    run_dir = new_run_json(pilot / "runs", before)
    assert run_dir is not None
    proc.send_signal(_signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read().decode()
    assert rc == 143, err
    assert "Traceback" not in err and "interrupted" in err
    raw = json.loads((run_dir / "run.json").read_text())
    assert raw["status"] == "interrupted" and "SIGTERM" in raw["error"]
