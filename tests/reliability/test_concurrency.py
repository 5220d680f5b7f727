"""Concurrency: two train runs of one pilot at once, and the test ledger under a lock.

Already covered elsewhere: distinct ids for runs opened one after the other
(tests/test_registry.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess

from rel_helpers import adapter_tensors, assert_same_tensors, cli_args, cli_env, run_ok, small_pilot

from lorapilot.fsutil import read_jsonl


def test_two_train_runs_at_once_get_distinct_ids_and_intact_records(tmp_path, tiny_model_dir):
    """Both complete with their own id, whole records and logs, and the same adapter (same
    spec and seed: nothing leaked from one run into the other). Run under umask 027, every
    file they wrote (checkpoints, safetensors, logs) follows it."""
    pilot = small_pilot(tmp_path / "pilot", tiny_model_dir, max_steps=4)
    procs = [
        subprocess.Popen(
            cli_args("train", str(pilot), "--json", "--no-progress"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            preexec_fn=lambda: os.umask(0o027),
        )
        for _ in range(2)
    ]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout))
    ids = [o["run_id"] for o in outs]
    assert len(set(ids)) == 2
    for run_id in ids:
        run_dir = pilot / "runs" / run_id
        rec = json.loads((run_dir / "run.json").read_text())
        assert (rec["id"], rec["status"]) == (run_id, "completed")
        assert [r["step"] for r in read_jsonl(run_dir / "steps.jsonl")] == [1, 2, 3, 4]
        assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")] == []
        for path in run_dir.rglob("*"):
            assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, path
    assert_same_tensors(*(adapter_tensors(pilot / "runs" / i / "adapter") for i in ids))
    listed = run_ok("runs", str(pilot))["runs"]
    assert sorted((r["id"], r["status"]) for r in listed) == sorted((i, "completed") for i in ids)


def _ledger_writer(pilot_dir: str, index: int, barrier, results) -> None:
    from pathlib import Path

    from lorapilot.evaluate.records import record_test_access

    barrier.wait()
    earlier = record_test_access(
        Path(pilot_dir), f"eval-20260101-00000{index}-abcdef", "base", None
    )
    results.put(len(earlier))


def test_the_test_ledger_is_appended_under_a_lock(tmp_path):
    """8 processes released together: 8 whole lines, and each saw a different number of
    earlier accesses (0..7), i.e. each read-then-append happened alone."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [
        ctx.Process(target=_ledger_writer, args=(str(tmp_path), i, barrier, results))
        for i in range(8)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen = sorted(results.get(timeout=10) for _ in range(8))
    assert seen == list(range(8))
    lines = (tmp_path / "runs" / "test_ledger.jsonl").read_text().splitlines()
    assert len(lines) == 8
    assert sorted(json.loads(x)["run"] for x in lines) == sorted(
        f"eval-20260101-00000{i}-abcdef" for i in range(8)
    )
