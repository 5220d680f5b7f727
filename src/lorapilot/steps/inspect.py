"""`lorapilot inspect`: examples per category after the exact preprocessing. Text: template,
truncation and the tokens that carry the loss, each checked to decode to its answer; images:
the properties per category and a contact sheet per category of originals beside what the
model sees. No run record (image contact sheets go to PILOT/inspect/ or `--out`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot.data.shots import refuse_shots_for_images
from lorapilot.modality import modality_of
from lorapilot.spec import Pilot


def run_inspect(
    pilot: Pilot,
    per_category: int = 2,
    split: str = "train",
    seed: int = 0,
    out: Path | None = None,
    shots: int = 0,
) -> dict[str, Any]:
    """Sampled examples per category after the exact preprocessing, with their check;
    `shots`: as the few-shot baseline prompts them (the demonstrations first)."""
    refuse_shots_for_images(pilot.spec.task, shots)  # before the images are all read
    modality = modality_of(pilot)
    prepared = modality.prepare(enforce_leakage=False)
    return modality.inspect(prepared, split, per_category, seed, out, shots)
