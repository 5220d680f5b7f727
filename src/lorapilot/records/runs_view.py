"""Views of the run records for `lorapilot runs`: CSV rows, and `--watch`, a live table of a
train run that follows its files.

The watcher reads only what the run writes anyway: `run.json` for the status (replaced
atomically) and `steps.jsonl` (one line appended per optimizer step). It never writes and
never talks to the training process, so it works from another shell, over ssh, or on a pilot
folder being synced back; it stops by itself once the status is no longer `running`.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from lorapilot.errors import UsageError
from lorapilot.records import registry
from lorapilot.records.progress import format_gib

# The columns of `runs --format csv`, in this order; adding one is fine, renaming is not.
CSV_COLUMNS = (
    "id",
    "kind",
    "status",
    "parent",
    "started_at",
    "ended_at",
    "duration_s",
    "data_version",
    "variant",
    "error",
    "variant_name",
)
STEP_COLUMNS = ("step", "loss", "lr", "grad norm", "tokens/s", "step time", "peak mem")
STATUS_COLOUR = {
    "completed": "green",
    "failed": "red",
    "interrupted": "yellow",
    "running": "cyan",
    "stopped_by_limit": "magenta",
}


def runs_csv(rows: list[dict[str, Any]]) -> str:
    """One line per run under a fixed header; None is an empty cell, quoting as csv does."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r[k] for k in CSV_COLUMNS})
    return buf.getvalue()


# --------------------------------------------------------------------------- steps -> rows (pure)


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def tokens_per_s(step: dict) -> float | None:
    t, s = step.get("tokens"), step.get("step_time_s")
    return t / s if isinstance(t, (int, float)) and isinstance(s, (int, float)) and s > 0 else None


def step_rows(steps: list[dict], last: int = 15) -> list[tuple[str, ...]]:
    """The last `last` step records of steps.jsonl as display strings, in STEP_COLUMNS order."""
    rows = []
    for s in steps[-last:] if last > 0 else []:
        mem = s.get("peak_memory_bytes")
        rows.append(
            (
                _num(s.get("step"), "d"),
                _num(s.get("loss"), ".4f"),
                _num(s.get("lr"), ".2e"),
                _num(s.get("grad_norm"), ".3f"),
                _num(tokens_per_s(s), ",.0f"),
                _num(s.get("step_time_s"), ".2f")
                + ("s" if isinstance(s.get("step_time_s"), (int, float)) else ""),
                format_gib(mem) if isinstance(mem, (int, float)) and mem > 0 else "-",
            )
        )
    return rows


def run_summary(
    record: registry.RunRecord, steps: list[dict], now: float | None = None
) -> dict[str, Any]:
    """What the watcher says about the run besides the table (also the `--json` result)."""
    planned = ((record.config or {}).get("train") or {}).get("max_steps")
    if record.kind == "smoke":
        planned = None
    if record.duration_s is not None:
        elapsed = record.duration_s
    else:
        started = dt.datetime.fromisoformat(record.started_at).timestamp()
        elapsed = max(0.0, (now if now is not None else time.time()) - started)
    recent = [x for x in (tokens_per_s(s) for s in steps[-10:]) if x is not None]
    return {
        "run_id": record.id,
        "kind": record.kind,
        "status": record.status,
        "steps_done": steps[-1].get("step") if steps else 0,
        "steps_planned": planned,
        "elapsed_s": round(elapsed, 1),
        "tokens_per_s_recent": round(sum(recent) / len(recent), 1) if recent else None,
        "last_step": steps[-1] if steps else None,
        "error": record.error,
    }


def render(summary: dict[str, Any], steps: list[dict], last: int = 15) -> Table:
    """The live table: the last steps, with the run's status in the title."""
    colour = STATUS_COLOUR.get(summary["status"], "white")
    done, planned = summary["steps_done"], summary["steps_planned"]
    progress = f"step {done}/{planned}" if planned else f"step {done}"
    t = Table(
        title=f"{summary['run_id']}  [{colour}]{summary['status']}[/]  {progress}  "
        f"{summary['elapsed_s']:.0f} s",
        title_justify="left",
    )
    for col in STEP_COLUMNS:
        t.add_column(col, justify="right")
    for row in step_rows(steps, last):
        t.add_row(*row)
    tps = summary["tokens_per_s_recent"]
    notes = []
    if tps is not None:
        notes.append(f"{tps:,.0f} tokens/s over the last {min(len(steps), 10)} steps")
    if not steps:
        notes.append("no step written yet")
    if summary["error"]:
        notes.append(escape(str(summary["error"])[:200]))  # user text, not markup
    t.caption = "; ".join(notes) or None
    return t


