"""`lorapilot runs`: every run record of the pilot, failed and interrupted ones included; or,
with --watch, a train run followed live (`runs_view.watch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot.decision.plan import replicate_of, variant_name
from lorapilot.records import registry
from lorapilot.records.runs_view import watch


def run_rows(pilot_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """One row per run record, oldest first."""
    return [
        {
            "id": r.id,
            "kind": r.kind,
            "status": r.status,
            "parent": r.parent,
            "started_at": r.started_at,
            "ended_at": r.ended_at,
            "duration_s": r.duration_s,
            "data_version": r.data_version,
            "variant": (r.variant or {}).get("label"),
            "variant_name": variant_name(r.variant) if r.kind == "train" else None,
            "replicate": replicate_of(r.variant) if r.kind == "train" else None,
            "error": r.error,
        }
        for r in registry.list_runs(pilot_dir, kind)
    ]


def run_runs(pilot_dir: Path, kind: str | None = None) -> dict[str, Any]:
    return {"pilot": str(pilot_dir), "runs": run_rows(pilot_dir, kind)}


def run_watch(pilot_dir: Path, run_id: str | None, console, *, interval: float, last: int) -> dict:
    """Follow a train run (default: the running one, else the latest) until it stops."""
    summary = watch(pilot_dir, run_id, console, interval=interval, last=last)
    return {"pilot": str(pilot_dir), **summary}
