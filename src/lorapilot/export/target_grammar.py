"""An extraction pilot's answer shape for the servers that constrain generation to it: a GBNF
grammar (llama.cpp's `--grammar-file`) and a JSON Schema (Ollama's `format`, an OpenAI-style
`response_format`, llama-server's `json_schema`). Pure.

The grammar is the answer exactly as the adapter was trained to write it (`format.answer_text`):
one object, the spec's fields in the spec's order, every field present (an absent optional
one as null), `", "` and `": "` between items, no other whitespace; dates YYYY-MM-DD; an enum
one of its strings; a required field never null. The schema states the same types without the
layout (a server's own converter chooses whitespace and key order), as the data step checks
the targets against it.
"""

from __future__ import annotations

import json

from lorapilot.data.targets import answer_schema, is_text_target
from lorapilot.evaluate.served import gbnf_literal
from lorapilot.spec import FieldSpec, TaskSpec, ValueSpec

PRIMITIVES = r"""string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
int ::= "0" | [1-9] [0-9]{0,15}
number ::= "-"? int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
integer ::= "-"? int
boolean ::= "true" | "false"
date ::= "\"" [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) "\""
value ::= object | array | string | number | boolean | "null"
object ::= "{" (string ": " value (", " string ": " value)*)? "}"
array ::= "[" (value (", " value)*)? "]"
"""
"""Scalars and any JSON value (an untyped list's items, a map without a value type), written
as json.dumps(..., separators=(", ", ": ")) writes them."""


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Rules:
    """GBNF rules named after the fields' paths (`line-items-item ::= ...`)."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def name(self, path: str) -> str:
        # GBNF rule names are ASCII letters, digits and dashes
        base = "".join(c if c.isascii() and c.isalnum() else "-" for c in path.lower())
        base = base.strip("-") or "field"
        name, n = base, 1
        while name in self.rules or name in _RESERVED:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = ""
        return name

    def value(self, v: ValueSpec, path: str) -> str:
        if v.or_list:
            one = self._scalar(v)
            return f'({one} | "[" ({one} (", " {one})*)? "]")'
        if v.type == "object":
            rule = self.name(path)
            self.rules[rule] = self.object(v.fields or [], path)
            return rule
        if v.type == "list":
            if v.items is None:
                return "array"
            item = self.value(v.items, path + "-item")
            return f'"[" ({item} (", " {item})*)? "]"'
        if v.type == "map":
            val = "value" if v.values is None else self.value(v.values, path + "-value")
            return f'"{{" (string ": " {val} (", " string ": " {val})*)? "}}"'
        return self._scalar(v)

    @staticmethod
    def _scalar(v: ValueSpec) -> str:
        if v.type == "string" and v.enum:
            return "(" + " | ".join(gbnf_literal(_json(e)) for e in v.enum) + ")"
        return v.type  # string, number, integer, boolean, date: rules of PRIMITIVES

    def object(self, fields: list[FieldSpec], path: str) -> str:
        parts = []
        for i, f in enumerate(fields):
            key = ("{" if i == 0 else ", ") + _json(f.name) + ": "
            val = self.value(f, f"{path}-{f.name}" if path else f.name)
            if not f.required:
                val = f'({val} | "null")'
            parts.append(f"{gbnf_literal(key)} {val}")
        return " ".join(parts) + ' "}"'


_RESERVED = {"root", *(line.split(" ::=")[0] for line in PRIMITIVES.splitlines() if line)}


def gbnf_of(task: TaskSpec) -> str | None:
    """The grammar of an extraction task with `fields` (None for others: a classification, a
    regex-checked format, a target given only as task.json_schema, whose key order the
    training data chooses)."""
    if task.labelled or not task.fields:
        return None
    rules = _Rules()
    root = rules.object(task.fields, "")
    lines = [f"root ::= {root}"]
    lines += [f"{name} ::= {body}" for name, body in rules.rules.items()]
    return "\n".join(lines) + "\n" + PRIMITIVES


def json_schema_of(task: TaskSpec) -> dict | None:
    """The JSON Schema of a JSON answer as the adapter writes it (data.targets.answer_schema:
    task.json_schema, else built from task.fields with every key present); None for a label
    or a regex-checked text."""
    if task.labelled or is_text_target(task):
        return None
    return answer_schema(task)
