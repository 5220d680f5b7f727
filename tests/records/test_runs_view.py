"""`lorapilot runs --format table|json|csv` and `runs --watch`: the rows, the CSV, the
incremental steps.jsonl reader, and the watcher on finished and live runs."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
import time

import pytest
from conftest import run_cli, run_json

from lorapilot.fsutil import append_jsonl, atomic_write_text
from lorapilot.records import registry
from lorapilot.records.runs_view import (
    CSV_COLUMNS,
    StepTail,
    render,
    run_summary,
    runs_csv,
    step_rows,
    watch,
)


def _step(n: int, **kw) -> dict:
    return {
        "step": n,
        "epoch": n / 10,
        "loss": 2.0 / n,
        "lr": 3e-4,
        "grad_norm": 0.5,
        "tokens": 2000,
        "target_tokens": 40,
        "step_time_s": 0.5,
        "peak_memory_bytes": 3 * 2**30,
        "time": 0.0,
    } | kw


@pytest.fixture
def pilot(tmp_path):
    (tmp_path / "pilot.yaml").write_text("name: x\n")  # `runs` only needs the folder and its runs/
    return tmp_path


def _finished_train(pilot, n_steps: int = 3, fail: str | None = None) -> str:
    """A closed train run with `n_steps` step records: completed, or failed with `fail`."""
    with (
        contextlib.suppress(RuntimeError),
        registry.open_run(pilot, "train", config={"train": {"max_steps": n_steps}}) as run,
    ):
        for i in range(1, n_steps + 1):
            append_jsonl(run.dir / "steps.jsonl", _step(i))
        if fail:
            raise RuntimeError(fail)
    return run.id


# --------------------------------------------------------------------------- pure parts


def test_step_rows_format_the_last_steps():
    steps = [_step(i) for i in range(1, 21)] + [{"step": 21}]
    rows = step_rows(steps, last=3)
    assert rows[0] == ("19", "0.1053", "3.00e-04", "0.500", "4,000", "0.50s", "3.00 GiB")
    assert rows[-1] == ("21", "-", "-", "-", "-", "-", "-")  # a record missing fields still shows
    assert len(rows) == 3 and step_rows([], 5) == []


def test_summary_and_render(pilot):
    run_id = _finished_train(pilot, 4)
    rec = registry.get_run(pilot, run_id)
    steps = [_step(i) for i in range(1, 5)]
    s = run_summary(rec, steps)
    assert (s["run_id"], s["status"], s["steps_done"], s["steps_planned"]) == (
        run_id,
        "completed",
        4,
        4,
    )
    assert s["tokens_per_s_recent"] == 4000.0 and s["last_step"]["step"] == 4
    table = render(s, steps, last=2)
    assert (
        table.row_count == 2 and "step 4/4" in str(table.title) and "completed" in str(table.title)
    )


def test_step_tail_reads_only_complete_new_lines_and_follows_a_rewrite(tmp_path):
    path = tmp_path / "steps.jsonl"
    tail = StepTail(path)
    assert tail.poll() is False and tail.steps == []  # no file yet
    append_jsonl(path, _step(1))
    with open(path, "ab") as f:
        f.write(b'{"step": 2, "loss"')  # a torn line: the writer is mid-write
    assert tail.poll() is True and [s["step"] for s in tail.steps] == [1]
    with open(path, "ab") as f:
        f.write(b": 0.5}\n")
    assert tail.poll() is True and [s["step"] for s in tail.steps] == [1, 2]
    assert tail.poll() is False
    atomic_write_text(
        path, json.dumps(_step(1)) + "\n"
    )  # a resume trims the file to its checkpoint
    assert tail.poll() is True and [s["step"] for s in tail.steps] == [1]


def test_runs_csv_quotes_and_keeps_its_columns():
    rows = [
        {
            "id": "train-1",
            "kind": "train",
            "status": "failed",
            "duration_s": 1.5,
            "error": 'ValueError: bad "x", then\na second line',
            "parent": None,
            "extra": "ignored",
        }
    ]
    text = runs_csv(rows)
    parsed = list(csv.reader(io.StringIO(text)))
    assert tuple(parsed[0]) == CSV_COLUMNS
    assert parsed[1][CSV_COLUMNS.index("error")] == 'ValueError: bad "x", then\na second line'
    assert (
        parsed[1][CSV_COLUMNS.index("parent")] == ""
        and parsed[1][CSV_COLUMNS.index("duration_s")] == "1.5"
    )
    assert runs_csv([]) == ",".join(CSV_COLUMNS) + "\n"


# --------------------------------------------------------------------------- the verb


def test_runs_formats(pilot):
    a = _finished_train(pilot, 2)
    b = _finished_train(pilot, 1, fail='bad, "quoted"\nvalue')
    as_json = run_json("runs", str(pilot))
    fmt_json = run_cli("runs", str(pilot), "--format", "json")
    assert fmt_json.returncode == 0 and json.loads(fmt_json.stdout) == as_json
    assert [r["id"] for r in as_json["runs"]] == [a, b]
    out = run_cli("runs", str(pilot), "--format", "csv")
    assert out.returncode == 0 and out.stderr == ""
    parsed = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["id"] for r in parsed] == [a, b] and parsed[1]["status"] == "failed"
    assert parsed[1]["error"] == 'RuntimeError: bad, "quoted"\nvalue'
    table = run_cli("runs", str(pilot), "--format", "table")
    assert table.returncode == 0 and a in table.stdout
    for bad, msg in (
        (["--format", "xml"], "expected table, json or csv"),
        (["--format", "csv", "--json"], "both claim stdout"),
        (["--run", a], "add --watch"),
    ):
        proc = run_cli("runs", str(pilot), *bad)
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr


def test_watch_a_finished_run_prints_once_and_exits_0(pilot):
    run_id = _finished_train(pilot, 3)
    t0 = time.monotonic()
    proc = run_cli("runs", str(pilot), "--watch", "--interval", "5", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 30  # no waiting for a refresh
    assert run_id in proc.stdout and "completed" in proc.stdout and "0.6667" in proc.stdout
    out = run_json("runs", str(pilot), "--watch", "--run", run_id)
    assert out["status"] == "completed" and out["steps_done"] == 3 and out["last_step"]["step"] == 3


def test_watch_without_a_train_run_is_a_usage_error(pilot):
    out = run_json("runs", str(pilot), "--watch", expect=2)
    assert "no train run to watch" in out["error"]


def test_watch_follows_a_live_run_until_it_completes(pilot):
    """A run is open (status running, this process alive) while a watcher subprocess follows
    it; steps arrive, then the run closes as completed and the watcher exits by itself."""
    with registry.open_run(pilot, "train", config={"train": {"max_steps": 4}}) as run:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lorapilot",
                "runs",
                str(pilot),
                "--watch",
                "--json",
                "--interval",
                "0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for i in range(1, 5):
                append_jsonl(run.dir / "steps.jsonl", _step(i))
                time.sleep(0.3)
            time.sleep(1.0)
            assert proc.poll() is None, "the watcher stopped while the run was still running"
        except BaseException:
            proc.kill()
            raise
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout)
    assert (out["run_id"], out["status"], out["steps_done"], out["steps_planned"]) == (
        run.id,
        "completed",
        4,
        4,
    )
    assert run.id in stderr  # the live table went to stderr, stdout held only the JSON


def test_watch_in_process_sees_the_status_flip(pilot):
    """The same with an injected sleep: each refresh appends a step; the third closes the run."""
    from rich.console import Console

    run_id, run_dir = registry.new_run_dir(pilot, "train")
    rec = registry.RunRecord(
        id=run_id,
        kind="train",
        started_at=registry.now_iso(),
        pid=0,
        host="elsewhere",
        pilot=str(pilot),
    )  # another host: its pid cannot be checked, it stays running
    registry.write_record(run_dir, rec)
    calls = []

    def fake_sleep(seconds: float) -> None:
        calls.append(seconds)
        append_jsonl(run_dir / "steps.jsonl", _step(len(calls)))
        if len(calls) == 3:
            registry.write_record(
                run_dir, rec.model_copy(update={"status": "failed", "error": "OOM"})
            )

    console = Console(file=io.StringIO(), width=120)
    summary = watch(pilot, None, console, interval=0.25, sleep=fake_sleep)
    assert calls == [0.25, 0.25, 0.25]
    assert (summary["status"], summary["steps_done"], summary["error"]) == ("failed", 3, "OOM")
    # not a terminal: one plain line per step as it arrived, then the table
    text = console.file.getvalue()
    lines = [ln for ln in text.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in lines] == ["1", "2", "3"] and "loss" in lines[0]
