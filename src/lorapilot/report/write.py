"""The `compare` and `report` verbs: read the records, decide, write the deliverable."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lorapilot.errors import LorapilotError
from lorapilot.fsutil import atomic_write_json, atomic_write_text
from lorapilot.report.collect import collect
from lorapilot.spec import Pilot


def run_compare(pilot: Pilot) -> dict[str, Any]:
    state = collect(pilot)
    return {
        "pilot": state["pilot"],
        "baseline": state["baseline"] and state["baseline"]["id"],
        "runs": state["runs"],
        "chosen": state["chosen"] and state["chosen"]["id"],
        "decision": (state["decision"] or {}).get("decision"),
        "reasons": (state["decision"] or {}).get("reasons", []),
    }


def _budget(pilot: Pilot) -> dict | None:
    from lorapilot.plan import run_budget

    try:
        return run_budget(pilot)
    except LorapilotError:
        return None  # no probe yet: the report says so


def run_report(pilot: Pilot) -> dict[str, Any]:
    """Write report/index.html and report/report.md, and fill deliverable/."""
    from lorapilot.report.render import render_html, render_markdown

    state = collect(pilot)
    state["budget"] = _budget(pilot)
    out = pilot.dir / "report"
    html_path, md_path = out / "index.html", out / "report.md"
    atomic_write_text(html_path, render_html(state))
    atomic_write_text(md_path, render_markdown(state))
    deliverable = fill_deliverable(pilot, state, out)
    decision = state["decision"] or {
        "decision": "INCONCLUSIVE",
        "reasons": ["no completed, comparable train run and baseline yet"],
    }
    return {
        "html": str(html_path),
        "markdown": str(md_path),
        "deliverable": str(deliverable),
        "decision": decision["decision"],
        "reasons": decision["reasons"],
        "chosen_run": state["chosen"] and state["chosen"]["id"],
        "limitations": state["limitations"],
    }


def _copy_tree(src: Path, dst: Path) -> None:
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def fill_deliverable(pilot: Pilot, state: dict, report_dir: Path) -> Path:
    """Everything to hand over without runs/: adapter + manifest, resolved spec, report,
    baseline and final predictions, environment record."""
    d = pilot.dir / "deliverable"
    d.mkdir(exist_ok=True)
    runs = pilot.dir / "runs"
    atomic_write_json(d / "spec.resolved.json", pilot.spec.model_dump(mode="json"))
    shutil.copy2(pilot.spec_path, d / "pilot.yaml")
    for name in ("index.html", "report.md"):
        shutil.copy2(report_dir / name, d / name)
    if state["baseline"]:
        src = runs / state["baseline"]["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "baseline_predictions.jsonl")
    rec = state.get("chosen_record")
    if rec:
        adapter = Path(rec["result"].get("adapter_path", ""))
        if adapter.is_dir():
            _copy_tree(adapter, d / "adapter")
        src = runs / rec["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "final_val_predictions.jsonl")
        atomic_write_json(d / "environment.json", rec.get("environment", {}))
    if state.get("test"):
        src = runs / state["test"]["id"] / "predictions.jsonl"
        if src.is_file():
            shutil.copy2(src, d / "final_test_predictions.jsonl")
    atomic_write_json(
        d / "decision.json",
        {
            "decision": state["decision"],
            "limitations": state["limitations"],
            "chosen_run": state["chosen"] and state["chosen"]["id"],
        },
    )
    return d
