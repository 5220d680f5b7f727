"""The launch checks' settings: how the smoke test sizes itself to the task."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from lorapilot.spec.common import _Strict

MICRO_BATCH = 16  # the smoke's examples per step (fewer when it has fewer)
AUTO_PASSES = 20  # memorising a few dozen examples at lr 2e-3 takes 5-15 passes (measured)
AUTO_MIN_STEPS, AUTO_MAX_STEPS = 40, 300


class SmokeSpec(_Strict):
    """The smoke test: overfit a few training examples through the real train and eval code.
    It proves wiring (labels, loss mask, evaluation prompt), not quality; `run` stops when it
    fails, and a pilot whose latest smoke failed is at most INCONCLUSIVE."""

    per_category: int = Field(
        1, ge=1, le=16, description="Training examples taken from every category."
    )
    min_examples: int = Field(
        8,
        ge=1,
        le=256,
        description="At least this many, topped up from the other examples "
        "when the categories are few (an extraction task whose fields are all required has one).",
    )
    max_examples: int = Field(
        64, ge=1, le=1024, description="At most this many (many labels: a seeded sample of them)."
    )
    max_steps: Annotated[int, Field(ge=1, le=10_000)] | Literal["auto"] = Field(
        "auto",
        description="Optimizer steps at most; auto: 20 passes over the examples (micro-batch "
        "16), at least 40 and at most 300. Training stops as soon as a step's loss is below "
        "0.01 and every example is reproduced by the evaluation.",
    )
    lr: float = Field(2e-3, gt=0, le=1, description="A learning rate fit for memorising.")

    def examples_for(self, n_categories: int, n_train: int) -> int:
        """How many examples the smoke takes from `n_train` training examples in
        `n_categories` categories (as data.audit.smoke_sample picks them)."""
        wanted = max(self.min_examples, min(self.max_examples, self.per_category * n_categories))
        return min(n_train, wanted) if n_train else wanted

    def steps_for(self, n_examples: int) -> int:
        """`max_steps`, or `auto`: AUTO_PASSES passes over the examples at MICRO_BATCH a step,
        within [AUTO_MIN_STEPS, AUTO_MAX_STEPS]: the most the smoke trains (it stops earlier
        once every example is reproduced)."""
        if self.max_steps != "auto":
            return int(self.max_steps)
        per_pass = math.ceil(max(1, n_examples) / MICRO_BATCH)
        return max(AUTO_MIN_STEPS, min(AUTO_MAX_STEPS, AUTO_PASSES * per_pass))
