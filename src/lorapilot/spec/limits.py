"""The limits a pilot must stay within: data, memory, time, cost and the rental."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

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
    gpu_prices: dict[str, float] = Field(
        default_factory=dict,
        description="Hourly prices in USD by GPU class, for `budget --gpu` (e.g. {h100-80gb: "
        "2.49}); `--price NAME=USD` overrides. lorapilot never invents a price.",
    )

    @field_validator("gpu_prices")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        for name, price in v.items():
            if not math.isfinite(price) or price <= 0:
                raise ValueError(f"{name}: a price must be a positive finite number (got {price})")
        return {name.lower(): price for name, price in v.items()}
