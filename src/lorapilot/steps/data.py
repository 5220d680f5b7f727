"""`lorapilot data`: load, validate, clean, version and split the data, find duplicates and
leaks, and measure it (text: lengths and the loss-mask audit; images: properties per
category and shortcut warnings), as a run record (exit 1 on a leak or a failed check)."""

from __future__ import annotations

from typing import Any

from lorapilot.data.dataset import check_leakage
from lorapilot.data.summary import require_permission
from lorapilot.errors import CheckFailed
from lorapilot.modality import modality_of
from lorapilot.records.steprun import open_run
from lorapilot.spec import Pilot


def run_data(pilot: Pilot) -> dict[str, Any]:
    """Load, validate, clean, version, split, find leaks, measure, check."""
    require_permission(pilot)
    with open_run(pilot, "data") as run:
        modality = modality_of(pilot)
        prepared = modality.prepare(enforce_leakage=False)
        report = modality.data_report(prepared)
        run.record.data_version = prepared.version
        run.update(**report)
        try:
            check_leakage(pilot, prepared)  # the one place the leak message is written
        except CheckFailed as e:
            raise CheckFailed(str(e), {"run_id": run.id, **report}) from None
        failed = modality.failed_check(report)
        if failed:
            raise CheckFailed(failed, {"run_id": run.id, **report})
    return {"run_id": run.id, "status": run.record.status, **report}
