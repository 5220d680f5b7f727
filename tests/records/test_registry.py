"""Run records: statuses, atomic writes, ids, and interrupted runs detected by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lorapilot.errors import UsageError
from lorapilot.records import registry


def test_completed_run_record(tmp_path):
    with registry.open_run(tmp_path, "data", spec_hash="abc", config={"x": 1}) as run:
        assert json.loads((run.dir / "run.json").read_text())["status"] == "running"
        run.update(answer=42)
    rec = json.loads((run.dir / "run.json").read_text())
    assert rec["status"] == "completed" and rec["result"]["answer"] == 42
    assert rec["spec_hash"] == "abc" and rec["config"] == {"x": 1}
    assert rec["ended_at"] and rec["duration_s"] >= 0
    assert registry.RUN_ID_RE.match(rec["id"])


def test_exception_marks_failed_with_message(tmp_path):
    with pytest.raises(ValueError), registry.open_run(tmp_path, "train") as run:
        raise ValueError("boom")
    rec = registry.read_record(run.dir)
    assert rec.status == "failed" and "ValueError: boom" in rec.error


def test_keyboard_interrupt_marks_interrupted(tmp_path):
    with pytest.raises(KeyboardInterrupt), registry.open_run(tmp_path, "train") as run:
        raise KeyboardInterrupt
    assert registry.read_record(run.dir).status == "interrupted"


def test_stopped_by_limit(tmp_path):
    with pytest.raises(registry.StoppedByLimit), registry.open_run(tmp_path, "train") as run:
        raise registry.StoppedByLimit("time cap reached")
    assert registry.read_record(run.dir).status == "stopped_by_limit"


def test_distinct_ids_and_listing_order(tmp_path):
    ids = []
    for _ in range(5):
        with registry.open_run(tmp_path, "data") as run:
            ids.append(run.id)
    assert len(set(ids)) == 5
    assert [r.id for r in registry.list_runs(tmp_path)] == sorted(
        ids, key=lambda i: (registry.get_run(tmp_path, i).started_at, i)
    )
    assert registry.latest_run(tmp_path, "data").id == registry.list_runs(tmp_path)[-1].id


def test_torn_record_is_skipped(tmp_path):
    with registry.open_run(tmp_path, "data"):
        pass
    bad = tmp_path / "runs" / "data-20260101-000000-abcdef"
    bad.mkdir()
    (bad / "run.json").write_text('{"id": "data-2026')
    assert len(registry.list_runs(tmp_path)) == 1


@pytest.mark.parametrize(
    "rid", ["../x", "/etc", "train-1-2-3", "train-20260101-000000-abcdef/../../x"]
)
def test_run_ids_cannot_escape(rid, tmp_path):
    with pytest.raises(UsageError):
        registry.get_run(tmp_path, rid)


def _child(tmp_path, *, install_nothing=False):
    code = textwrap.dedent(f"""
        import time, sys
        from lorapilot.records import registry
        with registry.open_run({str(tmp_path)!r}, "probe") as run:
            print(run.id, flush=True)
            time.sleep(60)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_sigterm_marks_interrupted(tmp_path):
    proc = _child(tmp_path)
    run_id = proc.stdout.readline().strip()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    rec = registry.get_run(tmp_path, run_id)
    assert rec.status == "interrupted" and "SIGTERM" in rec.error


def test_sigkill_leaves_running_and_listing_says_interrupted(tmp_path):
    proc = _child(tmp_path)
    run_id = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=20)
    raw = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    assert raw["status"] == "running"  # the file is as the killed process left it
    (listed,) = registry.list_runs(tmp_path)
    assert listed.status == "interrupted"


def test_a_live_run_is_still_running(tmp_path):
    proc = _child(tmp_path)
    try:
        proc.stdout.readline()
        time.sleep(0.1)
        (listed,) = registry.list_runs(tmp_path)
        assert listed.status == "running"
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_while_the_record_is_first_written_still_closes_it_as_interrupted(
    tmp_path, monkeypatch
):
    """The SIGTERM handler is in place before run.json exists: a signal that lands as the
    record is first written closes the run as interrupted. (Before, it landed in the gap
    between writing run.json and installing the handler and killed the process, leaving a
    "running" record; here a test handler stands in for that death.)"""
    died = []
    previous = signal.signal(signal.SIGTERM, lambda *a: died.append(True))
    real_save = registry.RunHandle.save
    calls = []

    def save(self):
        real_save(self)
        calls.append(self.record.status)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(registry.RunHandle, "save", save)
    try:
        with (
            pytest.raises(registry.Interrupted, match="SIGTERM"),
            registry.open_run(tmp_path, "data"),
        ):
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not died
    (rec,) = registry.list_runs(tmp_path)
    assert rec.status == "interrupted" and calls == ["running", "interrupted"]


def test_a_sigterm_whose_exception_was_swallowed_still_ends_the_run_as_interrupted(tmp_path):
    """Python swallows an exception a signal handler raises inside a weakref callback or an
    import lock's cleanup ("Exception ignored in ..."; seen when a SIGTERM landed during
    `baseline`'s imports, which then completed with exit 0). The run still ends interrupted."""

    class Swallows:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here; Python ignores it

    with (
        pytest.raises(registry.Interrupted, match="SIGTERM"),
        registry.open_run(tmp_path, "data") as run,
    ):
        Swallows()  # collected at once: __del__ runs, its exception goes nowhere
        run.update(after="the signal")  # the body goes on to its end
    (rec,) = registry.list_runs(tmp_path)
    assert rec.status == "interrupted" and rec.result["after"] == "the signal"


def test_a_sigterm_wrapped_by_an_import_still_ends_the_run_as_interrupted(tmp_path):
    """A SIGTERM landing while a class body is created (a module being imported: CI saw it in
    `baseline`'s `cached_property` on TextModality) comes out as RuntimeError("Error calling
    __set_name__ ..."); the run ends interrupted and the verb gets `Interrupted` (exit 143)."""

    class Signals:
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGTERM)

    with (
        pytest.raises(registry.Interrupted, match="SIGTERM") as raised,
        registry.open_run(tmp_path, "baseline"),
    ):

        class Modality:  # noqa: F841 - created for its __set_name__
            tokenizer = Signals()

    assert isinstance(raised.value.__cause__, RuntimeError)
    (rec,) = registry.list_runs(tmp_path)
    assert rec.status == "interrupted" and rec.error == "received signal SIGTERM"
