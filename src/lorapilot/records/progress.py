"""Progress of a long phase: a live bar on a terminal, plain lines in a log file or a pipe.

A bar redrawn in place is what a person at a terminal wants; written to a file or a pipe
(`lorapilot run PILOT > log.txt`, nohup, CI, a job scheduler) it is nothing until one final
frame. So a phase also writes a plain line through the step's log every `every` seconds, and
at its end, whenever that log does not go to a terminal: what is done, the loss, the rate,
the elapsed time and the ETA. The arithmetic is pure; `Phase` only decides what to show.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

EVERY_ENV = "LORAPILOT_PROGRESS_EVERY"  # seconds between plain lines (default 30)
DEFAULT_EVERY_S = 30.0


def format_gib(n_bytes: float | None) -> str:
    """ "1.23 GiB" (2^30 bytes), or "-" for a figure that was not measured: the console's one
    format for memory, as format_duration is for time."""
    return f"{n_bytes / (1 << 30):.2f} GiB" if isinstance(n_bytes, int | float) else "-"


def format_duration(seconds: float | None) -> str:
    """`45s`, `3m07s`, `2h05m`: short enough for a log line."""
    if seconds is None:
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(done: int, total: int, elapsed_s: float, start: int = 0) -> float | None:
    """Time left at this call's own rate (items done before a resume do not count)."""
    if done <= start or elapsed_s <= 0:
        return None
    return (total - done) * elapsed_s / (done - start)


def plain_line(
    label: str, done: int, total: int, elapsed_s: float, start: int = 0, **fields: str
) -> str:
    """`train: step 40/129 (31%) loss 0.5321 2,310 tok/s, elapsed 1m02s, ETA 2m18s`."""
    unit = "step " if label == "train" else ""
    pct = f" ({done / total:.0%})" if total else ""
    extra = "".join(f" {v}" for v in fields.values() if v)
    eta = format_duration(eta_seconds(done, total, elapsed_s, start))
    return (
        f"{label}: {unit}{done}/{total}{pct}{extra}, elapsed {format_duration(elapsed_s)}, "
        f"ETA {eta if done < total else '0s'}"
    )


def log_is_terminal(log: Callable[[str], None] | None) -> bool:
    """A log made by the CLI says where it writes (`is_terminal`); a plain callable such as
    `print` writes to stdout."""
    if log is None:
        return True
    flag = getattr(log, "is_terminal", None)
    if flag is not None:
        return bool(flag)
    try:
        return os.isatty(1)
    except OSError:
        return False


def plain_log(say: Callable[[str], None], bar_shown: bool = False) -> Callable[[str], None]:
    """`say` as a phase's log: a plain progress line every 30 s and at the end, unless a
    live bar already shows the phase."""

    def plain(line: str) -> None:
        say(line)

    plain.is_terminal = bar_shown  # type: ignore[attr-defined]
    return plain


def _every_s() -> float:
    try:
        return max(0.0, float(os.environ.get(EVERY_ENV, DEFAULT_EVERY_S)))
    except ValueError:
        return DEFAULT_EVERY_S


class Phase:
    """One long phase (training steps, examples evaluated): `advance` after each unit of
    work, `close` at the end (also on failure). `fields` are formatted strings shown after
    the count (`loss 0.53`, `2,310 tok/s`)."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        start: int = 0,
        bar: bool = True,
        log: Callable[[str], None] | None = None,
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        field_names: tuple[str, ...] = (),
    ):
        self.label, self.total, self.start, self.done = label, total, start, start
        self.clock, self.t0 = clock, clock()
        self.every_s = _every_s() if every_s is None else every_s
        self.log = log if log is not None and not log_is_terminal(log) else None
        self.last_line = self.t0
        self.fields: dict[str, str] = {k: "" for k in field_names}
        self._bar: Any = _rich_bar(label, total, start, field_names) if bar else None

    def advance(self, done: int | None = None, n: int = 1, **fields: str) -> None:
        self.done = done if done is not None else self.done + n
        self.fields.update(fields)
        if self._bar is not None:
            self._bar.update(self._bar.task_ids[0], completed=self.done, **self.fields)
        now = self.clock()
        if self.log is not None and (
            now - self.last_line >= self.every_s or self.done >= self.total
        ):
            self.last_line = now
            self.log(self.line())

    def line(self) -> str:
        return plain_line(
            self.label, self.done, self.total, self.clock() - self.t0, self.start, **self.fields
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rich_bar(label: str, total: int, start: int, field_names: tuple[str, ...]):
    """The live bar on stderr, when stderr is a terminal."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:  # in a file it would be one final frame: the lines say it
        return None
    bar = Progress(
        TextColumn(f"[bold]{label}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(f"{{task.fields[{name}]}}") for name in field_names),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=label != "train",
    )
    bar.start()
    bar.add_task(label, total=total, completed=start, **{k: "" for k in field_names})
    return bar
