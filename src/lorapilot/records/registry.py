"""Run records: `<pilot>/runs/<run_id>/run.json`, the source of truth of a pilot.

Every computing verb opens a run with `open_run(...)`. The record is written atomically at
creation (`running`) and again at the end: `completed`, `failed` (with the error text),
`interrupted` (Ctrl-C / SIGTERM) or `stopped_by_limit`. A process killed with SIGKILL leaves
`running` with its pid; `list_runs` reports such a record as `interrupted` once the pid is
gone on the same host, without rewriting it (the files stay exactly as the process left them).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import secrets
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from lorapilot.errors import LorapilotError, UsageError
from lorapilot.fsutil import atomic_write_json

Status = Literal["running", "completed", "failed", "interrupted", "stopped_by_limit"]
RUNS_DIR = "runs"
RUN_ID_RE = re.compile(r"^[a-z]+-\d{8}-\d{6}-[0-9a-f]{6}$")
SCHEMA_VERSION = 1


class RunRecord(BaseModel):
    """One run of one verb. `result` holds the verb's own output (metrics, audit, ...)."""

    schema_version: int = SCHEMA_VERSION
    id: str
    kind: str
    parent: str | None = None
    status: Status = "running"
    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    pid: int
    host: str
    pilot: str
    spec_hash: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="Fully resolved spec.")
    variant: dict[str, Any] | None = None
    data_version: str | None = None
    error: str | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] = Field(default_factory=dict)


class StoppedByLimit(LorapilotError):
    """Raised inside a run to end it gracefully at a time/cost cap (status stopped_by_limit)."""

    exit_code = 0


class Interrupted(BaseException):
    """SIGTERM turned into an exception so `finally` blocks and the record update run."""


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def runs_dir(pilot_dir: Path) -> Path:
    """`<pilot>/runs`. lorapilot writes only inside the pilot folder, so a `runs` that leads
    out of it (a symlink to elsewhere) is refused rather than followed."""
    pilot_dir = Path(pilot_dir)
    path = pilot_dir / RUNS_DIR
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(pilot_dir.resolve()):
            raise UsageError(
                f"{path} is a symlink to {target}, outside the pilot folder; lorapilot writes "
                "run records only inside the pilot folder: make runs a real folder"
            )
    return path


def new_run_dir(pilot_dir: Path, kind: str) -> tuple[str, Path]:
    """Create a fresh run folder. mkdir is atomic, so concurrent runs never share an id."""
    root = runs_dir(pilot_dir)
    root.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        run_id = f"{kind}-{stamp}-{secrets.token_hex(3)}"
        path = root / run_id
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return run_id, path
    raise LorapilotError(f"{root}: could not allocate a unique run id")


