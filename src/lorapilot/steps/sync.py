"""`lorapilot sync`: mirror the pilot's existing run records to MLflow / TensorBoard.
Idempotent: an unchanged run is skipped, a changed one replaced, never duplicated."""

from __future__ import annotations

from typing import Any

from lorapilot.errors import UsageError
from lorapilot.records import tracking
from lorapilot.spec import Pilot
from lorapilot.spec.requirements import require_trackers


def run_sync(pilot: Pilot, to: list[str] | None = None, log=print) -> dict[str, Any]:
    """Mirror every run to `to` (default: the spec's `tracking` list)."""
    targets = list(dict.fromkeys(to or pilot.spec.tracking))
    if not targets:
        raise UsageError(
            f"{pilot.spec_path}: nothing to sync to: give --to mlflow or --to tensorboard, "
            "or list them under tracking in the spec"
        )
    unknown = [t for t in targets if t not in tracking.TARGETS]
    if unknown:
        raise UsageError(
            f"--to {unknown[0]!r}: unknown tracker; known: {', '.join(tracking.TARGETS)}"
        )
    require_trackers(targets, "--to")
    log(f"sync: mirroring the runs of {pilot.dir.name} to {', '.join(targets)}...")
    return tracking.sync(pilot.dir, targets)
