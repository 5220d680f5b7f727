"""The blocks a report section is made of: the one model both renderers read.

A section builder (`sections`) returns a list of these plain values; `html_renderer` and
`markdown_renderer` each turn every kind into their format, so the two carry the same content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NOT_RUN = "not run yet"


@dataclass
class Para:
    text: str
    cls: str | None = None


@dataclass
class Sub:
    text: str


@dataclass
class KV:
    rows: list[tuple[str, Any]]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Any]]
    only: str | None = None  # "md": the HTML shows the same numbers as a figure


@dataclass
class Items:
    items: list[str]


@dataclass
class Image:
    draw: Callable[[], str | None]  # drawn only for HTML: Markdown has the numbers in tables
    alt: str
    caption: str


@dataclass
class Banner:
    decision: str | None


@dataclass
class NotRun:
    what: str


@dataclass
class Mark:
    """A yes/no or pass/fail value, coloured in HTML."""

    text: str
    good: bool | None
