"""The pre-registered success criterion and guards, checked on baseline vs candidate (pure).

A rule never raises: a metric that is missing is a failed rule with a detail saying so,
because the report must still show every rule, and a guard that cannot be checked must not
pass. A per-category verdict on a handful of examples is noise, so below `min_support` it is
`insufficient_data`, neither pass nor fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from lorapilot.evaluate.metrics import get_metric
from lorapilot.spec import GuardSpec, SuccessSpec

Status = Literal["pass", "fail", "insufficient_data"]
RuleKind = Literal["min_gain", "max_drop", "min", "max", "max_rise"]
ABSOLUTE = ("min", "max")  # rules that read only the candidate
EXPANDING = ("per_category", "per_field")

# Metrics are ratios of small counts and 0.75 - 0.70 is 0.04999...: without this slack a
# gain of exactly the pre-registered threshold would fail.
_EPS = 1e-9


@dataclass(frozen=True)
class RuleResult:
    """The verdict of one rule on one concrete metric, with the numbers behind it."""

    rule: RuleKind
    """Which rule: min_gain (cand - base >= t), max_drop (base - cand <= t), min (cand >= t),
    max (cand <= t), max_rise (cand - base <= t)."""
    metric: str
    """The concrete metric checked, e.g. `per_category.billing.f1` after expansion."""
    status: Status
    baseline: float | None
    """None when missing (or not needed: a `min` rule reads only the candidate)."""
    candidate: float | None
    threshold: float
    detail: str
    """One line a person reads in the report."""


def _number(metrics: dict, name: str) -> tuple[float | None, str | None]:
    """(value, None) or (None, why it cannot be used)."""
    try:
        value = get_metric(metrics, name)
    except KeyError:
        return None, "missing"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"not a number ({type(value).__name__})"
    if not math.isfinite(value):
        return None, f"not finite ({value})"
    return float(value), None


def _rule(guard: GuardSpec) -> tuple[RuleKind, float]:
    for kind in ("max_drop", "min", "min_gain", "max", "max_rise"):
        value = getattr(guard, kind)
        if value is not None:
            return kind, float(value)
    raise ValueError(f"guard on {guard.metric!r} has no rule")  # GuardSpec forbids this


def _check(
    kind: RuleKind,
    metric: str,
    threshold: float,
    baseline: dict,
    candidate: dict,
    support: int | None = None,
    min_support: int = 0,
) -> RuleResult:
    base, base_why = _number(baseline, metric)
    cand, cand_why = _number(candidate, metric)
    problems = [f"candidate {cand_why}"] if cand_why else []
    if base_why and kind not in ABSOLUTE:
        problems.append(f"baseline {base_why}")
    if problems:
        detail = f"{metric}: cannot check {kind} {threshold:g}: " + ", ".join(problems)
        return RuleResult(kind, metric, "fail", base, cand, threshold, detail)
    assert cand is not None
    if kind == "min":
        ok = cand >= threshold - _EPS
        detail = f"{metric}: {cand:.4f} {'>=' if ok else '<'} min {threshold:g}"
    elif kind == "max":
        ok = cand <= threshold + _EPS
        detail = f"{metric}: {cand:.4f} {'<=' if ok else '>'} max {threshold:g}"
    elif kind == "max_rise":
        assert base is not None
        ok = cand - base <= threshold + _EPS
        detail = f"{metric}: {base:.4f} -> {cand:.4f}, "
        detail += f"rise {cand - base:+.4f} {'<=' if ok else '>'} max_rise {threshold:g}"
    else:
        assert base is not None
        change = cand - base
        if kind == "max_drop":
            ok = -change <= threshold + _EPS
            op = "<=" if ok else ">"
            detail = f"{metric}: {base:.4f} -> {cand:.4f}, "
            detail += f"drop {-change:.4f} {op} max_drop {threshold:g}"
        else:
            ok = change >= threshold - _EPS
            op = ">=" if ok else "<"
            detail = f"{metric}: {base:.4f} -> {cand:.4f}, "
            detail += f"gain {change:+.4f} {op} min_gain {threshold:g}"
    status: Status = "pass" if ok else "fail"
    if support is not None and support < min_support:
        status = "insufficient_data"
        detail += (
            f" ({'pass' if ok else 'fail'} ignored: support {support} < min_support {min_support})"
        )
    return RuleResult(kind, metric, status, base, cand, threshold, detail)


def _support(group: Any, key: str) -> int | None:
    entry = group.get(key) if isinstance(group, dict) else None
    value = entry.get("support") if isinstance(entry, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _expand(metric: str, baseline: dict, candidate: dict) -> list[tuple[str, int | None]]:
    """The concrete metrics a guard's metric stands for, each with its support (or None).

    `per_category.f1` stands for `per_category.<c>.f1` for every category c (the
    candidate's, then any only the baseline has); `per_category.billing.f1` names one.
    """
    head, _, rest = metric.partition(".")
    if head not in EXPANDING or not rest:
        return [(metric, None)]
    cand_group, base_group = candidate.get(head), baseline.get(head)
    keys = list(cand_group) if isinstance(cand_group, dict) else []
    if isinstance(base_group, dict):
        keys += [k for k in base_group if k not in keys]
    for key in sorted(keys, key=len, reverse=True):  # longest first: a label may hold a dot
        if rest.startswith(key + "."):
            return [(metric, _support(cand_group, key))]
    if not keys or "." in rest:
        return [(metric, None)]  # nothing to expand over: checked as named, fails as missing
    return [(f"{head}.{key}.{rest}", _support(cand_group, key)) for key in keys]


def check_success(success: SuccessSpec, baseline: dict, candidate: dict) -> RuleResult:
    """The pre-registered success criterion: candidate - baseline >= min_gain."""
    return _check("min_gain", success.metric, float(success.min_gain), baseline, candidate)


def check_guards(
    guards: list[GuardSpec], baseline: dict, candidate: dict, min_support: int
) -> list[RuleResult]:
    """Every guard, in spec order; a per_category/per_field guard gives one result per entry.

    An entry whose support (its `support` in the candidate's metrics) is below min_support
    is `insufficient_data`.
    """
    results = []
    for guard in guards:
        kind, threshold = _rule(guard)
        for metric, support in _expand(guard.metric, baseline, candidate):
            results.append(
                _check(kind, metric, threshold, baseline, candidate, support, min_support)
            )
    return results


def check_absolute_guards(
    guards: list[GuardSpec], metrics: dict, min_support: int
) -> list[RuleResult]:
    """The guards that need no baseline (`min`, `max`), on one evaluation: the final test,
    where the baseline is not evaluated (the test split is used once, for the chosen
    adapter)."""
    absolute = [g for g in guards if g.min is not None or g.max is not None]
    return check_guards(absolute, metrics, metrics, min_support)
