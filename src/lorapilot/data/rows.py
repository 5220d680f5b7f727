"""One raw row (column -> value) checked against the spec and made a Record, under
data.on_error: the one validation path of every reader (files in `load`, HF datasets in `hf`)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lorapilot.data.targets import category_of, is_text_target, json_type, target_validator
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, TaskSpec
from lorapilot.spec.data import template_parts

MAX_LINE_BYTES = 1 << 20  # a longer line is refused before it is decoded or parsed


_SURROGATE = re.compile(r"[\ud800-\udfff]")

_MISSING = object()


@dataclass(frozen=True)
class ImageMeta:
    """What was found in an image file: its properties (for the per-category shortcut check)
    and its hashes (file bytes for the data version, pixels and a perceptual hash for
    duplicates)."""

    width: int
    height: int
    mode: str  # as stored: RGB, L, RGBA, P, ...
    format: str  # PNG, JPEG, ...
    bytes: int
    sha256: str  # of the file's bytes
    pixel_hash: str  # of the decoded pixels (mode, size, data): equal images, any encoding
    phash: int  # 64-bit DCT perceptual hash of the grayscale image
    thumb: bytes = b""  # 16x16 grayscale pixels: near duplicates are confirmed on these
    orientation: int = 1  # EXIF orientation; width, height and hashes are of the upright image
    transparent: bool = False  # an alpha band or a transparent colour: composited on white

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "height": self.height,
            "mode": self.mode,
            "format": self.format,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "pixel_hash": self.pixel_hash,
            "phash": f"{self.phash:016x}",
            **({"orientation": self.orientation} if self.orientation != 1 else {}),
            **({"transparent": True} if self.transparent else {}),
        }


UNLABELLED = "(unlabelled)"  # the category of an input to predict that has no answer


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
    image: ImageMeta | None = None  # image tasks: the decoded file's properties and hashes
    group: str | None = None  # data.split.group's value: the group's examples share a split
    empty_fields: tuple[str, ...] = ()  # data.fields.text_template's columns empty in this row
    system: str | None = None  # data.fields.messages: the row's system turn (counted, not used)
    context: Turns = ()  # data.fields.messages: the turns before the last user turn


Turns = tuple[tuple[str, str], ...]
"""A conversation's earlier turns, (role, text) pairs: user, assistant, user, assistant..."""


def conversation_text(record: Record) -> str:
    """The whole input as one text, for what compares inputs (duplicates, similar
    examples): the earlier turns, then the input text; the text alone without them."""
    if not record.context:
        return record.text
    return "\n".join(f"{role}: {text}" for role, text in record.context) + f"\nuser: {record.text}"


def answer_of(record: Record) -> Any:
    """A record's answer: its label, else its target; None for an input without one."""
    return record.label if record.label is not None else record.target


@dataclass
class Skipped:
    """A record set aside: invalid under `on_error: skip`, or (`label` set) left out on
    purpose under `unlisted_labels: drop`; `line` is the row number for Parquet."""

    file: str
    line: int
    problem: str
    label: str | None = None  # an unlisted label the row was dropped for


# A quoted value inside a problem (`_show`'s repr, or a path in quotes): what varies by row.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def skipped_summary(skipped: Iterable[Skipped], values: int = 5) -> list[dict[str, Any]]:
    """Rows set aside, grouped by their problem with the quoted values taken out
    (`label '…' is not one of ...`), commonest first: each group's count, first row and
    commonest values. Thousands of rows set aside read as a few causes, not a list."""
    groups: dict[str, dict[str, Any]] = {}
    for sk in skipped:
        pattern = _QUOTED.sub("…", sk.problem)
        g = groups.setdefault(
            pattern, {"problem": pattern, "count": 0, "first": f"{sk.file}:{sk.line}", "v": {}}
        )
        g["count"] += 1
        for v in _QUOTED.findall(sk.problem)[:1]:
            g["v"][v] = g["v"].get(v, 0) + 1
    out = []
    for g in sorted(groups.values(), key=lambda g: (-g["count"], g["problem"])):
        common = sorted(g.pop("v").items(), key=lambda kv: (-kv[1], kv[0]))
        out.append({**g, "values": dict(common[:values]), "n_values": len(common)})
    return out


