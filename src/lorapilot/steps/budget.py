"""`lorapilot budget` (read-only, no run record): time and cost of the run from the latest
probe, the limits checked, a 3/7/30-day rental plan, and the estimate set against the latest
train run. The figures are gathered by `lorapilot.sizing.estimate`, the arithmetic is `budget`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot.errors import UsageError
from lorapilot.sizing.estimate import budget_of
from lorapilot.sizing.gpus import gpu_classes, select
from lorapilot.sizing.rental import pre_rental
from lorapilot.spec import Pilot


def run_budget(pilot: Pilot, only: list[str] | None = None) -> dict[str, Any]:
    """Time/cost estimate of one training run and of the whole plan (every variant, `only`:
    a subset), limits, 3/7/30-day plans, estimate vs actual."""
    return budget_of(pilot, only)


def parse_prices(items: list[str], known: set[str]) -> dict[str, float]:
    """`--price NAME=USD` values -> {name: usd}; a malformed one or an unknown class is exit 2."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            usd = float(value)
        except ValueError:
            usd = -1.0
        if not sep or not name.strip() or not usd > 0 or usd == float("inf"):
            raise UsageError(
                f"--price {item}: expected NAME=USD with a positive price, e.g. h100-80gb=2.49"
            )
        if name.strip().lower() not in known:
            raise UsageError(
                f"--price {item}: unknown GPU class {name!r}; known: {', '.join(sorted(known))}"
            )
        out[name.strip().lower()] = usd
    return out


def run_pre_rental(
    pilot: Pilot, gpu: str, prices: list[str], gpu_spec: Path | None = None
) -> dict[str, Any]:
    """Which GPU class fits the plan, how long it takes and what it costs, before renting:
    the classes asked (`all`), prices from limits.gpu_prices overridden by --price."""
    classes = gpu_classes(gpu_spec)
    chosen = select(gpu, classes)
    known = {c.name.lower() for c in classes}
    spec_prices = pilot.spec.limits.gpu_prices
    unknown = sorted(set(spec_prices) - known)
    if unknown:
        raise UsageError(
            f"{pilot.spec_path}: limits.gpu_prices: unknown GPU class {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    return pre_rental(pilot, chosen, {**spec_prices, **parse_prices(prices, known)})
