"""`lorapilot data`: load, validate, clean, version and split the data, find duplicates and
leaks, measure lengths and audit the loss mask, as a run record (exit 1 on a leak or a mask
problem)."""

from __future__ import annotations

from typing import Any

from lorapilot.data.dataset import check_leakage, prepare_data
from lorapilot.data.summary import data_report, require_permission
from lorapilot.errors import CheckFailed
from lorapilot.models import load_tokenizer
from lorapilot.spec import Pilot
from lorapilot.steprun import open_run


def run_data(pilot: Pilot) -> dict[str, Any]:
    """Load, validate, clean, version, split, find leaks, measure lengths, audit the mask."""
    require_permission(pilot)
    with open_run(pilot, "data") as run:
        _, tok = load_tokenizer(pilot)
        prepared = prepare_data(pilot, tok, enforce_leakage=False)
        report = data_report(pilot, prepared, tok)
        run.record.data_version = prepared.version
        run.update(**report)
        try:
            check_leakage(pilot, prepared)  # the one place the leak message is written
        except CheckFailed as e:
            raise CheckFailed(str(e), {"run_id": run.id, **report}) from None
        if not report["mask_audit"]["ok"]:
            raise CheckFailed(
                "the loss-mask audit failed (see mask_audit)", {"run_id": run.id, **report}
            )
    return {"run_id": run.id, "status": run.record.status, **report}
