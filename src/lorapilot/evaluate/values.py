"""Parsing model outputs and comparing values (pure, no I/O): the first JSON object of an
output, and the normalised form in which a gold and a predicted value are compared."""

from __future__ import annotations

import json
from typing import Any

from lorapilot.spec import EvalNormalize


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# strict JSON: Python's default decoder accepts NaN/Infinity, which no other parser would
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_first_json(text: str) -> tuple[Any | None, str | None]:
    """The first JSON object in a model's output -> (object, None) or (None, error).

    Models wrap answers in prose and code fences; decoding at each `{` in turn finds the
    object wherever it starts, and the decoder itself handles nested braces and braces
    inside strings. A `{` that starts no valid object (prose, a broken object) is skipped.
    """
    if not text or not text.strip():
        return None, "empty output"
    start = text.find("{")
    if start < 0:
        return None, "no JSON object in the output"
    first_error = None
    while start >= 0:
        try:
            obj, _ = _DECODER.raw_decode(text, start)
            return obj, None
        except (ValueError, RecursionError) as e:
            if first_error is None:
                message = (
                    e.msg if isinstance(e, json.JSONDecodeError) else str(e) or "too deeply nested"
                )
                first_error = f"invalid JSON at character {start}: {message}"
        start = text.find("{", start + 1)
    return None, first_error


def normalize_value(v: Any, norm: EvalNormalize) -> Any:
    """A value in the form compared for equality, as the spec's eval.normalize asks.

    Strings: strip and collapse whitespace (norm.whitespace), casefold (norm.case); lists:
    items normalised, then sorted (norm.list_order); objects: values normalised. A float
    with an integer value becomes an int, so 1.0 equals 1; numeric strings stay strings
    ("1" is not 1), and booleans stay booleans (True is not 1).
    """
    if isinstance(v, str):
        if norm.whitespace:
            v = " ".join(v.split())
        return v.casefold() if norm.case else v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list | tuple):
        items = [normalize_value(x, norm) for x in v]
        if norm.list_order:
            items.sort(key=canonical_json)
        return items
    if isinstance(v, dict):
        return {k: normalize_value(x, norm) for k, x in v.items()}
    return v


def canonical_json(v: Any) -> str:
    # JSON text tells True from 1 (Python's == does not) and orders mixed-type lists.
    return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)


def values_equal(a: Any, b: Any, norm: EvalNormalize) -> bool:
    """Equality after normalize_value on both sides (None equals only None)."""
    return canonical_json(normalize_value(a, norm)) == canonical_json(normalize_value(b, norm))


def canonical(v: Any, norm: EvalNormalize) -> str:
    """The comparable form of a value: normalised, then canonical JSON text."""
    return canonical_json(normalize_value(v, norm))
