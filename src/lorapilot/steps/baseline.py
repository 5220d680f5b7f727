"""`lorapilot baseline`: the unadapted base model on the validation split, outputs and
evaluation protocol kept, so every adapter is compared with the same procedure."""

from __future__ import annotations

from lorapilot.evaluate.session import evaluate_split
from lorapilot.spec import Pilot


def run_baseline(
    pilot: Pilot, *, limit: int | None = None, progress: bool = True, log=None
) -> dict:
    """Evaluate the base model on val inside a `baseline` run (images: a linear probe on the
    frozen features, fitted on train)."""
    return evaluate_split(pilot, "baseline", split="val", limit=limit, progress=progress, log=log)
