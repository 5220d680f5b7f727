"""The one seam where text and image pilots differ: preparing the data (and its report),
inspecting examples after the exact preprocessing, the model a train run adapts with its
data as training sets (`Trainee`), and a model as `eval`, `baseline` and `verify` load it,
with the pilot's evaluation and its baseline classifier (`Loaded`). Steps ask
`modality_of(pilot)` and call the same methods whatever the modality; the training loop,
audit, registry, splits, leakage policy, budget, compare, decision and report stay shared."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from lorapilot.data.dataset import PreparedData
from lorapilot.modality.trainee import Loaded, Trainee
from lorapilot.spec import AdapterSpec, Pilot


class Modality(Protocol):
    pilot: Pilot

    def prepare(self, *, enforce_leakage: bool = True) -> PreparedData:
        """Load, validate, split, find duplicates/leaks, version (deterministic)."""
        ...

    def data_report(self, prepared: PreparedData) -> dict[str, Any]:
        """What `lorapilot data` records."""
        ...

    def failed_check(self, report: dict[str, Any]) -> str | None:
        """The message of a check in the report that failed (the verb exits 1), or None."""
        ...

    def inspect(
        self,
        prepared: PreparedData,
        split: str,
        per_category: int,
        seed: int,
        out: Path | None,
        shots: int = 0,
    ) -> dict[str, Any]:
        """Examples per category after the exact preprocessing (`ok` False: a mismatch);
        `shots`: the prompts as `baseline --shots` builds them (text)."""
        ...

    def trainee(
        self, *, adapter: AdapterSpec | None = None, smoke_per_category: int | None = None
    ) -> Trainee:
        """The base with `adapter` (default the spec's) attached, seeded by train.seed, and
        the data. `smoke_per_category`: train and validate on that many training examples
        per category instead (the smoke test's memorisation set)."""
        ...

    def adapter_problems(self, adapter_dir: Path, manifest: dict) -> list[str]:
        """What in a saved adapter would not reload as trained (images: a missing head)."""
        ...

    def load(
        self,
        adapter_dir: Path | None = None,
        manifest: dict | None = None,
        resolved: Any = None,
        shots: int = 0,
        linear_probe: bool = False,
    ) -> Loaded:
        """The base, with the saved adapter at `adapter_dir` attached; with its `manifest`,
        the pins beyond the base's weights checked (problems listed, never raised).
        `resolved`: the base as the caller already resolved it (not resolved again).
        `shots`: `evaluate_base` shows the base that many training examples first (text).
        `linear_probe`: `evaluate_base` is the embedding-classifier alternative (text)."""
        ...


def modality_of(pilot: Pilot) -> Modality:
    if pilot.spec.task.modality == "image":
        from lorapilot.modality.image import ImageModality

        return ImageModality(pilot)
    from lorapilot.modality.text import TextModality

    return TextModality(pilot)
