"""The report as one self-contained HTML page: inline CSS (`style.CSS`), figures as data
URIs, no external URL and no script (a Content-Security-Policy forbids both); every user
text is escaped."""

from __future__ import annotations

import html
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
from lorapilot.report.style import CSS

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _h(x: Any) -> str:
    return html.escape(x if isinstance(x, str) else fmt(x), quote=True)


def _hcell(x: Any, tag: str = "td") -> str:
    if isinstance(x, Mark):
        cls = {True: "good", False: "bad"}.get(x.good)  # type: ignore[arg-type]
        inner = f'<span class="{cls}">{_h(x.text)}</span>' if cls else _h(x.text)
        return f"<{tag}>{inner}</{tag}>"
    return f"<{tag}>{_h(x)}</{tag}>"


def _html_block(b: Any) -> str:
    if isinstance(b, Banner):
        cls = b.decision if b.decision in ("GO", "NO-GO", "INCONCLUSIVE") else "NONE"
        return f'<div class="banner {cls}">{_h(b.decision or "NO DECISION YET")}</div>'
    if isinstance(b, Para):
        return f'<p class="{_h(b.cls)}">{_h(b.text)}</p>' if b.cls else f"<p>{_h(b.text)}</p>"
    if isinstance(b, Sub):
        return f"<h3>{_h(b.text)}</h3>"
    if isinstance(b, NotRun):
        return f'<p class="notrun">{_h(NOT_RUN)}: {_h(b.what)}</p>'
    if isinstance(b, Items):
        return "<ul>" + "".join(f"<li>{_h(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, KV):
        rows = "".join(f"<tr>{_hcell(k, 'th')}{_hcell(v)}</tr>" for k, v in b.rows)
        return f'<table class="kv">{rows}</table>'
    if isinstance(b, Table):
        if b.only == "md":
            return ""
        head = "".join(_hcell(h, "th") for h in b.headers)
        body = "".join("<tr>" + "".join(_hcell(c) for c in row) + "</tr>" for row in b.rows)
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f'<div class="scroll">{table}</div>'
    if isinstance(b, Image):
        try:
            uri = b.draw()
        except Exception as e:  # a figure that fails leaves its tables in place
            why = f"{_h(type(e).__name__)}: {_h(e)}"
            return f'<p class="warn">figure {_h(b.alt)} could not be drawn: {why}</p>'
        if not (isinstance(uri, str) and uri.startswith("data:image/png;base64,")):
            return f'<p class="notrun">no figure: {_h(b.alt)} has nothing to draw</p>'
        return (
            f'<figure><img src="{uri}" alt="{_h(b.alt)}">'
            f"<figcaption>{_h(b.caption)}</figcaption></figure>"
        )
    raise TypeError(f"unknown block {type(b).__name__}")


def render_html(state: dict | None) -> str:
    """The report as one self-contained HTML page (no external URL, no script)."""
    state = state if isinstance(state, dict) else {}
    sections = build_sections(state)
    name = str(state.get("name") or "pilot")
    meta = " \u00b7 ".join(f"{k}: {_h(v)}" for k, v in meta_rows(state) if v)
    toc = "".join(f'<li><a href="#{sid}">{_h(title)}</a></li>' for sid, title, _ in sections)
    body = "\n".join(
        f'<section id="{sid}">\n<h2>{_h(title)}</h2>\n'
        + "\n".join(_html_block(b) for b in blocks)
        + "\n</section>"
        for sid, title, blocks in sections
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>lorapilot report: "
        f"{_h(name)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        f'<header>\n<h1>lorapilot report: {_h(name)}</h1>\n<p class="meta">{meta}</p>\n'
        f"<nav><ol>{toc}</ol></nav>\n</header>\n{body}\n</main>\n</body>\n</html>\n"
    )
