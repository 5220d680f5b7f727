"""`lorapilot eval`: an adapter (or the base) on val, or on the reserved test split with
`--final` (every test access is appended to the pilot's test ledger)."""

from __future__ import annotations

from lorapilot.decision.plan import pilot_of_run
from lorapilot.evaluate.session import evaluate_split
from lorapilot.records import registry
from lorapilot.spec import Pilot


def run_eval(
    pilot: Pilot,
    *,
    run_id: str | None = None,
    base: bool = False,
    split: str = "val",
    final: bool = False,
    limit: int | None = None,
    progress: bool = True,
    log=None,
) -> dict:
    """Evaluate train run `run_id`'s adapter (default: the latest completed one), or the
    base model with `base=True`, inside an `eval` run."""
    parent, adapter = (None, None) if base else registry.adapter_of(pilot.dir, run_id)
    if parent is not None:  # the base loaded as that run's variant loaded it (quantization)
        pilot = pilot_of_run(pilot, parent)
    return evaluate_split(
        pilot,
        "eval",
        split=split,
        adapter_dir=adapter,
        parent=parent,
        limit=limit,
        progress=progress,
        final=final,
        log=log,
    )
