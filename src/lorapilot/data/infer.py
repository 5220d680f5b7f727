"""What a data file nobody described yet holds, for `lorapilot init --from`: which column is
the input, which the answer, what kind of task that answer makes, its labels or fields.

Pure: rows in, an `Inferred` out, every choice with the reason shown to the user (in the
scaffolded pilot.yaml and in `init`'s JSON), so a wrong guess is seen and corrected with
`--text`/`--answer`/`--task`, not trained on. Raises ValueError with the fix when the rows
say too little.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lorapilot.data.rows import chat_turn
from lorapilot.data.targets import json_type
from lorapilot.spec import IMAGE_EXTENSIONS

LABEL_WORDS = 6
"""Repeated answers longer than this many words on average are replies, not labels."""
MAX_LABELS = 500
"""More distinct answers than this (or than half the rows) are free text, not labels."""
INPUT_NAMES = (
    "text", "sentence", "input", "question", "query", "prompt", "content", "document", "body",
    "review", "utterance", "instruction", "message", "comment", "tweet", "description",
    "passage", "context", "title",
)  # fmt: skip
"""Column names that usually hold the input, in the order they are preferred."""
LABEL_NAMES = (
    "label", "labels", "category", "categories", "class", "intent", "intents", "emotion",
    "emotions", "topic", "topics", "tags", "tag", "sentiment", "y",
)  # fmt: skip
TARGET_NAMES = (
    "target", "output", "answer", "response", "completion", "fields", "json", "slots", "entities",
)  # fmt: skip
SPLIT_WORDS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val",
               "test": "test"}  # fmt: skip
"""File and folder names that say a split (train.csv, dev.jsonl, validation/)."""
ID_NAMES = ("id", "idx", "uid", "guid", "example_id", "doc_id", "_id")
GROUP_NAMES = ("group", "session", "conversation", "dialogue", "dialog", "thread")
"""Names (or `*_id` ones) of a column whose repeated values mark examples of one origin."""
MIN_GROUPS = 10  # fewer distinct values read as a category, not as origins
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ROLES = {"system", "developer", "user", "assistant"}


@dataclass
class Inferred:
    """The pilot the rows suggest; `reasons` say why each choice was made."""

    task: str
    n_rows: int
    text: str | None = None
    answer: str | None = None
    image: str | None = None
    """image_classification from a table: the column of image paths (or of their ids)."""
    image_template: str | None = None
    """The image path built from that column's ids (`images/{image}.jpg`), set by `init`."""
    group: str | None = None
    """data.split.group: a `*_id` column whose values repeat (rows of one dialogue, one
    document, one customer), so that lorapilot's split keeps each one's rows together."""
    messages: str | None = None
    id: str | None = None
    labels: list[str] | None = None
    label_counts: dict[str, int] = field(default_factory=dict)
    fields: list[dict] | None = None
    system: str | None = None
    regex: str | None = None
    """format: the final line the answers share (`#### 42`), its number the `answer` group."""
    final_line: str = ""
    """format: the words before that number (`#### `)."""
    longest_chars: int = 0
    """The longest input plus the longest answer, in characters: every prompt leaves room for
    the longest answer, so max_length is sized from the two."""
    longest_inputs: list[Prompted] = field(default_factory=list)
    longest_answers: list[str] = field(default_factory=list)
    """The longest inputs and answers by characters: tokenized where a tokenizer is."""
    most_turns: int = 0
    """Chat rows: the most user and assistant turns before an answer (1: single-turn)."""
    thin_validation: dict[str, int] = field(default_factory=dict)
    """Labels with fewer validation examples than eval.min_support (set by `init`)."""
    no_answer: int = 0
    """Rows without an answer (`data` refuses them unless data.on_error is skip)."""
    other_text_columns: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def value_kind(value: Any) -> str | None:
    """text, image (a path ending with an image extension), number, bool, list, object or
    messages (a list of chat turns); None for a missing value. JSON text (a CSV cell holding
    a list or an object) counts as what it holds."""
    value = _decoded(value)
    if value is None or value == "":
        return None
    if isinstance(value, str) and _image_path(value):
        return "image"
    kind = json_type(value)
    if kind == "array":
        if value and all(chat_turn(t)[0] in _ROLES for t in value):
            return "messages"
        if all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
            return "list"
        return "json"
    return {"boolean": "bool", "string": "text", "number": "number", "object": "object"}.get(
        kind, "json"
    )


