"""Reading the pilot state safely: any key may be missing or None in a pilot that has not
run every step yet."""

from __future__ import annotations

from typing import Any

from lorapilot.report.formatting import (
    isnum,
)

MAX_LISTED = 20

# --------------------------------------------------------------------------- reading the state


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _dict(d: dict, key: str) -> dict:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    return v if isinstance(v, list) else []


def _metric(metrics: Any, name: str | None) -> Any:
    """A metric by name; `per_category.billing.f1` style names walk into the dict."""
    if not isinstance(metrics, dict) or not name:
        return None
    if name in metrics:
        return metrics[name]
    return _get(metrics, *name.split("."))


def _numeric_keys(*metrics: Any) -> list[str]:
    keys: list[str] = []
    for m in metrics:
        if isinstance(m, dict):
            keys += [k for k, v in m.items() if isnum(v) and k not in keys]
    return keys
