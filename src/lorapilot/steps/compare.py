"""`lorapilot compare`: every run side by side (failed ones too, with their reason), metrics
and deltas against the baseline, guards, examples fixed and broken, the decision so far."""

from __future__ import annotations

from typing import Any

from lorapilot.report.collect import collect
from lorapilot.spec import Pilot


def run_compare(pilot: Pilot) -> dict[str, Any]:
    state = collect(pilot)
    return {
        "pilot": state["pilot"],
        "baseline": state["baseline"] and state["baseline"]["id"],
        "runs": state["runs"],
        "chosen": state["chosen"] and state["chosen"]["id"],
        "selection": state["selection"],
        "test_gain": (state["test"] or {}).get("gain"),
        "prompting": state["prompting"],
        "linear_probe": state["linear_probe"],
        "decision": (state["decision"] or {}).get("decision"),
        "reasons": (state["decision"] or {}).get("reasons", []),
    }
