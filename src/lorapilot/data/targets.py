"""What a valid target is, and which category an example belongs to (pure, no I/O).

The target schema is derived once from the spec so that the loader, the evaluator and the
prompt all agree on one definition of a well-formed answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from lorapilot.errors import UsageError
from lorapilot.spec import FieldSpec, TaskSpec, ValueSpec

DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"  # `\d` is any Unicode digit, and converters
# of schemas to grammars (llama-cpp-python's) do not all read it
_TYPES = {
    "string": {"type": "string"},
    "number": {"type": "number"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "date": {"type": "string", "pattern": DATE_PATTERN},
    "list": {"type": "array"},
}
_MAX_PROBLEMS = 5
_MAX_MESSAGE = 200


def is_text_target(task: TaskSpec) -> bool:
    """A format task with only a regex: the target is the output string itself, not an object."""
    return task.text_target


def target_schema(task: TaskSpec) -> dict:
    """JSON schema of an extraction/format target: task.json_schema, else built from task.fields.

    Optional fields may be null or absent; required ones must be present and non-null, and
    unknown keys are refused, so a typo in a target cannot pass as a missed field. Nested
    fields (object, list with items, map) get the same rules at every level.
    """
    if task.json_schema is not None:
        return task.json_schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **_object_schema(task.fields or [], answer=False),
    }


def answer_schema(task: TaskSpec) -> dict:
    """JSON schema of the answer the adapter is trained to write (format.answer_text): every
    declared key present, at every level, an absent optional one as null. It is what a server
    holds answers to (schema.json of `export --gguf`): schema-to-grammar converters put
    required keys before optional ones (llama-cpp-python's), so a schema with optional keys
    would force another order than the one trained on; OpenAI's strict mode asks the same."""
    if task.json_schema is not None:
        return task.json_schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **_object_schema(task.fields or [], answer=True),
    }


def _object_schema(fields: list[FieldSpec], answer: bool) -> dict:
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in fields:
        prop = _value_schema(field, answer)
        if field.required or answer:
            required.append(field.name)
        if not field.required:
            prop = _nullable(prop)
        if field.description:
            prop["description"] = field.description
        properties[field.name] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _nullable(prop: dict) -> dict:
    """A value or null. A bare type becomes `[type, "null"]`; anything with more to it (an
    enum, a date's pattern, items, properties) an `anyOf` with null: schema-to-grammar
    converters (llama-cpp-python's) read a type list as bare types and drop the rest."""
    if "anyOf" in prop:
        return prop | {"anyOf": [*prop["anyOf"], {"type": "null"}]}
    if set(prop) == {"type"} and isinstance(prop["type"], str):
        return {"type": [prop["type"], "null"]}
    return {"anyOf": [prop, {"type": "null"}]}


def _value_schema(spec: ValueSpec, answer: bool) -> dict:
    if spec.type == "object":
        return _object_schema(spec.fields or [], answer)
    if spec.type == "map":
        values = _value_schema(spec.values, answer) if spec.values is not None else {}
        return {"type": "object", "additionalProperties": values}
    if spec.type == "list" and spec.items is not None:
        return {"type": "array", "items": _value_schema(spec.items, answer)}
    if spec.or_list:  # `string | list`: one value or a non-empty list of them
        one = _scalar_schema(spec)
        return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
    return _scalar_schema(spec)


def _scalar_schema(spec: ValueSpec) -> dict:
    """A scalar's type; a string's `enum` is its closed set (a target outside it is refused
    by the data step, a prediction outside it is not schema-valid)."""
    out = dict(_TYPES[spec.type])
    if spec.enum:
        out["enum"] = list(spec.enum)
    return out


def _where(path: Any) -> str:
    out = "target"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _short(message: str) -> str:
    # jsonschema quotes the offending value; a 1 MiB string must not become a 1 MiB message.
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 1] + "…"


def target_validator(task: TaskSpec) -> Callable[[Any], list[str]]:
    """Build the check once (schema compiled, checked) -> function obj -> problems.

    Raises UsageError when task.json_schema is not itself a valid JSON schema.
    """
    if is_text_target(task):
        pattern = re.compile(task.regex or "")

        def check_text(obj: Any) -> list[str]:
            if not isinstance(obj, str):
                return [f"target must be a string, got {json_type(obj)}"]
            match = pattern.fullmatch(obj)
            if not match:
                return [_short(f"target {obj!r} does not match task.regex")]
            if task.answer_group and not (match.group("answer") or "").strip():
                why = f"target {obj!r} matches task.regex but its `answer` group is empty"
                return [_short(why)]
            return []

        return check_text

    schema = target_schema(task)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise UsageError(f"task.json_schema: not a valid JSON schema: {e.message}") from None
    validator = Draft202012Validator(schema)

    def check(obj: Any) -> list[str]:
        errors = sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
        errors = [_unwrapped(e) for e in errors]
        problems = [_short(f"{_where(e.absolute_path)}: {e.message}") + _hint(e) for e in errors]
        if len(problems) > _MAX_PROBLEMS:
            problems = problems[:_MAX_PROBLEMS] + [f"... {len(problems) - _MAX_PROBLEMS} more"]
        return problems

    return check


