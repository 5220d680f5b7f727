"""Read a data file (JSONL, CSV, Parquet; HF datasets via hf.py) into validated records.

Files are read in binary and decoded line by line, so one bad line (invalid UTF-8, a
megabyte of garbage, broken JSON) is reported with its line number instead of spoiling
the whole file. `data.on_error` decides whether the first bad record stops the load
(`fail`, exit 2 naming file:line) or is set aside and counted (`skip`).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lorapilot.data.rows import (
    MAX_LINE_BYTES,
    BadRow,
    Record,
    RecordBuilder,
    Skipped,
    collect_rows,
    json_message,
    jsonable,
    no_constant,
    read_columns,
    require_columns,
)
from lorapilot.data.targets import json_type
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, TaskSpec

_BOM = b"\xef\xbb\xbf"
FORMATS = {
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def detect_format(path: Path, data: DataSpec) -> str:
    if data.format != "auto":
        return data.format
    fmt = FORMATS.get(path.suffix.lower())
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
    pilot_dir: Path | None = None,
    answers: bool = True,
) -> tuple[list[Record], list[Skipped]]:
    """Read and validate every record of one file -> (valid records, skipped records).

    `display_path` is how the file is named in messages and `Record.source` (e.g. relative
    to the pilot folder); `key` is the spec key that named it. Under `skip`, a file whose
    records are all invalid returns no records and lets the caller judge; a file with no
    records at all is a UsageError. A folder written by `datasets`' save_to_disk is read
    through hf.py; a DatasetDict's records carry their split (train/val/test). `answers`
    False: inputs to predict, a label or target optional (RecordBuilder).
    """
    path = Path(path)
    shown = display_path or str(path)
    if not path.exists():
        raise UsageError(f"{shown}: no such data file")
    if path.is_dir() and data.format in ("auto", "datasets"):
        from lorapilot.data import hf  # `datasets` is an optional extra

        if hf.saved_kind(path):
            return hf.load_saved(
                path, task, data, split, shown, key or "data.file", pilot_dir, answers
            )
        if task.modality == "image":
            from lorapilot.data.images import folder_records

            return folder_records(path, shown, task, split, data, answers)
        raise UsageError(
            f"{shown}: not a file, nor a folder written by datasets' save_to_disk "
            f"(no {hf.DICT_META}, or {' and '.join(hf.DATASET_META)}, in it)"
        )
    if not path.is_file():
        raise UsageError(f"{shown}: not a file")
    fmt = detect_format(path, data)
    if fmt == "datasets":
        raise UsageError(
            f"{shown}: data.format is datasets, so this must be the folder save_to_disk wrote, "
            "not a file"
        )
    builder = RecordBuilder(
        task, data, shown, path.stem, split, row_numbers=fmt == "parquet", answers=answers
    )
    try:
        rows = file_rows(path, fmt, shown, _Columns(data, task, answers))
        return collect_rows(rows, builder, data, shown, row_numbers=fmt == "parquet")
    except OSError as e:
        raise UsageError(f"{shown}: cannot read: {e.strerror or e}") from None


# --------------------------------------------------------------------------- readers


class _Columns:
    """What a reader asks of a spec: the columns it needs (checked against a CSV header or
    a Parquet schema), those it reads, and the input text column (an empty cell there is
    empty text, not a missing value). Without one (`file_rows(..., None)`), every column is
    read as it is: `init --from` looking at a file no spec describes yet."""

    def __init__(self, data: DataSpec, task: TaskSpec, answers: bool) -> None:
        self.data, self.task, self.answers = data, task, answers
        self.text = data.fields.text

    def check(self, names: list[str], where: str) -> None:
        require_columns(names, self.data, self.task, where, self.answers)

    def wanted(self, names: list[str]) -> list[str]:
        return read_columns(self.data, self.task, names, self.answers)


def file_rows(
    path: Path, fmt: str, shown: str, columns: _Columns | None = None
) -> Iterator[tuple[int, dict | BadRow]]:
    """(line or row number, the row as a dict, or why it is unreadable) of a JSONL, CSV or
    Parquet file."""
    if fmt == "jsonl":
        array = path.suffix.lower() == ".json" and _holds_an_array(path)
        return _json_array_rows(path, shown) if array else _jsonl_rows(path)
    if fmt == "csv":
        return _csv_rows(path, shown, columns)
    return _parquet_rows(path, shown, columns)


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


def _too_long() -> BadRow:
    return BadRow(f"line too long (over {MAX_LINE_BYTES} bytes)")


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict | BadRow]]:
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
                yield lineno, BadRow(f"invalid UTF-8 (byte {e.start + 1} of the line)")
                continue
            try:
                obj = json.loads(text, parse_constant=no_constant)
            except RecursionError:
                yield lineno, BadRow("JSON nested too deeply")
                continue
            except ValueError as e:
                yield lineno, BadRow(f"invalid JSON: {json_message(e)}")
                continue
            if not isinstance(obj, dict):
                yield lineno, BadRow(f"record is not a JSON object (got {json_type(obj)})")
                continue
            yield lineno, obj


def _holds_an_array(path: Path) -> bool:
    """A `.json` file written as one JSON array of records (Alpaca's data.json, NLU++'s
    folds) rather than JSON Lines: its first character, past a BOM and blanks, is `[`."""
    with path.open("rb") as f:
        head = f.read(4096).removeprefix(_BOM).lstrip()
    return head[:1] == b"["


def _json_array_rows(path: Path, shown: str) -> Iterator[tuple[int, dict | BadRow]]:
    """The records of a JSON array, each with the line it starts on. The file is parsed
    whole (an array has no line to resume from): invalid JSON fails it, naming the line."""
    raw = path.read_bytes().removeprefix(_BOM)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{shown}:{line}: invalid UTF-8 in a JSON array file") from None
    decoder = json.JSONDecoder(parse_constant=no_constant)
    ws = re.compile(r"[ \t\r\n]*")
    pos, line, seen = ws.match(text, 0).end() + 1, 1, 0  # past the `[`

    def where(at: int) -> int:
        nonlocal line, seen
        line += text.count("\n", seen, at)
        seen = at
        return line

    pos = ws.match(text, pos).end()
    if text.startswith("]", pos):
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except RecursionError:
            raise UsageError(f"{shown}:{where(pos)}: JSON nested too deeply") from None
        except ValueError as e:
            at = getattr(e, "pos", pos)
            raise UsageError(
                f"{shown}:{where(at)}: invalid JSON in a JSON array file: {json_message(e)}"
            ) from None
        start = where(pos)
        yield (
            start,
            obj
            if isinstance(obj, dict)
            else BadRow(f"record is not a JSON object (got {json_type(obj)})"),
        )
        pos = ws.match(text, end).end()
        if text.startswith("]", pos):
            after = ws.match(text, pos + 1).end()
            if after < len(text):
                raise UsageError(f"{shown}:{where(after)}: text after the JSON array's end")
            return
        if not text.startswith(",", pos):
            got = f"{text[pos]!r}" if pos < len(text) else "the end of the file"
            raise UsageError(
                f"{shown}:{where(pos)}: invalid JSON in a JSON array file: expected ',' or "
                f"']' after a record, got {got}"
            )
        pos = ws.match(text, pos + 1).end()


def header_of(path: Path, fmt: str) -> list[str] | None:
    """A CSV's header row or a Parquet file's column names, reading no record (`check`);
    None for another format or a header the loader would refuse (it names the problem)."""
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowException, OSError):
            return None
    if fmt != "csv":
        return None
    with path.open("rb") as f:
        for _, raw in _lines(f):
            if raw is None:
                return None
            try:
                return next(csv.reader([raw.decode("utf-8")]), None)
            except (UnicodeDecodeError, csv.Error):
                return None
    return None


def _csv_rows(
    path: Path, shown: str, columns: _Columns | None
) -> Iterator[tuple[int, dict | BadRow]]:
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
        if columns is not None:
            columns.check(header, f"{shown}:1")
        text = columns.text if columns is not None else None
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield start, BadRow(f"invalid CSV: {e}")
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
                yield n, BadRow(f"invalid UTF-8 (byte {bad_utf8[n]} of the line)")
                continue
            if not row or (len(row) == 1 and not row[0].strip() and len(header) > 1):
                continue  # a blank line is not a record
            if len(row) != len(header):
                yield start, BadRow(f"has {len(row)} columns, the header has {len(header)}")
                continue
            # An empty cell is a missing value, except for the text (that is "empty text").
            yield (
                start,
                {
                    k: (v if v != "" or k == text else None)
                    for k, v in zip(header, row, strict=True)
                },
            )


def _parquet_rows(
    path: Path, shown: str, columns: _Columns | None
) -> Iterator[tuple[int, dict | BadRow]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"{shown}: not a readable Parquet file: {e}") from None
    with pf:
        names = pf.schema_arrow.names
        wanted = None
        if columns is not None:
            columns.check(names, shown)
            wanted = columns.wanted(names)
        row = 0
        try:
            # Batches, not the whole table: memory stays flat however many rows there are.
            for batch in pf.iter_batches(batch_size=1024, columns=wanted):
                for values in batch.to_pylist():
                    row += 1
                    yield row, {k: jsonable(v) for k, v in values.items()}
        except pa.ArrowException as e:
            raise UsageError(f"{shown}:row {row + 1}: cannot read the Parquet data: {e}") from None