def write_record(run_dir: Path, record: RunRecord) -> None:
    atomic_write_json(Path(run_dir) / "run.json", record.model_dump(mode="json"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def effective_status(record: RunRecord) -> Status:
    """`running` whose process is gone (same host) is reported as `interrupted`; a check
    recorded as `completed` with `ok: false` before checks closed as failed (a smoke that
    could not memorise) is reported as `failed`."""
    if record.status == "completed" and record.kind == "smoke" and record.result.get("ok") is False:
        return "failed"
    if (
        record.status == "running"
        and record.host == socket.gethostname()
        and not _pid_alive(record.pid)
    ):
        return "interrupted"
    return record.status


def read_record(run_dir: Path) -> RunRecord | None:
    """A record that cannot be parsed (torn by an old crash) is skipped, never fatal."""
    path = Path(run_dir) / "run.json"
    try:
        return RunRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def list_runs(pilot_dir: Path, kind: str | None = None) -> list[RunRecord]:
    """All records, oldest first, with dead `running` ones shown as `interrupted`."""
    root = runs_dir(pilot_dir)
    out: list[RunRecord] = []
    if not root.is_dir():
        return out
    for child in root.iterdir():
        if not child.is_dir():
            continue
        rec = read_record(child)
        if rec is None or (kind and rec.kind != kind):
            continue
        status = effective_status(rec)
        if status != rec.status:
            rec = rec.model_copy(
                update={
                    "status": status,
                    "error": rec.error
                    or (
                        "the check did not pass (ok: false)"
                        if status == "failed"
                        else "process ended without closing the run (killed?)"
                    ),
                }
            )
        out.append(rec)
    out.sort(key=lambda r: (r.started_at, r.id))
    return out


def check_run_id(run_id: str) -> str:
    """Run ids reach paths: only the generated shape is accepted (no `../`, no `/`)."""
    if not RUN_ID_RE.match(run_id):
        raise UsageError(
            f"--run {run_id!r}: not a run id (expected e.g. train-20260101-120000-a1b2c3)"
        )
    return run_id


def get_run(pilot_dir: Path, run_id: str) -> RunRecord:
    check_run_id(run_id)
    if (runs_dir(pilot_dir) / run_id).is_symlink():  # a resume would write through it
        raise UsageError(
            f"{runs_dir(pilot_dir) / run_id} is a symlink; a run folder must be a real folder"
        )
    rec = read_record(runs_dir(pilot_dir) / run_id)
    if rec is None:
        raise UsageError(f"{runs_dir(pilot_dir) / run_id}: no such run (see `lorapilot runs`)")
    return rec


def latest_run(
    pilot_dir: Path,
    kind: str,
    status: str = "completed",
    where: Callable[[RunRecord], bool] | None = None,
) -> RunRecord | None:
    """The latest run of `kind` with `status` (and for which `where` holds)."""
    runs = [
        r for r in list_runs(pilot_dir, kind) if r.status == status and (where is None or where(r))
    ]
    return runs[-1] if runs else None


def is_linear_probe(rec: RunRecord) -> bool:
    """A baseline run of a logistic regression on the base's features (`baseline
    --linear-probe`): the embedding-classifier alternative, never the zero-shot baseline."""
    return bool(rec.result.get("linear_probe"))


def is_alternative(rec: RunRecord) -> bool:
    """A baseline run that is an alternative to adapting (few-shot prompt, linear probe), set
    beside the adapter, not the baseline the success criterion names."""
    return is_few_shot(rec) or is_linear_probe(rec)


def is_few_shot(rec: RunRecord) -> bool:
    """A baseline run of the base prompted with training examples (`baseline --shots`): the
    prompting alternative, never the zero-shot baseline the success criterion names."""
    return bool(rec.result.get("shots"))


class RunHandle:
    """What a stage function gets: the run folder, the record, and a way to save progress."""

    def __init__(self, pilot_dir: Path, run_dir: Path, record: RunRecord, write: bool = True):
        self.pilot_dir = pilot_dir
        self.dir = run_dir
        self.record = record
        self.write = write  # False: another process owns the files (a non-zero DDP rank)
        self.check_failed: str | None = None

    @property
    def id(self) -> str:
        return self.record.id

    def save(self) -> None:
        if self.write:
            write_record(self.dir, self.record)

    def update(self, **result: Any) -> None:
        """Merge keys into `result` and write the record now (partial results survive a kill)."""
        self.record.result.update(result)
        self.save()

    def fail_check(self, reason: str) -> None:
        """Close this run as `failed` with `reason` although nothing raised: a check that ran
        to its end and did not pass (a smoke that could not memorise)."""
        self.check_failed = reason


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[list[str]]:
    """SIGTERM raises `Interrupted`; the signals received are listed in what it yields.

    Python swallows an exception raised where it cannot propagate (a weakref callback, a
    `__del__`, an import lock's cleanup: "Exception ignored in ..."), and the verb would go
    on to complete as if no signal came; the list lets the caller end it as interrupted."""
    received: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        received.append(signal.Signals(signum).name)
        raise Interrupted(f"received signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def open_run(
    pilot_dir: Path,
    kind: str,
    *,
    spec_hash: str | None = None,
    config: dict | None = None,
    parent: str | None = None,
    environment: dict | None = None,
    run_id: str | None = None,
    write: bool = True,
    on_close: Callable[[Path, RunRecord], None] | None = None,
) -> Iterator[RunHandle]:
    """Create (or, with `run_id`, reopen for resume) a run and close it with the right status.

    Exceptions propagate after the record is written: failed (exception), interrupted
    (Ctrl-C/SIGTERM), stopped_by_limit (StoppedByLimit, which the caller treats as success).
    `on_close(run_dir, record)` is called after the closed record is saved (the steps pass
    tracking.mirror_on_close, so this lowest layer never imports a tracker); it must not raise.

    `write=False` (with the `run_id` another process created) follows that run without
    touching the disk: the record lives in memory only. Non-zero ranks of a distributed
    launch use it, so that only rank 0 creates and writes the run.
    """
    pilot_dir = Path(pilot_dir)
    # SIGTERM becomes an exception before run.json exists: a signal arriving as the record is
    # written must close it as interrupted, not kill the process with the record "running".
    with _sigterm_as_exception() as signals:
        if not write or run_id is None:  # a new record: followed (write=False) or created
            if write:
                run_id, run_dir = new_run_dir(pilot_dir, kind)
            elif run_id is None:
                raise ValueError("open_run(write=False) needs the run_id of the run it follows")
            else:
                run_dir = runs_dir(pilot_dir) / check_run_id(run_id)
            record = RunRecord(
                id=run_id,
                kind=kind,
                parent=parent,
                started_at=now_iso(),
                pid=os.getpid(),
                host=socket.gethostname(),
                pilot=str(pilot_dir),
                spec_hash=spec_hash,
                config=config or {},
                environment=environment or {},
            )
        else:
            record = get_run(pilot_dir, run_id)
            run_dir = runs_dir(pilot_dir) / run_id
            record.status, record.error, record.ended_at = "running", None, None
            record.pid, record.host = os.getpid(), socket.gethostname()
            record.result.setdefault("resumes", []).append(now_iso())
        handle = RunHandle(pilot_dir, run_dir, record, write=write)
        t0 = dt.datetime.fromisoformat(record.started_at)

        def close(status: Status, error: str | None = None) -> None:
            record.status = status
            record.error = error
            record.ended_at = now_iso()
            record.duration_s = round(
                (dt.datetime.fromisoformat(record.ended_at) - t0).total_seconds(), 3
            )
            handle.save()
            if write and on_close is not None:
                on_close(run_dir, record)

        try:
            handle.save()  # inside: a signal right after the record is written still closes it
            yield handle
            if signals:  # its exception was swallowed where it was raised: interrupted still
                raise Interrupted(f"received signal {signals[0]}")
        except StoppedByLimit as e:
            close("stopped_by_limit", str(e))
            raise
        except (KeyboardInterrupt, Interrupted) as e:
            close("interrupted", str(e) or "interrupted by the user (Ctrl-C)")
            raise
        except BaseException as e:
            if signals:  # the signal's exception came out wrapped: a class body's __set_name__
                # (an import under way) re-raises it as RuntimeError; still an interruption
                close("interrupted", f"received signal {signals[0]}")
                raise Interrupted(f"received signal {signals[0]}") from e
            close("failed", f"{type(e).__name__}: {e}")
            raise
        else:
            if handle.check_failed:
                close("failed", handle.check_failed)
            else:
                close("completed")


def adapter_of(pilot_dir: Path, run_id: str | None) -> tuple[str, Path]:
    """(train run id, adapter folder) for --run, default the latest completed train run."""
    if run_id is None:
        rec = latest_run(pilot_dir, "train")
        if rec is None:
            raise UsageError(
                f"{pilot_dir}: no completed train run yet (run `lorapilot train` first or pass "
                "--run)"
            )
    else:
        rec = get_run(pilot_dir, run_id)
        if rec.kind != "train":
            raise UsageError(f"--run {run_id}: is a {rec.kind} run, not a train run")
        if rec.status != "completed":
            raise UsageError(
                f"--run {run_id}: has status {rec.status}; only a completed train run has a final "
                "adapter"
            )
    path = rec.result.get("adapter_path")
    if not path:
        raise UsageError(f"train run {rec.id} has no adapter_path in its record")
    return rec.id, Path(path)
