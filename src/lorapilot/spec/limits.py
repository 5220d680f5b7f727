"""The limits a pilot must stay within: data, memory, time, cost and the rental."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from lorapilot.spec.common import _Strict


class LimitsSpec(_Strict):
    """What a run may use: memory, time, money, and the rental the plan must fit."""

    memory_gb: float | None = Field(None, gt=0, description="Peak memory allowed per device.")
    time_hours: float | None = Field(None, gt=0, description="Wall time allowed for one run.")
    usd_per_hour: float = Field(0.0, ge=0, description="Rental price.")
    cost_cap_usd: float | None = Field(
        None, gt=0, description="Cost allowed for one run at usd_per_hour."
    )
    rental_days: Literal[3, 7, 30] = Field(
        7, description="The rental the plan must fit (`run` refuses a plan that does not)."
    )
    margin: float = Field(0.2, ge=0, description="Safety margin on estimates (fraction).")
    window: str | None = Field(None, description="The agreed operating window, free text.")