def _image_path(value: str) -> bool:
    return (
        len(value) < 1024 and "\n" not in value and value.strip().lower().endswith(IMAGE_EXTENSIONS)
    )


def _decoded(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


@dataclass(frozen=True)
class _Column:
    name: str
    kind: str | None  # what at least 95% of its values are; None: mixed or empty
    filled: int
    distinct: int
    mean_chars: float


def _profile(rows: list[dict], name: str) -> _Column:
    values = [r.get(name) for r in rows]
    kinds = Counter(k for k in map(value_kind, values) if k is not None)
    filled = sum(kinds.values())
    kind = None
    if kinds:
        top, n = kinds.most_common(1)[0]
        if n >= 0.95 * filled:
            kind = top
    texts = [str(v) for v in values if v is not None and v != ""]
    distinct = len({json.dumps(_decoded(v), sort_keys=True, default=str) for v in texts})
    mean = sum(map(len, texts)) / len(texts) if texts else 0.0
    return _Column(name, kind, filled, distinct, mean)


def infer(
    rows: list[dict],
    text: str | None = None,
    answer: str | None = None,
    task: str | None = None,
    image: str | None = None,
) -> Inferred:
    """The columns and task the rows suggest; `text`, `answer` and `task` as the user gave
    them override the guesses (and are checked against the rows). `image`: a column that
    names image files by id (found by the caller, which sees the files)."""
    if not rows:
        raise ValueError("holds no rows")
    names = list(dict.fromkeys(k for r in rows for k in r))
    for given, flag in ((text, "--text"), (answer, "--answer")):
        if given is not None and given not in names:
            raise ValueError(f"{flag} {given!r}: no such column (columns: {', '.join(names)})")
    columns = {n: _profile(rows, n) for n in names}
    chat = [c.name for c in columns.values() if c.kind == "messages"]
    if chat and text is None and answer is None:
        return _from_messages(rows, chat[0], columns, task)
    images = [image] if image else [c.name for c in columns.values() if c.kind == "image"]
    # a text column by its name beside the paths: a text pilot, unless told otherwise
    texts = [c.name for c in columns.values() if c.kind == "text" and c.name.lower() in INPUT_NAMES]
    told = task == "image_classification"
    if images and text is None and (told or (task in (None, "classification") and not texts)):
        return _from_image_table(rows, images[0], columns, answer)
    if task == "image_classification":
        raise ValueError(
            "--task image_classification: no column of image paths (values ending with "
            f"{', '.join(IMAGE_EXTENSIONS)}) to read as the input"
        )
    out = Inferred(task="", n_rows=len(rows))
    out.id = _id_column(rows, columns)
    if out.id:
        out.reasons.append(f"id: column {out.id!r} (a unique value in every row)")
    given_text, given_answer = text, answer
    answer = answer or _answer_by_name(columns, exclude={text, out.id})
    text = text or _input_column(columns, exclude={answer, out.id})
    if text is None:
        raise ValueError(
            f"has no column of text to read as the input (columns: {', '.join(names)}); "
            "name it with --text"
        )
    answer = answer or _answer_by_values(columns, exclude={text, out.id})
    if answer is None:
        raise ValueError(
            f"has no column besides {text!r} to read as the answer (columns: "
            f"{', '.join(names)}); name it with --answer"
        )
    out.text, out.answer = text, answer
    if images:
        out.warnings.append(
            f"column {images[0]!r} holds image paths, read as neither input nor answer: for a "
            "pilot that classifies the images, give --task image_classification"
        )
    if not given_text and _identifiers(rows, text):
        out.warnings.append(
            f"column {text!r}, read as the input text, holds one word per row, a different "
            "one in each: an identifier rather than a text? If it names image files, give "
            "--from a table whose column holds their paths (or keep the images beside it, "
            "named by that id), or name the input with --text"
        )
    why_text = (
        "as given by --text" if given_text else
        "its name" if text.lower() in INPUT_NAMES else "the longest text"
    )  # fmt: skip
    why_answer = _why_answer(answer, given_answer)
    out.reasons.append(
        f"input: column {text!r} ({why_text}), answer: column {answer!r} ({why_answer})"
    )
    out.other_text_columns = [
        c.name for c in columns.values()
        if c.kind == "text" and c.name not in (text, answer, out.id) and c.distinct > 1
    ]  # fmt: skip
    _group_column(out, rows, columns)
    answers = [_decoded(r.get(answer)) for r in rows]
    inputs = [str(r.get(text) or "") for r in rows]
    _decide_task(out, answers, task, f"column {answer!r}")
    _keep_longest(out, [(i, _answer_text(a)) for i, a in zip(inputs, answers, strict=True)])
    return out


def _keep_longest(out: Inferred, pairs: list[tuple[Prompted, str]], n: int = 32) -> None:
    # ties in order of their text, not of a set's hash: the same file writes the same spec
    inputs = sorted({p[0] for p in pairs}, key=lambda x: (-prompted_chars(x), repr(x)))
    out.longest_inputs = inputs[:n]
    out.longest_answers = sorted({p[1] for p in pairs}, key=lambda x: (-len(x), x))[:n]
    out.longest_chars = prompted_chars(out.longest_inputs[0]) + len(out.longest_answers[0])


Prompted = str | tuple[tuple[str, str], ...]
"""What a prompt holds before the answer: an input text, or a conversation's (role, text)
turns up to its last user turn."""


def prompted_chars(x: Prompted) -> int:
    return len(x) if isinstance(x, str) else sum(len(said) for _, said in x)


def _from_messages(
    rows: list[dict], name: str, columns: dict[str, _Column], task: str | None
) -> Inferred:
    out = Inferred(task="", n_rows=len(rows), messages=name)
    out.id = _id_column(rows, columns)
    out.reasons.append(f"chat rows: column {name!r} holds chat turns (system, user, assistant)")
    if out.id:
        out.reasons.append(f"id: column {out.id!r} (a unique value in every row)")
    _group_column(out, rows, columns)
    answers, systems, pairs = [], Counter(), []
    for r in rows:
        turns = _decoded(r.get(name))
        turns = [chat_turn(t) for t in turns] if isinstance(turns, list) else []
        said = [(role, _content(content) or "") for role, content in turns if role]
        if said and said[0][0] in ("system", "developer") and said[0][1]:
            systems[said[0][1]] += 1
        dialog = tuple((role, text) for role, text in said if role in ("user", "assistant"))
        # the last assistant turn is the answer; the turns before it, the prompt
        last = dialog[-1] if dialog and dialog[-1][0] == "assistant" else None
        reply = _decoded(last[1]) if last else None
        answers.append(reply)
        asked = dialog[:-1] if last else dialog
        pairs.append((asked if len(asked) > 1 else asked[0][1] if asked else "",
                      _answer_text(reply)))  # fmt: skip
        out.most_turns = max(out.most_turns, len(asked))
    if systems:
        out.system, n = systems.most_common(1)[0]
        out.reasons.append(
            f"task.system: the data's own system turn ({n} of {len(rows)} conversations)"
        )
        if len(systems) > 1:
            out.warnings.append(
                f"the conversations carry {len(systems)} different system turns; task.system "
                "is the most common one and prompts every example (`lorapilot data` counts "
                "the others)"
            )
    if out.most_turns > 1:
        out.reasons.append(
            f"conversations of up to {out.most_turns} turns before the answer: the last "
            "assistant turn is the answer, the turns before it the prompt"
        )
    _decide_task(out, answers, task, "the last assistant turns")
    _keep_longest(out, pairs)
    return out


def _why_answer(answer: str, given: str | None) -> str:
    if given:
        return "as given by --answer"
    return "its name" if answer.lower() in (*LABEL_NAMES, *TARGET_NAMES) else "its values"


def _from_image_table(
    rows: list[dict], image: str, columns: dict[str, _Column], answer: str | None
) -> Inferred:
    """A table of image paths and their labels (`image,label`): an image classification
    whose input is the image each path names."""
    out = Inferred(task="", n_rows=len(rows), image=image)
    out.id = _id_column(rows, columns)
    given = answer
    answer = answer or _answer_by_name(columns, exclude={image, out.id})
    answer = answer or _answer_by_values(columns, exclude={image, out.id})
    if answer is None:
        raise ValueError(
            f"column {image!r} holds image paths, and no other column holds their labels; "
            "name it with --answer"
        )
    out.answer = answer
    why = _why_answer(answer, given)
    what = (
        f"image paths: {columns[image].filled} of {len(rows)} values end with an image extension"
        if columns[image].kind == "image" else "its values name image files"
    )  # fmt: skip
    out.reasons.append(f"input: column {image!r} ({what}), answer: column {answer!r} ({why})")
    _group_column(out, rows, columns)
    answers = [_decoded(r.get(answer)) for r in rows]
    kinds = {value_kind(a) for a in answers} - {None}
    if kinds - {"text", "number", "bool"}:
        raise ValueError(
            f"column {answer!r} holds {', '.join(sorted(kinds))} values: an image pilot gives "
            "each image one label (a folder of images per label, or a column of labels)"
        )
    _decide_task(out, answers, "classification", f"column {answer!r}")
    out.task = "image_classification"
    out.reasons = [
        "task: image_classification (an image per row, a label per image)"
        if r == "task: classification (as given by --task)" else r
        for r in out.reasons
    ]  # fmt: skip
    return out


def _content(content: Any) -> str | None:
    if isinstance(content, list):  # OpenAI's text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else None


_IDENTIFIER = re.compile(r"(?=.*\d)[\w.-]{6,}")  # a uuid, a SKU, `IMG_0042`: no words


def _identifiers(rows: list[dict], column: str) -> bool:
    """Whether a column holds a different identifier in every row, not text."""
    values = [r.get(column) for r in rows]
    ids = [v for v in values if isinstance(v, str) and _IDENTIFIER.fullmatch(v)]
    return len(ids) == len(values) and len(set(ids)) == len(ids)


def _group_column(out: Inferred, rows: list[dict], columns: dict[str, _Column]) -> None:
    """out.group: the first column named as an origin (`dialogue_id`, `session`, `*_id`)
    that every row fills, whose values repeat, and that has too many values to be a
    category: its rows, split apart, would leak one origin into the held-out splits."""
    for c in columns.values():
        low = c.name.lower()
        named = low.endswith(("_id", "-id")) or low in GROUP_NAMES or low in ID_NAMES
        if (
            not named
            or c.name in (out.id, out.text, out.answer)
            or c.kind not in ("text", "number")
        ):
            continue
        if low[:-3] in LABEL_NAMES:  # `label_id`, `intent_id`: the answer's code, no origin
            continue
        if c.filled == len(rows) and MIN_GROUPS <= c.distinct < len(rows):
            out.group = c.name
            out.reasons.append(
                f"split.group: column {c.name!r} ({c.distinct} values for {len(rows)} rows: "
                "the rows of one value are kept in one split)"
            )
            return


def _id_column(rows: list[dict], columns: dict[str, _Column]) -> str | None:
    for c in columns.values():
        named = c.name.lower() in ID_NAMES or c.name.lower().endswith(("_id", "-id"))
        if named and c.filled == len(rows) and c.distinct == len(rows):
            return c.name
    return None


def _answer_by_name(columns: dict[str, _Column], exclude: set) -> str | None:
    by_name = {c.name.lower(): c.name for c in columns.values() if c.name not in exclude}
    for wanted in (*LABEL_NAMES, *TARGET_NAMES):
        if wanted in by_name and columns[by_name[wanted]].filled:
            return by_name[wanted]
    return None


def _input_column(columns: dict[str, _Column], exclude: set) -> str | None:
    texts = [c for c in columns.values() if c.kind == "text" and c.name not in exclude]
    for wanted in INPUT_NAMES:
        for c in texts:
            if c.name.lower() == wanted:
                return c.name
    return max(texts, key=lambda c: c.mean_chars).name if texts else None


def _answer_by_values(columns: dict[str, _Column], exclude: set) -> str | None:
    """The most answer-like other column: an object, then a list, then a column of few
    distinct values, then free text."""
    rank = {"object": 0, "list": 1, "text": 3, "number": 3, "bool": 3}
    cands = [c for c in columns.values() if c.name not in exclude and c.kind in rank]
    if not cands:
        return None

    def order(c: _Column) -> tuple:
        few = c.kind in ("text", "number", "bool") and _few(c.distinct, c.filled)
        return (2 if few else rank[c.kind], -c.filled, c.distinct)

    return min(cands, key=order).name


def _few(distinct: int, n: int) -> bool:
    return 2 <= distinct <= MAX_LABELS and distinct * 2 <= n


def _decide_task(out: Inferred, answers: list[Any], task: str | None, where: str) -> None:
    kinds = Counter(k for k in map(value_kind, answers) if k is not None)
    if not kinds:
        raise ValueError(f"{where}: every answer is empty")
    kind, n = kinds.most_common(1)[0]
    filled = sum(kinds.values())
    if task is None:
        if kind == "object" and n >= 0.95 * filled:
            task = "extraction"
        elif kind == "list" and n >= 0.95 * filled:
            task = "multi_label_classification"
        else:
            distinct = {_answer_text(a) for a in answers if value_kind(a) is not None}
            words = sum(len(a.split()) for a in distinct) / max(len(distinct), 1)
            few = _few(len(distinct), filled)
            task = "classification" if few and words <= LABEL_WORDS else "format"
            if few and task == "format":  # repeated, but sentences: replies, not labels
                kinds = Counter({"sentences": round(words, 1)})
        out.reasons.append(f"task: {task} ({where}: {_kind_said(task, kinds, filled)})")
    else:
        out.reasons.append(f"task: {task} (as given by --task)")
    out.task = task
    missing = len(answers) - filled
    out.no_answer = missing
    if missing:
        out.warnings.append(
            f"{where}: {missing} of {len(answers)} rows have no answer; `lorapilot data` "
            "refuses them unless data.on_error is skip"
        )
    if task == "classification":
        counts = Counter(_answer_text(a) for a in answers if value_kind(a) is not None)
        _set_labels(out, counts)
    elif task == "multi_label_classification":
        counts = Counter(
            str(x) for a in answers if isinstance(a, list) for x in a
        )  # fmt: skip
        _set_labels(out, counts)
    elif task == "extraction":
        objects = [a for a in answers if isinstance(a, dict)]
        if not objects:
            raise ValueError(f"{where}: no answer is a JSON object, so there is nothing to extract")
        mixed: list[str] = []
        out.fields = fields_of(objects, mixed)
        if mixed:
            out.warnings.append(
                f"target values of several types at {', '.join(mixed[:5])}"
                + (f" and {len(mixed) - 5} more" if len(mixed) > 5 else "")
                + ": typed string there, so `lorapilot data` refuses the rows that hold "
                "another type; give each the type it should have (or an object's fields)"
            )
    elif task == "format":
        texts = [a for a in answers if isinstance(a, str)]
        found = final_line_regex(texts)
        if found:
            out.regex, out.final_line, said = found
            out.reasons.append(f"regex: {said}")
    else:
        raise ValueError(f"--task {task!r}: cannot be inferred from a data file's columns")


_NUMBER = r"-?[0-9][0-9,]*(?:\.[0-9]+)?"


def final_line_regex(answers: list[str]) -> tuple[str, str, str] | None:
    """A worked answer's convention, where 95% of the answers follow it: a last line of the
    same words before a number (`#### 42`, `The answer is 42`) -> (the regex, the words,
    why)."""
    if not answers:
        return None
    heads = Counter()
    for a in answers:
        last = a.rstrip().rsplit("\n", 1)[-1]
        m = re.fullmatch(r"(\D*?)" + _NUMBER + r"\.?", last.strip())
        if m and m.group(1).strip():
            heads[m.group(1)] += 1
    if not heads:
        return None
    head, n = heads.most_common(1)[0]
    if n < 0.95 * len(answers):
        return None
    escaped = re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", head)  # readable: '#### ' stays
    regex = f"(?s)(?:.*\\n)?{escaped}(?P<answer>{_NUMBER})\\.?"
    return regex, head, f"{n} of {len(answers)} answers end with a line {head!r} and a number"


def _kind_said(task: str, kinds: Counter, filled: int) -> str:
    if task == "extraction":
        return f"{kinds['object']} of {filled} answers are JSON objects"
    if task == "multi_label_classification":
        return f"{kinds['list']} of {filled} answers are lists of labels"
    if task == "classification":
        return "few distinct answers, each repeated"
    if "sentences" in kinds:
        return (f"few distinct answers, but sentences of {kinds['sentences']} words on average: "
                "replies to write, not labels to pick")  # fmt: skip
    return "free-text answers, too many distinct ones to be labels"


def _set_labels(out: Inferred, counts: Counter) -> None:
    if len(counts) < 2:
        raise ValueError(
            f"the answers hold {len(counts)} distinct label(s); a classification task needs "
            "at least 2"
        )
    out.label_counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    out.labels = sorted(counts, key=_label_order)
    rare = [k for k, v in counts.items() if v < 3]
    if rare:
        out.warnings.append(
            f"{len(rare)} label(s) have fewer than 3 examples ({', '.join(sorted(rare)[:5])}"
            f"{', ...' if len(rare) > 5 else ''}): too few to split into train, val and test"
        )
    if all(k.lstrip("-").isdigit() for k in counts):
        out.warnings.append(
            "the labels are numbers: the base model cannot name them zero-shot; write the "
            "label names into the data (or task.label_descriptions) for a fair baseline"
        )


def _label_order(label: str) -> tuple:
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)


