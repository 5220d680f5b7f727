"""Read a data file (JSONL, CSV, Parquet; HF datasets via hf.py) into validated records.

Files are read in binary and decoded line by line, so one bad line (invalid UTF-8, a
megabyte of garbage, broken JSON) is reported with its line number instead of spoiling
the whole file. `data.on_error` decides whether the first bad record stops the load
(`fail`, exit 2 naming file:line) or is set aside and counted (`skip`).
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lorapilot.data.targets import category_of, is_text_target, json_type, target_validator
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, TaskSpec

MAX_LINE_BYTES = 1 << 20  # a longer line is refused before it is decoded or parsed
_BOM = b"\xef\xbb\xbf"
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_FORMATS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_MISSING = object()


@dataclass
class Record:
    """One valid example, as read (before cleaning)."""

    id: str
    text: str
    label: str | None  # classification only
    target: Any  # extraction/format: a JSON object (a string for a regex-only format task)
    source: str  # "file:line" (CSV: first line of the data row; Parquet: "file:row N")
    split: str | None  # set when the record comes from a pre-split file (or after splitting)
    category: str  # stratum for splitting and per-category metrics


@dataclass
class Skipped:
    """A record set aside under `on_error: skip`; `line` is the row number for Parquet."""

    file: str
    line: int
    problem: str


class _Bad(Exception):
    """A problem with one record: reported with its line, never escapes this module."""


def detect_format(path: Path, data: DataSpec) -> str:
    if data.format != "auto":
        return data.format
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"{path}: cannot tell the format from the extension {path.suffix!r}; "
            "set data.format to jsonl, csv or parquet"
        )
    return fmt


def load_records(
    path: Path,
    task: TaskSpec,
    data: DataSpec,
    split: str | None = None,
    display_path: str | None = None,
    key: str | None = None,
) -> tuple[list[Record], list[Skipped]]:
    """Read and validate every record of one file -> (valid records, skipped records).

    `display_path` is how the file is named in messages and `Record.source` (e.g. relative
    to the pilot folder); `key` is the spec key that named it. Under `skip`, a file whose
    records are all invalid returns no records and lets the caller judge; a file with no
    records at all is a UsageError. A folder written by `datasets`' save_to_disk is read
    through hf.py; a DatasetDict's records carry their split (train/val/test).
    """
    path = Path(path)
    shown = display_path or str(path)
    if not path.exists():
        raise UsageError(f"{shown}: no such data file")
    if path.is_dir() and data.format in ("auto", "datasets"):
        from lorapilot.data import hf  # `datasets` is an optional extra

        if hf.saved_kind(path):
            return hf.load_saved(path, task, data, split, shown, key or "data.file")
        raise UsageError(
            f"{shown}: not a file, nor a folder written by datasets' save_to_disk "
            f"(no {hf.DICT_META}, or {' and '.join(hf.DATASET_META)}, in it)"
        )
    if not path.is_file():
        raise UsageError(f"{shown}: not a file")
    fmt = detect_format(path, data)
    if fmt == "datasets":
        raise UsageError(
            f"{shown}: data.format is datasets, so this must be the folder save_to_disk wrote, not a file"
        )
    builder = _RecordBuilder(task, data, shown, path.stem, split, row_numbers=fmt == "parquet")
    try:
        if fmt == "jsonl":
            rows = _jsonl_rows(path)
        elif fmt == "csv":
            rows = _csv_rows(path, data, task, shown)
        else:
            rows = _parquet_rows(path, data, task, shown)
        return collect_rows(rows, builder, data, shown, row_numbers=fmt == "parquet")
    except OSError as e:
        raise UsageError(f"{shown}: cannot read: {e.strerror or e}") from None


def collect_rows(
    rows: Iterable[tuple[int, dict | _Bad]],
    builder: _RecordBuilder,
    data: DataSpec,
    shown: str,
    row_numbers: bool,
    empty: str = "no records in the file",
) -> tuple[list[Record], list[Skipped]]:
    """Build a record from every row, under data.on_error: the one validation path of every
    reader (files here, HF datasets in hf.py)."""
    records: list[Record] = []
    skipped: list[Skipped] = []
    seen_any = False
    for line, row in rows:
        seen_any = True
        try:
            if isinstance(row, _Bad):
                raise row
            records.append(builder.build(row, line))
        except (_Bad, RecursionError) as e:
            problem = str(e) if isinstance(e, _Bad) else "JSON nested too deeply"
            where = f"row {line}" if row_numbers else str(line)
            if data.on_error == "fail":
                raise UsageError(f"{shown}:{where}: {problem}") from None
            skipped.append(Skipped(shown, line, problem))
    if not seen_any:
        raise UsageError(f"{shown}: {empty}")
    return records, skipped


# --------------------------------------------------------------------------- one record


class _RecordBuilder:
    """Checks one raw row (column -> value) against the spec and builds its Record."""

    def __init__(
        self,
        task: TaskSpec,
        data: DataSpec,
        shown: str,
        stem: str,
        split: str | None,
        row_numbers: bool,
    ):
        self.task = task
        self.row_numbers = row_numbers  # Parquet records have rows, not lines
        self.fields = data.fields
        self.shown = shown
        self.stem = stem
        self.split = split
        self.text_target = is_text_target(task)
        self.check_target: Callable[[Any], list[str]] | None = (
            None if task.kind == "classification" else target_validator(task)
        )
        self.labels = set(task.labels or [])
        self.seen: dict[str, str] = {}

    def build(self, row: dict, line: int) -> Record:
        fm = self.fields
        text = row.get(fm.text, _MISSING)
        if text is _MISSING or text is None:
            raise _Bad(f"missing field {fm.text!r}")
        if not isinstance(text, str):
            raise _Bad(f"field {fm.text!r} must be a string, got {json_type(text)}")
        if not text.strip():
            raise _Bad(f"field {fm.text!r} is empty")
        if "\x00" in text:
            raise _Bad(f"field {fm.text!r} contains a NUL byte")
        if len(text) > MAX_LINE_BYTES:
            raise _Bad(
                f"field {fm.text!r} is too long ({len(text)} characters, max {MAX_LINE_BYTES})"
            )
        _no_surrogates(text, fm.text)

        label = None
        target = None
        if self.task.kind == "classification":
            label = self._label(row.get(fm.label, _MISSING))
        else:
            target = self._target(row.get(fm.target, _MISSING))

        rid = self._id(row, line)
        source = f"{self.shown}:row {line}" if self.row_numbers else f"{self.shown}:{line}"
        first = self.seen.get(rid)
        if first is not None:
            raise _Bad(f"duplicate id {_show(rid)} (first at {first})")
        self.seen[rid] = source
        return Record(
            id=rid,
            text=text,
            label=label,
            target=target,
            source=source,
            split=self.split,
            category=category_of(label, target, self.task),
        )

    def _label(self, label: Any) -> str:
        name = self.fields.label
        if label is _MISSING or label is None:
            raise _Bad(f"missing field {name!r}")
        if not isinstance(label, str):
            raise _Bad(f"field {name!r} must be a string, got {json_type(label)}")
        if label not in self.labels:
            allowed = ", ".join(self.task.labels or [])
            raise _Bad(f"label {_show(label)} is not one of the task labels ({allowed})")
        return label

    def _target(self, target: Any) -> Any:
        name = self.fields.target
        if target is _MISSING or target is None:
            raise _Bad(f"missing field {name!r}")
        if isinstance(target, str) and not self.text_target:
            # CSV cells and Parquet string columns carry the object as JSON text.
            try:
                target = json.loads(target, parse_constant=_no_constant)
            except ValueError as e:
                raise _Bad(f"field {name!r} is not valid JSON: {_json_message(e)}") from None
        if not self.text_target and not isinstance(target, dict):
            raise _Bad(f"field {name!r} must be a JSON object, got {json_type(target)}")
        try:
            json.dumps(target, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _Bad(
                f"field {name!r} contains an unpaired surrogate escape (not valid Unicode)"
            ) from None
        except (TypeError, ValueError) as e:
            raise _Bad(f"field {name!r} is not JSON data: {e}") from None
        assert self.check_target is not None
        problems = self.check_target(target)
        if problems:
            raise _Bad("; ".join(problems))
        return target

    def _id(self, row: dict, line: int) -> str:
        name = self.fields.id
        rid = row.get(name, _MISSING) if name else _MISSING
        if rid is _MISSING or rid is None:
            return f"{self.stem}-{line}"
        if isinstance(rid, int) and not isinstance(rid, bool):
            return str(rid)
        if not isinstance(rid, str):
            raise _Bad(f"field {name!r} must be a string or an integer, got {json_type(rid)}")
        if not rid.strip():
            raise _Bad(f"field {name!r} is empty")
        _no_surrogates(rid, name or "id")
        return rid


def _show(value: str, limit: int = 80) -> str:
    """repr, so control characters and trailing spaces are visible; cut to `limit` chars."""
    return repr(value[:limit]) + ("…" if len(value) > limit else "")


def _no_surrogates(value: str, name: str) -> None:
    m = _SURROGATE.search(value)
    if m:
        raise _Bad(
            f"field {name!r} contains an unpaired surrogate {m.group()!r} (not valid Unicode)"
        )


def _no_constant(name: str) -> Any:
    # NaN/Infinity are not JSON; they would break every JSON file written downstream.
    raise ValueError(f"{name} is not allowed in JSON")


def _json_message(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} (column {e.colno})"
    return str(e)


# --------------------------------------------------------------------------- readers


def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """(line number, raw line with its newline) or None for a line over MAX_LINE_BYTES.

    A too-long line is drained in chunks, never held whole in memory. A BOM at the start
    of the file is skipped before the first read, so it never counts towards line 1's
    length (counted, it made a line just over the limit read as two lines).
    """
    if f.read(len(_BOM)) != _BOM:
        f.seek(0)
    lineno = 0
    cap = MAX_LINE_BYTES + 3  # content + "\r\n" + 1 to tell "exactly at the limit" apart
    while True:
        chunk = f.readline(cap)
        if not chunk:
            return
        lineno += 1
        if len(chunk) == cap and not chunk.endswith(b"\n"):
            while True:
                rest = f.readline(1 << 16)
                if not rest or rest.endswith(b"\n"):
                    break
            yield lineno, None
        elif len(chunk.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            yield lineno, None
        else:
            yield lineno, chunk


def _too_long() -> _Bad:
    return _Bad(f"line too long (over {MAX_LINE_BYTES} bytes)")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict | _Bad]]:
    with path.open("rb") as f:
        for lineno, raw in _lines(f):
            if raw is None:
                yield lineno, _too_long()
                continue
            body = raw.strip()
            if not body:
                continue  # blank lines (e.g. a trailing one) are not records
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, _Bad(f"invalid UTF-8 (byte {e.start + 1} of the line)")
                continue
            try:
                obj = json.loads(text, parse_constant=_no_constant)
            except RecursionError:
                yield lineno, _Bad("JSON nested too deeply")
                continue
            except ValueError as e:
                hint = ""
                if lineno == 1 and text.startswith("["):
                    hint = "; expected JSON Lines: one JSON object per line, not a JSON array"
                yield lineno, _Bad(f"invalid JSON: {_json_message(e)}{hint}")
                continue
            if not isinstance(obj, dict):
                yield lineno, _Bad(f"record is not a JSON object (got {json_type(obj)})")
                continue
            yield lineno, obj


def _needed_columns(data: DataSpec, task: TaskSpec) -> list[str]:
    fm = data.fields
    return [fm.text, fm.label if task.kind == "classification" else fm.target]


def _csv_rows(
    path: Path, data: DataSpec, task: TaskSpec, shown: str
) -> Iterator[tuple[int, dict | _Bad]]:
    """CSV with a header row; a quoted cell may span lines, so a row has its first line."""
    # The csv module's default cell limit (128 KiB) is below our line limit; a long text
    # would otherwise fail with a confusing "field larger than field limit".
    if csv.field_size_limit() < 4 * MAX_LINE_BYTES:
        csv.field_size_limit(4 * MAX_LINE_BYTES)
    too_long: set[int] = set()
    bad_utf8: dict[int, int] = {}

    def text_lines(f: IO[bytes]) -> Iterator[str]:
        for lineno, raw in _lines(f):
            if raw is None:
                too_long.add(lineno)
                yield "\n"
                continue
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad_utf8[lineno] = e.start + 1
                yield raw.decode("utf-8", errors="replace")

    with path.open("rb") as f:
        reader = csv.reader(text_lines(f))
        try:
            header = next(reader, None)
        except csv.Error as e:
            raise UsageError(f"{shown}:1: cannot read the CSV header: {e}") from None
        if header is None:
            return
        if too_long or bad_utf8:
            problem = "line too long" if too_long else "invalid UTF-8"
            raise UsageError(f"{shown}:1: cannot read the CSV header: {problem}")
        if len(set(header)) != len(header):
            dups = sorted({h for h in header if header.count(h) > 1})
            raise UsageError(f"{shown}:1: duplicate column names in the header: {dups}")
        for col in _needed_columns(data, task):
            if col not in header:
                raise UsageError(
                    f"{shown}:1: no column {col!r} (columns: {', '.join(header)}); "
                    "set data.fields to map your column names"
                )
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield start, _Bad(f"invalid CSV: {e}")
                continue
            end = reader.line_num
            lines = range(start, end + 1)
            long_here = [n for n in lines if n in too_long]
            if long_here:
                yield long_here[0], _too_long()
                continue
            bad_here = [n for n in lines if n in bad_utf8]
            if bad_here:
                n = bad_here[0]
                yield n, _Bad(f"invalid UTF-8 (byte {bad_utf8[n]} of the line)")
                continue
            if not row or (len(row) == 1 and not row[0].strip() and len(header) > 1):
                continue  # a blank line is not a record
            if len(row) != len(header):
                yield start, _Bad(f"has {len(row)} columns, the header has {len(header)}")
                continue
            # An empty cell is a missing value, except for the text (that is "empty text").
            yield (
                start,
                {
                    k: (v if v != "" or k == data.fields.text else None)
                    for k, v in zip(header, row, strict=True)
                },
            )


def _parquet_rows(
    path: Path, data: DataSpec, task: TaskSpec, shown: str
) -> Iterator[tuple[int, dict | _Bad]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"{shown}: not a readable Parquet file: {e}") from None
    with pf:
        names = pf.schema_arrow.names
        for col in _needed_columns(data, task):
            if col not in names:
                raise UsageError(
                    f"{shown}: no column {col!r} (columns: {', '.join(names)}); "
                    "set data.fields to map your column names"
                )
        fm = data.fields
        wanted = [c for c in (fm.text, fm.label, fm.target, fm.id) if c and c in names]
        row = 0
        try:
            # Batches, not the whole table: memory stays flat however many rows there are.
            for batch in pf.iter_batches(batch_size=1024, columns=list(dict.fromkeys(wanted))):
                for values in batch.to_pylist():
                    row += 1
                    yield row, {k: _jsonable(v) for k, v in values.items()}
        except pa.ArrowException as e:
            raise UsageError(f"{shown}:row {row + 1}: cannot read the Parquet data: {e}") from None


def _jsonable(value: Any) -> Any:
    """Parquet values -> JSON values: dates as ISO strings, decimals as numbers."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return float(value)
        return int(value) if value == value.to_integral_value() else float(value)
    return value
