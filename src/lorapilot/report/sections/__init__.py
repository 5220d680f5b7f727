"""The report's content: the pilot state turned into sections of blocks (`build_sections`).

Each builder reads only the state keys it needs; any of them may be missing or None (a pilot
that has not trained yet): its section then says "not run yet" and which verb fills it. A
builder that fails on odd data costs only its own section (`build_sections` says so in place).
One module per section family: `decision` (decision, hypothesis, limitations), `data`, `model`
(base, adapter, environment), `sizing` (probe, budget), `results`, `runs` (runs, curves,
verify, test), `deliverable` (the exported formats and their checks); `state` reads the
state's keys safely for all of them.
"""

from __future__ import annotations

from typing import Any

from lorapilot.report.blocks import Para
from lorapilot.report.sections.data import _data
from lorapilot.report.sections.decision import _decision, _hypothesis, _limitations
from lorapilot.report.sections.deliverable import _deliverable
from lorapilot.report.sections.model import _adapter, _base_model, _environment
from lorapilot.report.sections.results import _results
from lorapilot.report.sections.runs import _curves, _runs, _test, _verify
from lorapilot.report.sections.sizing import _budget, _probe
from lorapilot.report.sections.state import MAX_LISTED, _get

__all__ = ["MAX_LISTED", "SECTIONS", "build_sections", "meta_rows"]

SECTIONS: tuple[tuple[str, str], ...] = (
    ("decision", "Decision"),
    ("hypothesis", "Hypothesis and pre-registered criteria"),
    ("data", "Data"),
    ("base-model", "Base model and revision"),
    ("adapter", "Adapter"),
    ("environment", "Environment"),
    ("probe", "Probe: time and memory"),
    ("budget", "Budget: estimate, actual and rental plans"),
    ("results", "Results: baseline vs adapted"),
    ("runs", "Runs"),
    ("training-curves", "Training curves"),
    ("verify", "Verification"),
    ("test", "Test split"),
    ("deliverable", "Deliverable: formats and their checks"),
    ("limitations", "Limitations"),
)
"""(HTML id, heading) of every section, in report order: a stable contract for tests."""


_BUILDERS = {
    "decision": _decision,
    "hypothesis": _hypothesis,
    "data": _data,
    "base-model": _base_model,
    "adapter": _adapter,
    "environment": _environment,
    "probe": _probe,
    "budget": _budget,
    "results": _results,
    "runs": _runs,
    "training-curves": _curves,
    "verify": _verify,
    "test": _test,
    "deliverable": _deliverable,
    "limitations": _limitations,
}


def build_sections(state: dict | None) -> list[tuple[str, str, list]]:
    """[(id, heading, blocks)] in report order; a section that fails says why instead."""
    state = state if isinstance(state, dict) else {}
    out = []
    for sid, title in SECTIONS:
        try:
            blocks = _BUILDERS[sid](state)
        except Exception as e:  # odd data in one section must not cost the whole report
            blocks = [Para(f"this section could not be rendered: {type(e).__name__}: {e}", "warn")]
        out.append((sid, title, blocks))
    return out


def meta_rows(state: dict) -> list[tuple[str, Any]]:
    """The header line under the title: (label, value) pairs, empty values left out by the
    renderers."""
    return [
        ("pilot", state.get("pilot")),
        ("task", _get(state, "task", "kind")),
        ("generated", state.get("generated_at")),
    ]
