"""`lorapilot report`: report/index.html (self-contained) and report/report.md with the
decision, and deliverable/ filled with what to hand over. A NO-GO is a result (exit 0)."""

from __future__ import annotations

from typing import Any

from lorapilot.fsutil import atomic_write_text
from lorapilot.report.collect import collect
from lorapilot.report.deliverable import fill_deliverable
from lorapilot.report.render import render_html, render_markdown
from lorapilot.sizing.estimate import budget_or_none
from lorapilot.spec import Pilot


def run_report(pilot: Pilot) -> dict[str, Any]:
    """Write report/index.html and report/report.md, and fill deliverable/."""
    state = collect(pilot)
    state["budget"] = budget_or_none(pilot)
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
        "selection": state["selection"],
        "test_gain": (state["test"] or {}).get("gain"),
        "prompting": state["prompting"],
        "linear_probe": state["linear_probe"],
        "gates": decision.get("gates"),
        "limitations": state["limitations"],
    }