def _answer_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def fields_of(objects: list[dict], mixed: list[str] | None = None, at: str = "") -> list[dict]:
    """Extraction fields from target objects: every key in first-seen order, its type from
    its values, required when every object has a non-null value for it; an object value
    nests its own fields. The paths whose values mix types are added to `mixed`."""
    keys = list(dict.fromkeys(k for o in objects for k in o))
    out = []
    for k in keys:
        values = [o.get(k) for o in objects]
        kind = _type_of([v for v in values if v is not None], mixed, f"{at}{k}")
        required = all(v is not None for v in values)
        out.append({"name": k, "type": kind.pop("type"), "required": required, **kind})
    return out


def _type_of(values: list[Any], mixed: list[str] | None = None, at: str = "") -> dict:
    if not values:
        return {"type": "string"}
    if all(isinstance(v, bool) for v in values):
        return {"type": "boolean"}
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return {"type": "integer"}
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return {"type": "number"}
    if all(isinstance(v, str) for v in values):
        if all(_DATE.fullmatch(v) for v in values):
            return {"type": "date"}
        return {"type": "string"}
    if all(isinstance(v, dict) for v in values):
        return {"type": "object", "fields": fields_of(values, mixed, f"{at}.")}
    if all(isinstance(v, list) for v in values):
        items = [x for v in values for x in v]
        inner = _type_of(items, mixed, f"{at}[]") if items else {}
        return (
            {"type": "list", "items": inner}
            if inner.get("type") not in (None, "list")
            else {"type": "list"}
        )
    if mixed is not None:
        mixed.append(at)
    return {"type": "string"}  # mixed: `data` names the rows that do not fit
