"""docs/spec-reference.md, made from the spec's JSON Schema: every key of pilot.yaml with its
type, default and description, one table per top-level section. `lorapilot schema --reference`
prints it; a test fails when the file in docs/ is not what the schema gives today."""

from __future__ import annotations

import json
from typing import Any

from lorapilot.spec.load import json_schema

HEADER = """# pilot.yaml reference

Every key of a pilot spec, with its type, default and description. Generated from the spec's
pydantic models; do not edit by hand. Regenerate with:

```bash
lorapilot schema --reference > docs/spec-reference.md
```

Keys are dotted paths (`train.lr`, the form `--set` and `variants` take); `[]` marks the items
of a list. A key without a default is required where its section is given. `lorapilot schema`
prints the JSON Schema itself; `lorapilot check PILOT` validates a spec against it.
"""


def _resolve(node: dict, defs: dict) -> dict:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _type(node: dict, defs: dict) -> str:
    """A short, readable type: `integer`, `auto | on | off`, `list[GuardSpec]`, `string | null`."""
    if "$ref" in node:
        return node["$ref"].rsplit("/", 1)[-1]
    if "enum" in node:
        return " \\| ".join(json.dumps(v) if not isinstance(v, str) else v for v in node["enum"])
    if "const" in node:
        return json.dumps(node["const"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            return " \\| ".join(_type(n, defs) for n in node[key])
    t = node.get("type")
    if t == "array":
        items = node.get("items")
        return f"list[{_type(items, defs)}]" if items else "list"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string, {_type(node['additionalProperties'], defs)}]"
    return str(t or "any")


def _objects(node: dict, defs: dict) -> list[tuple[str, str, dict]]:
    """The object schemas a field may hold, as (path suffix, model name, schema): the object
    itself, `[]` for a list's items, or a union's object members."""
    out: list[tuple[str, str, dict]] = []
    for n in node.get("anyOf") or node.get("oneOf") or [node]:
        name = n.get("$ref", "").rsplit("/", 1)[-1]
        r = _resolve(n, defs)
        if r.get("type") == "array" and isinstance(r.get("items"), dict):
            out += [("[]" + s, m, o) for s, m, o in _objects(r["items"], defs)]
        elif "properties" in r:
            out.append(("", name, r))
    return out


def _default(field: dict, defs: dict) -> str:
    """The default as YAML would write it; a default built by a factory is not in the schema:
    an empty list, or an object whose keys carry their own defaults."""
    if "default" in field:
        return f"`{json.dumps(field['default'])}`"
    return "`[]`" if _resolve(field, defs).get("type") == "array" else "its keys' defaults"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def rows(schema: dict | None = None) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every key, depth first, in model order."""
    schema = schema or json_schema()
    defs = schema.get("$defs", {})
    out: list[tuple[str, str, str, str]] = []

    def walk(obj: dict, prefix: str, models: dict[str, str]) -> None:
        """`models`: the models being expanded above this one, with the key of each."""
        required = set(obj.get("required", []))
        for name, field in obj.get("properties", {}).items():
            key = f"{prefix}{name}"
            default = "required" if name in required else _default(field, defs)
            subs = _objects(field, defs)
            desc = field.get("description") or next(
                (s.get("description", "") for _, _, s in subs if s.get("description")), ""
            )
            again = [models[m] for _, m, _ in subs if m in models]  # recursive: not again
            if again:
                desc = f"{desc} (nested: the keys of `{again[0]}`)".strip()
            out.append((key, _type(field, defs), default, _cell(desc)))
            for suffix, model, sub in subs:
                if model not in models:
                    walk(sub, f"{key}{suffix}.", {**models, model: f"{key}{suffix}"})

    walk(schema, "", {})
    return out


def markdown(schema: dict | None = None) -> str:
    """The whole reference page: a table per top-level key."""
    lines = [HEADER]
    section = None
    for key, typ, default, desc in rows(schema):
        top = key.split(".", 1)[0].split("[", 1)[0]
        if top != section:
            section = top
            lines += [
                "",
                f"## `{top}`",
                "",
                "| key | type | default | description |",
                "|---|---|---|---|",
            ]
        lines.append(f"| `{key}` | {typ} | {default} | {desc} |")
    return "\n".join(lines) + "\n"
