"""The one seam where text and image pilots differ: preparing the data (and its report) and
inspecting examples after the exact preprocessing. Steps ask `modality_of(pilot)` and call
the same three methods whatever the modality; registry, splits, leakage policy, budget,
compare, decision and report stay shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from lorapilot.data.dataset import PreparedData
from lorapilot.spec import Pilot


class Modality(Protocol):
    def prepare(self, *, enforce_leakage: bool = True) -> PreparedData:
        """Load, validate, split, find duplicates/leaks, version (deterministic)."""
        ...

    def data_report(self, prepared: PreparedData) -> dict[str, Any]:
        """What `lorapilot data` records."""
        ...

    def failed_check(self, report: dict[str, Any]) -> str | None:
        """The message of a check in the report that failed (the verb exits 1), or None."""
        ...

    def baseline(self, *, limit: int | None, progress: bool, log: Any) -> dict[str, Any]:
        """A `baseline` run: the unadapted model on val (images: a linear probe on the frozen
        features, fitted on train), outputs and protocol kept."""
        ...

    def inspect(
        self, prepared: PreparedData, split: str, per_category: int, seed: int, out: Path | None
    ) -> dict[str, Any]:
        """Examples per category after the exact preprocessing (`ok` False: a mismatch)."""
        ...


def modality_of(pilot: Pilot) -> Modality:
    if pilot.spec.task.modality == "image":
        from lorapilot.modality.image import ImageModality

        return ImageModality(pilot)
    from lorapilot.modality.text import TextModality

    return TextModality(pilot)
