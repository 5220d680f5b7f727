"""Early stopping on the validation loss: when to stop, and which step's weights to keep.

Pure: the loop feeds it every validation point after step 0 and asks whether to stop; the
checkpoint keeps its state (`to_dict`), so a resumed run stops where the uninterrupted one
would have. Step 0 (the untrained adapter) is never "the best": restoring it would hand
back the base model as the adapter.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class EarlyStop:
    """Counts validation points without a better val loss (lower by more than `min_delta`
    than the best so far); `exhausted` once `patience` of them come in a row."""

    patience: int
    min_delta: float = 0.0
    best_step: int | None = None
    best_val_loss: float | None = None
    bad_points: int = 0  # validation points in a row since the best
    points: int = 0  # validation points seen (after step 0)

    def observe(self, step: int, val_loss: float | None) -> bool:
        """Take the val loss at `step`; True when it is the new best. A missing val loss
        (no validation examples) counts as no improvement."""
        if step <= 0:
            return False
        self.points += 1
        better = val_loss is not None and (
            self.best_val_loss is None or val_loss < self.best_val_loss - self.min_delta
        )
        if better:
            self.best_step, self.best_val_loss, self.bad_points = step, val_loss, 0
        else:
            self.bad_points += 1
        return better

    @property
    def exhausted(self) -> bool:
        return self.bad_points >= self.patience

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EarlyStop:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})
