"""The report as Markdown: the same sections and numbers as the HTML, with no image (the
numbers behind each figure are in its tables) and no raw HTML."""

from __future__ import annotations

import re
from typing import Any

from lorapilot.report.blocks import (
    KV,
    NOT_RUN,
    Banner,
    Image,
    Items,
    Mark,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import fmt
from lorapilot.report.sections import build_sections, meta_rows

_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _m(x: Any, cell: bool = False) -> str:
    """Markdown-safe text: no raw HTML (`<` escaped), and in a table cell one line, no `|`."""
    t = x.text if isinstance(x, Mark) else x if isinstance(x, str) else fmt(x)
    t = _TAG_START.sub("&lt;", t)  # `<` that could open a tag or comment; `<= 2` stays readable
    if cell:
        t = " ".join(t.split()).replace("|", "\\|") or " "
    return t


def _md_table(headers: list, rows: list[list]) -> str:
    lines = ["| " + " | ".join(_m(h, True) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_m(c, True) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_block(b: Any) -> str:
    if isinstance(b, Banner):
        return f"### {b.decision or 'NO DECISION YET'}"
    if isinstance(b, Para):
        return f"> {_m(b.text, True)}" if b.cls == "warn" else _m(b.text)
    if isinstance(b, Sub):
        return f"### {_m(b.text)}"
    if isinstance(b, NotRun):
        return f"*{NOT_RUN}: {_m(b.what, True)}*"
    if isinstance(b, Items):
        return "\n".join(f"- {_m(i, True)}" for i in b.items)
    if isinstance(b, KV):
        return _md_table(["item", "value"], [[k, v] for k, v in b.rows])
    if isinstance(b, Table):
        return _md_table(b.headers, b.rows)
    if isinstance(b, Image):
        return f"*Figure in the HTML report: {_m(b.caption, True)}*"
    raise TypeError(f"unknown block {type(b).__name__}")


def render_markdown(state: dict | None) -> str:
    """The report as Markdown: the same sections and numbers as the HTML, tables for figures."""
    state = state if isinstance(state, dict) else {}
    parts = [f"# lorapilot report: {_m(str(state.get('name') or 'pilot'), True)}"]
    meta = [f"{k}: {_m(v, True)}" for k, v in meta_rows(state) if v]
    if meta:
        parts.append(" \u00b7 ".join(meta))
    for _, title, blocks in build_sections(state):
        parts.append(f"## {title}")
        parts += [t for t in (_md_block(b) for b in blocks) if t]
    return "\n\n".join(parts) + "\n"
