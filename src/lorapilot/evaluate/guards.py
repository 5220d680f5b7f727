"""The pre-registered success criterion and guards, checked on baseline vs candidate (pure).

A rule never raises: a metric that is missing is a failed rule with a detail saying so,
because the report must still show every rule, and a guard that cannot be checked must not
pass. Every rule carries its support (the examples or values its metric is computed over):
a verdict on a handful of them is noise, so below `min_support` it is `insufficient_data`,
neither pass nor fail. Given a bootstrap CI, a guard is judged as the success criterion
is: it fails only when the whole CI lies beyond its threshold; a miss the CI cannot
confirm is `within_noise`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from lorapilot.evaluate.metrics import get_metric
from lorapilot.spec import GuardSpec, SuccessSpec

Status = Literal["pass", "fail", "insufficient_data", "within_noise"]
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
    support: int | None = None
    """How many examples or values the candidate's metric is computed over (None: unknown)."""
    support_of: str | None = None
    """What `support` counts: `examples`, `gold values`, `predicted values` or `values
    checked` (the predicted strings a grounding rate looked for in the input)."""
    ci_low: float | None = None
    """Bootstrap CI of what the rule compares: the change (candidate - baseline) for the
    relative rules, the candidate's value for `min` / `max`. None: no CI (no paired rows)."""
    ci_high: float | None = None


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


# What a metric's support counts, by the name of its last part: a precision is over what the
# model predicted, a recall or F1 over what gold holds, a grounding rate over the predicted
# strings it checked; everything else over examples.
_COUNTED = (
    ("precision", "predicted", "predicted values"),
    ("recall", "gold", "gold values"),
    ("f1", "gold", "gold values"),
)


def support_of(metrics: dict, name: str) -> tuple[int | None, str | None]:
    """(how many examples or values `name` is computed over, what they are) from the counts
    beside it in the same metrics dict; (None, None) when they are not there."""
    count, unit = _support(metrics, name)
    return (count, unit) if count is not None else (None, None)


def _support(metrics: dict, name: str) -> tuple[int | None, str | None]:
    parent: Any = metrics
    key = name
    head, _, rest = name.partition(".")
    if head in EXPANDING and rest:
        group = metrics.get(head)
        if not isinstance(group, dict):
            return None, None
        for entry in sorted(group, key=len, reverse=True):  # a label may hold a dot
            if rest.startswith(entry + "."):
                parent, key = group[entry], rest[len(entry) + 1 :]
                break
        else:
            return None, None
    if not isinstance(parent, dict):
        return None, None
    if key == "ungrounded_value_rate":
        return _count(parent.get("grounding_checked")), "values checked"
    for suffix, count, unit in _COUNTED:
        if key.endswith(suffix):
            stem = key[: -len(suffix)]  # `leaf_`, `field_` or '' (per entry)
            # an entry's own counts: `predicted`, and `gold` under its name `support`
            names = [stem + count] if stem else [count, "support"] if count == "gold" else [count]
            for candidate in names:
                if _count(parent.get(candidate)) is not None:
                    if head == "per_category" and not stem:  # a label's examples
                        unit = "examples" if count == "gold" else "predicted examples"
                    return _count(parent.get(candidate)), unit
    if head == "per_category" and parent is not metrics:
        return _count(parent.get("support")), "examples"
    return _count(metrics.get("n")), "examples"


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return round(value)


def _beyond(kind: RuleKind, threshold: float, low: float, high: float) -> bool:
    """Does the whole CI (of the change, or of the value for min/max) lie on the failing side?"""
    if kind == "min":
        return high < threshold - _EPS
    if kind == "max":
        return low > threshold + _EPS
    if kind == "max_drop":
        return -high > threshold + _EPS  # the smallest drop the CI allows
    if kind == "min_gain":
        return high < threshold - _EPS
    return low > threshold + _EPS  # max_rise