def _unwrapped(error: Any) -> Any:
    """A non-null value of a nullable field (`anyOf` [schema, null]) is wrong for the schema's
    own reason: that error, not "is not valid under any of the given schemas"."""
    branches = error.validator_value if error.validator == "anyOf" else None
    if not branches or error.instance is None or not error.context:
        return error
    real = [i for i, b in enumerate(branches) if b != {"type": "null"}]
    if len(real) != 1 or len(branches) != 2:
        return error
    inner = [c for c in error.context if c.schema_path and c.schema_path[0] == real[0]]
    return _unwrapped(inner[0]) if inner else error


def _hint(error: Any) -> str:
    """What to write in the spec when a map's scalar value comes as a list (a slot named
    twice in one example: 4 of the 2,800 SNIPS train/validate rows), or a value is not one of
    its field's `enum`."""
    path = list(error.absolute_schema_path)
    if error.validator == "enum":
        return (
            " (not one of the field's `enum` in the spec: add the value there if it is a "
            "category, else correct the row)"
        )
    if (
        error.validator == "type"
        and isinstance(error.instance, list)
        and "additionalProperties" in path
        and error.validator_value in ("string", "number", "integer", "boolean")
    ):
        kind = error.validator_value
        return (
            f" (a map value given as a list: if a key may hold several values, declare the "
            f"map's `values: {kind} | list`, scored as a multiset)"
        )
    return ""


def validate_target(obj: Any, task: TaskSpec) -> list[str]:
    """Problems of one target, each naming the field (empty list = valid).

    For many targets build the check once with `target_validator(task)`.
    """
    return target_validator(task)(obj)


def category_of(
    label: str | None,
    target: Any,
    task: TaskSpec,
    by: str | None = None,
    row: dict | None = None,
) -> str:
    """The stratum of an example: its label; for other tasks `data.category` (`by`: a column
    of the raw row, or `target.<path>`), else which optional fields its target fills.

    Splitting and per-category metrics use it, so rare shapes of target (e.g. invoices with
    a discount) reach val and test instead of all landing in train by chance. A category
    that is a list or an object is a ValueError naming it; a missing one is `none`.
    """
    if task.multi_label:  # provisional: multi_label_strata sets the rarest of its labels
        if not target:
            raise ValueError("a multi-label example needs a label")
        return target[0]
    if task.labelled:
        if label is None:
            raise ValueError("a classification example needs a label")
        return label
    if by is not None:
        if by.startswith("target."):
            value: Any = target
            for key in by[len("target.") :].split("."):
                value = value.get(key) if isinstance(value, dict) else None
        else:
            if row is None or by not in row:
                raise ValueError(f"missing field {by!r} (data.category)")
            value = row[by]
        if isinstance(value, dict | list):
            raise ValueError(f"data.category {by!r} is {json_type(value)}, not a category name")
        if value is None:
            return "none"
        return value if isinstance(value, str) else json.dumps(value)
    if not task.fields:
        return "all"
    present = sorted(
        f.name
        for f in task.fields
        if not f.required and isinstance(target, dict) and target.get(f.name) is not None
    )
    return "+".join(present) or "required_only"


def json_type(value: Any) -> str:
    """JSON's name for a Python value's type, for messages users read."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def string_values(value: Any) -> list[str]:
    """Every string leaf of a value, at any depth (map keys are names, not values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in string_values(v)]
    if isinstance(value, list):
        return [s for v in value for s in string_values(v)]
    return []


def grounded_strings(value: Any, spec: Any, grounded: bool = True) -> list[str]:
    """The string leaves of a value that `task.grounded` counts: free text only. A value's
    `grounded` (ValueSpec) decides for it and what it holds; unset, a value inherits its
    parent's, and a string with an `enum` (a closed set: an intent, a status) is never
    counted. Keys and values the spec does not declare are counted as the parent says."""
    own = grounded
    if spec is not None:
        if spec.grounded is not None:
            own = spec.grounded
        elif spec.enum:
            own = False
    if isinstance(value, str):
        return [value] if own else []
    if isinstance(value, dict):
        fields = {f.name: f for f in (spec.fields or [])} if spec is not None else {}
        child = spec.values if spec is not None and spec.type == "map" else None
        return [s for k, v in value.items() for s in grounded_strings(v, fields.get(k, child), own)]
    if isinstance(value, list):
        item = spec.items if spec is not None else None
        return [s for v in value for s in grounded_strings(v, item, own)]
    return []


def grounded_in(value: str, text: str) -> bool:
    """Whether a string value appears in the input text (casefolded, whitespace collapsed)."""
    needle = " ".join(value.split()).casefold()
    return not needle or needle in " ".join(text.split()).casefold()