class BadRow(Exception):
    """A problem with one record: reported with its line, never escapes this module."""


class UnlistedLabel(BadRow):
    """A label outside task.labels under `data.unlisted_labels: drop`: the row is left out
    and counted, whatever data.on_error says (the spec asked for it)."""

    def __init__(self, problem: str, label: str):
        super().__init__(problem)
        self.label = label


def collect_rows(
    rows: Iterable[tuple[int, dict | BadRow]],
    builder: RecordBuilder,
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
            if isinstance(row, BadRow):
                raise row
            records.append(builder.build(row, line))
        except UnlistedLabel as e:
            skipped.append(Skipped(shown, line, str(e), label=e.label))
        except (BadRow, RecursionError) as e:
            problem = str(e) if isinstance(e, BadRow) else "JSON nested too deeply"
            where = f"row {line}" if row_numbers else str(line)
            if data.on_error == "fail":
                raise UsageError(f"{shown}:{where}: {problem}") from None
            skipped.append(Skipped(shown, line, problem))
    if not seen_any:
        raise UsageError(f"{shown}: {empty}")
    return records, skipped


class RecordBuilder:
    """Checks one raw row (column -> value) against the spec and builds its Record."""

    def __init__(
        self,
        task: TaskSpec,
        data: DataSpec,
        shown: str,
        stem: str,
        split: str | None,
        row_numbers: bool,
        answers: bool = True,
    ):
        """`answers` False: inputs to predict, whose label or target may be absent (one
        present is checked as in the pilot's data); the split's group is not asked for."""
        self.task = task
        self.answers = answers
        self.row_numbers = row_numbers  # Parquet records have rows, not lines
        self.fields = data.fields
        # the input built from columns: the text (text_template), or an image's path
        self.template_key, given = (
            ("data.fields.image_template", data.fields.image_template)
            if task.modality == "image"
            else ("data.fields.text_template", data.fields.text_template)
        )
        self.template = template_parts(given) if given is not None else None
        self.template_columns = data.fields.input_columns(task.modality)
        # the names the input and the answer are read under (and named by in messages):
        # data.fields' columns, or the turns of a data.fields.messages conversation
        self.conversations = data.fields.messages if task.modality != "image" else None
        conv = self.conversations
        self.text_column = (
            data.fields.image if task.modality == "image"
            else f"{conv} (user turn)" if conv else data.fields.text
        )  # fmt: skip
        answer = data.fields.label if task.labelled else data.fields.target
        self.answer_column = f"{conv} (assistant turn)" if conv else answer
        self.category_by = data.category if not task.labelled else None
        self.shown = shown
        self.stem = stem
        self.split = split
        self.text_target = is_text_target(task)
        self.check_target: Callable[[Any], list[str]] | None = (
            None if task.labelled else target_validator(task)
        )
        self.labels = set(task.labels or [])
        self.drop_unlisted = data.unlisted_labels == "drop"
        self.group_by = data.split.group if answers else None
        self.seen: dict[str, str] = {}

    def build(self, row: dict, line: int) -> Record:
        empty: tuple[str, ...] = ()
        system, context = None, ()
        if self.conversations:
            row, system, context = self._from_messages(row)
        if self.template is not None:
            column = self.template_key
            text, empty = self._from_template(row)
            if empty and self.task.modality == "image":  # a path with a hole names no image
                raise BadRow(f"field {empty[0]!r} ({column}) is empty")
        else:
            # an image task's input is the image's path (relative to the pilot folder); the
            # image itself is opened and checked once every row is read (data/images.py)
            column = self.text_column
            text = row.get(column, _MISSING)
            if text is _MISSING or text is None:
                raise BadRow(f"missing field {column!r}")
            if not isinstance(text, str):
                raise BadRow(f"field {column!r} must be a string, got {json_type(text)}")
            if not text.strip():
                raise BadRow(f"field {column!r} is empty")
        if "\x00" in text:
            raise BadRow(f"field {column!r} contains a NUL byte")
        if len(text) > MAX_LINE_BYTES:
            raise BadRow(
                f"field {column!r} is too long ({len(text)} characters, max {MAX_LINE_BYTES})"
            )
        _no_surrogates(text, column)

        label = None
        target = None
        answer = row.get(self.answer_column, _MISSING)
        if self.answers or answer not in (_MISSING, None):
            if self.task.multi_label:
                target = self._label_set(answer)
            elif self.task.labelled:
                label = self._label(answer)
            else:
                target = self._target(answer)
            by = self.category_by  # an input to predict may lack data.category's column
            if not self.answers and by and not by.startswith("target.") and by not in row:
                by = None
            try:
                category = category_of(label, target, self.task, by, row)
            except ValueError as e:
                raise BadRow(str(e)) from None
        else:
            category = UNLABELLED
        rid = self._id(row, line)
        group = self._group(row) if self.group_by else None
        source = f"{self.shown}:row {line}" if self.row_numbers else f"{self.shown}:{line}"
        first = self.seen.get(rid)
        if first is not None:
            raise BadRow(f"duplicate id {_show(rid)} (first at {first})")
        self.seen[rid] = source
        return Record(
            id=rid,
            text=text,
            label=label,
            target=target,
            source=source,
            split=self.split,
            category=category,
            group=group,
            empty_fields=empty,
            system=system,
            context=context,
        )

    def _from_messages(self, row: dict) -> tuple[dict, str | None, Turns]:
        """A data.fields.messages row as the input and answer columns (`text_column`,
        `answer_column`), its system turn and its earlier turns: an optional system (or
        developer) turn, then user and assistant turns in turn, the last assistant turn the
        answer (absent in inputs to predict). The turns before the last user turn are the
        input's context: the prompt holds them as they were said."""
        name = self.conversations
        conv = row.get(name, _MISSING)
        if conv is _MISSING or conv is None:
            raise BadRow(f"missing field {name!r}")
        if isinstance(conv, str):  # a CSV cell or a Parquet string column: JSON text
            try:
                conv = json.loads(conv, parse_constant=no_constant)
            except ValueError as e:
                raise BadRow(f"field {name!r} is not valid JSON: {json_message(e)}") from None
        if not isinstance(conv, list) or not conv:
            raise BadRow(
                f"field {name!r} must be a list of {{role, content}} turns, got "
                f"{'an empty list' if conv == [] else json_type(conv)}"
            )
        turns: list[tuple[str, str]] = []
        for i, turn in enumerate(conv):
            role, content = chat_turn(turn)
            if not isinstance(role, str):
                raise BadRow(f"turn {i} of {name!r} is not a {{role, content}} object")
            turns.append((role, _turn_text(content, f"turn {i} of {name!r} ({role})")))
        system = turns.pop(0)[1] if turns[0][0] in ("system", "developer") else None
        roles = [r for r, _ in turns]
        expected = ["user", "assistant"] * (len(roles) // 2 + 1)
        wrong = [i for i, r in enumerate(roles) if r != expected[i]]
        if not roles or wrong:
            at = f"; turn {wrong[0] + (system is not None)} is {roles[wrong[0]]!r}" if wrong else ""
            raise BadRow(
                f"field {name!r} has the turns {', '.join(roles) or 'system alone'}: a pilot "
                "reads user and assistant turns in turn, from a user turn (an optional system "
                f"turn first){at}"
            )
        if self.answers and roles[-1] != "assistant":
            raise BadRow(f"field {name!r} ends with a user turn: no assistant turn to learn")
        answer = turns.pop()[1] if roles[-1] == "assistant" else None
        out = {**row, self.text_column: turns[-1][1]}
        if answer is not None:
            out[self.answer_column] = answer
        return out, system, tuple(turns[:-1])

    def _from_template(self, row: dict) -> tuple[str, tuple[str, ...]]:
        """data.fields.text_template filled from the row, and the columns that were empty.
        A number is written as it reads (a CSV cell is text already); an absent, null or
        NaN column is empty, as an empty CSV cell is."""
        assert self.template is not None
        out: list[str] = []
        empty: list[str] = []
        for literal, name in self.template:
            out.append(literal)
            if name is None:
                continue
            value = row.get(name)
            if isinstance(value, float) and value != value:
                value = None
            if isinstance(value, bool) or not isinstance(value, str | int | float | None):
                raise BadRow(
                    f"field {name!r} ({self.template_key}) must be a string or a number, "
                    f"got {json_type(value)}"
                )
            value = "" if value is None else str(value)
            if not value.strip() and name not in empty:
                empty.append(name)
            out.append(value)
        names = self.template_columns
        if len(empty) == len(names):
            raise BadRow(f"every column of {self.template_key} is empty: {', '.join(names)}")
        return "".join(out), tuple(empty)

    def _group(self, row: dict) -> str:
        """data.split.group's value: a string or an integer (CSV cells are strings)."""
        name = self.group_by
        assert name is not None
        value = row.get(name, _MISSING)
        if value is _MISSING or value is None:
            raise BadRow(f"missing field {name!r} (data.split.group)")
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise BadRow(
                f"field {name!r} (data.split.group) must be a string or an integer, "
                f"got {json_type(value)}"
            )
        if not value.strip():
            raise BadRow(f"field {name!r} (data.split.group) is empty")
        return value

    def _label(self, label: Any) -> str:
        name = self.answer_column
        if label is _MISSING or label is None:
            raise BadRow(f"missing field {name!r}")
        if not isinstance(label, str):
            raise BadRow(f"field {name!r} must be a string, got {json_type(label)}")
        if label not in self.labels:
            if self.drop_unlisted:
                raise UnlistedLabel(f"label {_show(label)} is not in task.labels", label)
            allowed = ", ".join(self.task.labels or [])
            raise BadRow(
                f"label {_show(label)} is not one of the task labels ({allowed}); to leave "
                "such examples out, counted per label, set data.unlisted_labels: drop"
            )
        return label

    def _label_set(self, cell: Any) -> list[str]:
        """A multi-label example's labels, in task.labels order: a JSON list of labels, or
        a text cell split on data.fields.label_separator. A label named twice counts once."""
        name = self.answer_column
        if cell is _MISSING or cell is None:
            raise BadRow(f"missing field {name!r}")
        if isinstance(cell, str):
            parts = [p.strip() for p in cell.split(self.fields.label_separator)]
            if any(not p for p in parts) and cell.strip():
                raise BadRow(
                    f"field {name!r} ({_show(cell)}) has an empty label between separators "
                    f"({self.fields.label_separator!r}, data.fields.label_separator)"
                )
            parts = [p for p in parts if p]
        elif isinstance(cell, list | tuple) and all(isinstance(p, str) for p in cell):
            parts = list(cell)
        else:
            raise BadRow(
                f"field {name!r} must be a list of labels or a text of labels separated by "
                f"{self.fields.label_separator!r} (data.fields.label_separator), got "
                f"{json_type(cell)}"
            )
        if not parts:
            raise BadRow(
                f"field {name!r} names no label: a multi-label example needs at least one "
                "(for texts to which none applies, add a label such as 'none' to task.labels)"
            )
        given = {self._label(label) for label in parts}  # each one listed, as a single label
        return [lab for lab in self.task.labels or [] if lab in given]

    def _target(self, target: Any) -> Any:
        name = self.answer_column
        if target is _MISSING or target is None:
            raise BadRow(f"missing field {name!r}")
        if isinstance(target, str) and not self.text_target:
            # CSV cells and Parquet string columns carry the object as JSON text.
            try:
                target = json.loads(target, parse_constant=no_constant)
            except ValueError as e:
                raise BadRow(f"field {name!r} is not valid JSON: {json_message(e)}") from None
        if not self.text_target and not isinstance(target, dict):
            raise BadRow(f"field {name!r} must be a JSON object, got {json_type(target)}")
        try:
            json.dumps(target, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRow(
                f"field {name!r} contains an unpaired surrogate escape (not valid Unicode)"
            ) from None
        except (TypeError, ValueError) as e:
            raise BadRow(f"field {name!r} is not JSON data: {e}") from None
        assert self.check_target is not None
        problems = self.check_target(target)
        if problems:
            raise BadRow("; ".join(problems))
        return target

    def _id(self, row: dict, line: int) -> str:
        name = self.fields.id
        rid = row.get(name, _MISSING) if name else _MISSING
        if rid is _MISSING or rid is None:
            return f"{self.stem}-{line}"
        if isinstance(rid, int) and not isinstance(rid, bool):
            return str(rid)
        if not isinstance(rid, str):
            raise BadRow(f"field {name!r} must be a string or an integer, got {json_type(rid)}")
        if not rid.strip():
            raise BadRow(f"field {name!r} is empty")
        _no_surrogates(rid, name or "id")
        return rid


SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
"""ShareGPT's speakers (`{"from": "human", "value": ...}`, as FastChat and axolotl write
chat data) as the roles of OpenAI's format."""


def chat_turn(turn: Any) -> tuple[str | None, Any]:
    """(role, content) of one chat turn: OpenAI's `{role, content}`, or ShareGPT's `{from,
    value}` with its speakers named as roles (another speaker keeps its name, and is
    refused where the turns are checked); (None, None) for what is neither."""
    if not isinstance(turn, dict):
        return None, None
    if "role" in turn:
        return turn["role"], turn.get("content")
    if "from" in turn and isinstance(turn["from"], str):
        return SHAREGPT_ROLES.get(turn["from"], turn["from"]), turn.get("value")
    return None, None


def _turn_text(content: Any, where: str) -> str:
    """A chat turn's text: a string, or a list of text parts (OpenAI's `[{"type": "text",
    "text": ...}]`, joined); a part of another kind (an image, audio) is not read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        kinds = [p.get("type") if isinstance(p, dict) else None for p in content]
        texts = [
            p.get("text") if k == "text" else None for p, k in zip(content, kinds, strict=True)
        ]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
        other = next(k for k, t in zip(kinds, texts, strict=True) if not isinstance(t, str))
        raise BadRow(f"{where}: a content part of type {other!r} is not read (text parts only)")
    raise BadRow(
        f"{where}: content must be a string or a list of text parts, got {json_type(content)}"
    )


def _show(value: str, limit: int = 80) -> str:
    """repr, so control characters and trailing spaces are visible; cut to `limit` chars."""
    return repr(value[:limit]) + ("…" if len(value) > limit else "")


def _no_surrogates(value: str, name: str) -> None:
    m = _SURROGATE.search(value)
    if m:
        raise BadRow(
            f"field {name!r} contains an unpaired surrogate {m.group()!r} (not valid Unicode)"
        )


def no_constant(name: str) -> Any:
    # NaN/Infinity are not JSON; they would break every JSON file written downstream.
    raise ValueError(f"{name} is not allowed in JSON")


def json_message(e: ValueError) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} (column {e.colno})"
    return str(e)


def needed_columns(data: DataSpec, task: TaskSpec, answers: bool = True) -> list[str]:
    """The columns every row must have: the input, the label or target, and the columns
    data.split.group and data.category (when it is not a target path) name; with `answers`
    False (inputs to predict) the input alone."""
    fm = data.fields
    inputs = fm.input_columns(task.modality)
    if not answers:
        return inputs
    extra = [data.split.group] if data.split.group else []
    if not task.labelled and data.category and not data.category.startswith("target."):
        extra.append(data.category)
    # a conversation holds its answer (data.fields.messages); else the label or target column
    answer = [] if fm.messages else [fm.label if task.labelled else fm.target]
    return list(dict.fromkeys([*inputs, *answer, *extra]))


def require_columns(
    names: list[str], data: DataSpec, task: TaskSpec, shown: str, answers: bool = True
) -> None:
    """The columns every row must have (needed_columns), found among a file's `names`, else
    a UsageError naming the first one missing and the columns there are (`shown`: the file,
    with `:1` for a CSV header)."""
    for col in needed_columns(data, task, answers):
        if col not in names:
            raise UsageError(
                f"{shown}: no column {col!r} (columns: {', '.join(names)}); "
                "set data.fields to map your column names"
            )


def read_columns(
    data: DataSpec, task: TaskSpec, names: list[str], answers: bool = True
) -> list[str]:
    """The columns a columnar reader (Parquet, an HF dataset) loads: the needed ones and the
    id, those of `names` only (inputs to predict: their label or target too, if present)."""
    fm = data.fields
    extra = [] if answers else [fm.label if task.labelled else fm.target, data.category]
    wanted = [*needed_columns(data, task, answers), fm.id, *extra]
    return [c for c in dict.fromkeys(wanted) if c and c in names]


def jsonable(value: Any) -> Any:
    """Parquet values -> JSON values: dates as ISO strings, decimals as numbers."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return float(value)
        return int(value) if value == value.to_integral_value() else float(value)
    return value
