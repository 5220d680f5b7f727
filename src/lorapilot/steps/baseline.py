"""`lorapilot baseline`: the unadapted base model on the validation split, outputs and
evaluation protocol kept, so every adapter is compared with the same procedure."""

from __future__ import annotations

from lorapilot.evaluate.session import evaluate_split
from lorapilot.spec import Pilot


def run_baseline(
    pilot: Pilot,
    *,
    limit: int | None = None,
    progress: bool = True,
    log=None,
    shots: int = 0,
    linear_probe: bool = False,
) -> dict:
    """Evaluate the base model on val inside a `baseline` run (images: a linear probe on the
    frozen features, fitted on train). `shots`: K training examples shown before every
    prompt; such a run is the prompting alternative the report sets the adapter against,
    never the baseline of the success criterion (the zero-shot one, pre-registered).
    `linear_probe`: a logistic regression on the base's prompt features fitted on train, the
    embedding-classifier alternative, likewise set beside the adapter (text classification)."""
    return evaluate_split(
        pilot, "baseline", split="val", limit=limit, progress=progress, log=log, shots=shots,
        linear_probe=linear_probe,
    )  # fmt: skip
