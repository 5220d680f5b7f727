"""A spec dumped as run records and adapter manifests hold it (every default written out)
validates again to the same spec: `verify`'s fresh process and `pilot_of_run` rebuild the
spec from that dump. Each example pilot, and the keys whose refusals read what was set."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import EXAMPLES

from lorapilot.spec import PilotSpec

PILOTS = sorted(p.parent.name for p in EXAMPLES.glob("*/pilot.yaml"))


def reloads(raw: dict) -> None:
    spec = PilotSpec.model_validate(raw)
    dumped = spec.model_dump(mode="json")
    again = PilotSpec.model_validate(dumped)
    assert again.model_dump(mode="json") == dumped and again.spec_hash() == spec.spec_hash()


@pytest.mark.parametrize("name", PILOTS)
def test_every_example_spec_reloads_from_its_dump(name):
    reloads(yaml.safe_load((EXAMPLES / name / "pilot.yaml").read_text()))


@pytest.mark.parametrize(
    "fields",
    [
        {"text_template": "Subject: {subject}\n\n{body}", "label": "category"},
        {"messages": "messages", "id": None},
    ],
)
def test_a_spec_with_its_input_in_columns_or_conversations_reloads(fields):
    """Both refusals ("text or text_template", "messages or text/label") once read the keys
    set, and every dumped default counted as set: verify of such a pilot failed."""
    raw = copy.deepcopy(yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text()))
    raw["data"]["fields"] = fields
    raw["model"]["chat_template"] = "plain"
    reloads(raw)