def _check(
    kind: RuleKind,
    metric: str,
    threshold: float,
    baseline: dict,
    candidate: dict,
    min_support: int = 0,
    interval: dict | None = None,
) -> RuleResult:
    base, base_why = _number(baseline, metric)
    cand, cand_why = _number(candidate, metric)
    support, unit = support_of(candidate, metric)
    problems = [f"candidate {cand_why}"] if cand_why else []
    if base_why and kind not in ABSOLUTE:
        problems.append(f"baseline {base_why}")
    if problems:
        detail = f"{metric}: cannot check {kind} {threshold:g}: " + ", ".join(problems)
        return RuleResult(kind, metric, "fail", base, cand, threshold, detail, support, unit)
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
    low = high = None
    if interval is not None:
        which = ("value_low", "value_high") if kind in ABSOLUTE else ("ci_low", "ci_high")
        low, high = interval.get(which[0]), interval.get(which[1])
    status: Status = "pass" if ok else "fail"
    if low is not None and high is not None:
        if kind in ABSOLUTE:
            detail += f"; value CI [{low:.4f}, {high:.4f}]"
        else:
            detail += f"; change CI [{low:+.4f}, {high:+.4f}]"
        if not ok and not _beyond(kind, threshold, low, high):
            status = "within_noise"
            detail += " reaches the threshold: the miss may be noise"
    if support is not None:
        detail += f"; support {support} {unit}"
        if support < min_support:
            would = {"pass": "pass", "fail": "fail", "within_noise": "be within noise"}[status]
            detail += f" < min_support {min_support}: too few to judge (it would {would})"
            status = "insufficient_data"
    return RuleResult(kind, metric, status, base, cand, threshold, detail, support, unit, low, high)


def _expand(metric: str, baseline: dict, candidate: dict) -> list[str]:
    """The concrete metrics a guard's metric stands for.

    `per_category.f1` stands for `per_category.<c>.f1` for every category c (the
    candidate's, then any only the baseline has); `per_category.billing.f1` names one.
    """
    head, _, rest = metric.partition(".")
    if head not in EXPANDING or not rest:
        return [metric]
    cand_group, base_group = candidate.get(head), baseline.get(head)
    keys = list(cand_group) if isinstance(cand_group, dict) else []
    if isinstance(base_group, dict):
        keys += [k for k in base_group if k not in keys]
    for key in sorted(keys, key=len, reverse=True):  # longest first: a label may hold a dot
        if rest.startswith(key + "."):
            return [metric]
    if not keys or "." in rest:
        return [metric]  # nothing to expand over: checked as named, fails as missing
    return [f"{head}.{key}.{rest}" for key in keys]


def check_success(success: SuccessSpec, baseline: dict, candidate: dict) -> RuleResult:
    """The pre-registered success criterion: candidate - baseline >= min_gain."""
    return _check("min_gain", success.metric, float(success.min_gain), baseline, candidate)


def guard_metrics(guards: list[GuardSpec], baseline: dict, candidate: dict) -> list[str]:
    """Every concrete metric the guards check (what a bootstrap must resample)."""
    return [m for g in guards for m in _expand(g.metric, baseline, candidate)]


def check_guards(
    guards: list[GuardSpec],
    baseline: dict,
    candidate: dict,
    min_support: int,
    intervals: dict[str, dict] | None = None,
) -> list[RuleResult]:
    """Every guard, in spec order; a per_category/per_field guard gives one result per entry.

    A result whose support is below min_support is `insufficient_data`; with `intervals`
    (bootstrap summaries by concrete metric, `decision.rule.bootstrap_metrics`) a miss whose
    CI reaches the threshold is `within_noise`, without them the point estimate decides.
    """
    results = []
    for guard in guards:
        kind, threshold = _rule(guard)
        for metric in _expand(guard.metric, baseline, candidate):
            interval = (intervals or {}).get(metric)
            results.append(
                _check(kind, metric, threshold, baseline, candidate, min_support, interval)
            )
    return results


def check_absolute_guards(
    guards: list[GuardSpec],
    metrics: dict,
    min_support: int,
    intervals: dict[str, dict] | None = None,
) -> list[RuleResult]:
    """The guards that need no baseline (`min`, `max`), on one evaluation: the final test,
    where the baseline is not evaluated (the test split is used once, for the chosen
    adapter)."""
    absolute = [g for g in guards if g.min is not None or g.max is not None]
    return check_guards(absolute, metrics, metrics, min_support, intervals)
