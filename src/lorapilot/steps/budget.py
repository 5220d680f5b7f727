"""`lorapilot budget` (read-only, no run record): time and cost of the run from the latest
probe, the limits checked, a 3/7/30-day rental plan, and the estimate set against the latest
train run. The figures are gathered by `lorapilot.sizing.estimate`, the arithmetic is `budget`'s."""

from __future__ import annotations

from typing import Any

from lorapilot.sizing.estimate import budget_of
from lorapilot.spec import Pilot


def run_budget(pilot: Pilot, only: list[str] | None = None) -> dict[str, Any]:
    """Time/cost estimate of one training run and of the whole plan (every variant, `only`:
    a subset), limits, 3/7/30-day plans, estimate vs actual."""
    return budget_of(pilot, only)