# --------------------------------------------------------------------------- files -> steps


class StepTail:
    """steps.jsonl read incrementally: only new complete lines are parsed on each poll. A
    torn last line waits for its newline; a rewritten file (a resume trims it) is re-read."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.steps: list[dict] = []
        self._offset = 0
        self._inode: int | None = None

    def poll(self) -> bool:
        """Read what was appended since the last poll; True when `steps` changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        changed = False
        if st.st_ino != self._inode or st.st_size < self._offset:
            self.steps, self._offset, self._inode, changed = [], 0, st.st_ino, bool(self.steps)
        if st.st_size == self._offset:
            return changed
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(st.st_size - self._offset)
        end = chunk.rfind(b"\n")
        if end < 0:
            return changed
        self._offset += end + 1
        for line in chunk[:end].splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self.steps.append(obj)
                changed = True
        return changed


def pick_run(pilot_dir: Path, run_id: str | None) -> registry.RunRecord:
    """`--run`, else the train run that is running now, else the latest train run."""
    if run_id:
        rec = registry.get_run(pilot_dir, run_id)
        status = registry.effective_status(rec)  # a dead `running` one is `interrupted`, as listed
        return rec if status == rec.status else rec.model_copy(update={"status": status})
    runs = registry.list_runs(pilot_dir, "train")
    running = [r for r in runs if r.status == "running"]
    if running:
        return running[-1]
    if runs:
        return runs[-1]
    raise UsageError(
        f"{registry.runs_dir(pilot_dir)}: no train run to watch; start one with "
        "`lorapilot train PILOT` (or name a run with --run)"
    )


def watch(
    pilot_dir: Path,
    run_id: str | None,
    console: Console,
    *,
    interval: float = 1.0,
    last: int = 15,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Show the run's latest steps until its status is no longer `running`; a finished run is
    shown once. Returns the final summary."""
    record = pick_run(pilot_dir, run_id)
    run_dir = registry.runs_dir(pilot_dir) / record.id
    tail = StepTail(run_dir / "steps.jsonl")
    tail.poll()
    summary = run_summary(record, tail.steps)
    if record.status != "running":
        console.print(render(summary, tail.steps, last))
        return summary
    if not console.is_terminal:  # a file or a pipe: one plain line per new step, then the table
        return _watch_plain(record, run_dir, tail, console, interval, last, sleep)
    with Live(
        render(summary, tail.steps, last),
        console=console,
        auto_refresh=False,
        redirect_stdout=False,
        redirect_stderr=False,
    ) as live:
        while record.status == "running":
            sleep(interval)
            record = _refresh(record, run_dir, tail)
            summary = run_summary(record, tail.steps)
            live.update(render(summary, tail.steps, last), refresh=True)
    return summary


def step_line(step: dict) -> str:
    """One step as a plain line, for a watcher whose output is not a terminal."""
    row = dict(zip(STEP_COLUMNS, step_rows([step], last=1)[0], strict=True))
    return "  ".join(f"{k} {v}" for k, v in row.items())


def _refresh(record: registry.RunRecord, run_dir: Path, tail: StepTail) -> registry.RunRecord:
    """New steps read, and the record as it is now (the last one if it cannot be read)."""
    tail.poll()
    fresh = registry.read_record(run_dir)  # None only if unreadable: keep the last one
    if fresh is None:
        return record
    return fresh.model_copy(update={"status": registry.effective_status(fresh)})


def _watch_plain(
    record: registry.RunRecord,
    run_dir: Path,
    tail: StepTail,
    console: Console,
    interval: float,
    last: int,
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    """`runs --watch > file`: a live table would print nothing until the end; lines do."""
    shown = 0
    while True:
        shown = min(shown, len(tail.steps))  # a resume trimmed the file: go on from there
        for s in tail.steps[shown:]:
            console.print(escape(step_line(s)))
        shown = len(tail.steps)
        if record.status != "running":
            break
        sleep(interval)
        record = _refresh(record, run_dir, tail)
    summary = run_summary(record, tail.steps)
    console.print(render(summary, tail.steps, last))
    return summary
