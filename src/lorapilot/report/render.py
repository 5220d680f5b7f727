"""The deliverable: the pilot state (`collect.collect`, plus `budget`) as HTML and Markdown.

Both formats are built from one list of sections (`build_sections`), each a list of plain
blocks (paragraphs, key/value tables, tables, lists, images), so they carry the same content.
The HTML is one self-contained file: inline CSS, figures as data URIs, no external URL and
no script (a Content-Security-Policy forbids both); every user text is escaped. The Markdown
has no images: the numbers behind each figure are in its tables.

Any key of the state may be missing or None (a pilot that has not trained yet): its section
then says "not run yet" and which verb fills it. A section that cannot be rendered from odd
data says so in place of its content instead of failing the whole report.

This module is the entry point; the work is split by idea:

- `blocks`: the block types a section is made of (the model both renderers read);
- `formatting`: numbers and values as the report prints them (`fmt`, `fsec`, `fbytes`, ...);
- `sections`: the state turned into sections of blocks (`SECTIONS`, `build_sections`);
- `html_renderer` and `style`: blocks as one HTML page, and its stylesheet;
- `markdown_renderer`: blocks as Markdown.
"""

from __future__ import annotations

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
from lorapilot.report.formatting import DASH, fbytes, fdelta, fmt, fpct, fraw, fsec, fusd, mark
from lorapilot.report.html_renderer import CSP, render_html
from lorapilot.report.markdown_renderer import render_markdown
from lorapilot.report.sections import MAX_LISTED, SECTIONS, build_sections
from lorapilot.report.style import CSS

__all__ = [
    "CSP",
    "CSS",
    "DASH",
    "KV",
    "MAX_LISTED",
    "NOT_RUN",
    "SECTIONS",
    "Banner",
    "Image",
    "Items",
    "Mark",
    "NotRun",
    "Para",
    "Sub",
    "Table",
    "build_sections",
    "fbytes",
    "fdelta",
    "fmt",
    "fpct",
    "fraw",
    "fsec",
    "fusd",
    "mark",
    "render_html",
    "render_markdown",
]
