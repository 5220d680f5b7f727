"""`lorapilot check`: the spec is valid (hypothesis, task, guards, limits) and its data source
is found (files exist and are readable, an HF dataset is cached), without loading the model
or reading records. A bad key exits 2 naming it (and the resolved path)."""

from __future__ import annotations

from typing import Any

from lorapilot.data.source import check_data_source
from lorapilot.spec import Pilot


def run_check(pilot: Pilot) -> dict[str, Any]:
    """The resolved spec, its hash and the data sources found."""
    s = pilot.spec
    return {
        "ok": True,
        "pilot": str(pilot.dir),
        "spec": str(pilot.spec_path),
        "name": s.name,
        "spec_hash": s.spec_hash(),
        "task": s.task.kind,
        "hypothesis": s.hypothesis.strip(),
        "success": s.success.model_dump() if s.success else None,
        "guards": [g.model_dump(exclude_none=True) for g in s.guards],
        "resolved": s.model_dump(mode="json"),
        "data_source": check_data_source(pilot),
    }
