"""Numbers and values as the report prints them (the same text in HTML and Markdown)."""

from __future__ import annotations

import math
from typing import Any

from lorapilot.report.blocks import Mark

DASH = "\u2014"


def isnum(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:,.1f}" if abs(x) >= 1000 else f"{x:.{digits}f}"
    if isinstance(x, list | tuple):
        return ", ".join(fmt(v) for v in x) or DASH
    if isinstance(x, dict):
        return ", ".join(f"{k}={fmt(v)}" for k, v in x.items()) or DASH
    return str(x)


def fdelta(x: Any) -> str:
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:+,d}"
    return f"{x:+.3f}" if isnum(x) else DASH


def fraw(x: Any) -> str:
    """A setting as the user wrote it (32, 0.05, 2e-4), not rounded to 3 decimals."""
    return f"{x:g}" if isinstance(x, float) else fmt(x)


def fbytes(b: Any) -> str:
    if not isnum(b):
        return DASH
    gib = b / 2**30
    return f"{gib:.2f} GiB" if gib >= 1 else f"{b / 2**20:.1f} MiB"


def fsec(s: Any) -> str:
    if not isnum(s):
        return DASH
    if abs(s) < 120:
        return f"{s:.2f} s"
    if abs(s) < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def fusd(x: Any) -> str:
    return f"${x:,.2f}" if isnum(x) else DASH


def fpct(x: Any) -> str:
    return f"{100 * x:+.1f}%" if isnum(x) else DASH


def mark(ok: Any, yes: str = "yes", no: str = "no") -> Mark | str:
    if ok is None:
        return DASH
    return Mark(yes if ok else no, bool(ok))


def support_text(rule: dict) -> str:
    """A rule's support as `154 examples` / `15 values checked` (a dash when unknown)."""
    n = rule.get("support")
    return f"{fmt(n)} {rule.get('support_of') or ''}".strip() if isnum(n) else DASH


def ci_text(rule: dict, bootstrap: dict | None = None) -> str:
    """The CI a rule is judged on: of the change (signed) for the relative rules, of the
    value for `min` / `max`; the success criterion's from its bootstrap."""
    low, high = rule.get("ci_low"), rule.get("ci_high")
    if isinstance(bootstrap, dict):
        low, high = bootstrap.get("ci_low"), bootstrap.get("ci_high")
    if not isnum(low) or not isnum(high):
        return DASH
    if rule.get("rule") in ("min", "max"):
        return f"[{fmt(low)}, {fmt(high)}]"
    return f"[{fdelta(low)}, {fdelta(high)}]"
