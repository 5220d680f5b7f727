"""`compare` rows: a result measured with another evaluation protocol is not compared with the
baseline, and the reason names the protocol keys that differ."""

from __future__ import annotations

import json
import shutil

from conftest import EXAMPLES

from lorapilot.records import registry
from lorapilot.report.collect import run_summary
from lorapilot.spec import load_pilot

PROTOCOL = {"mode": "score", "batch_size": 32, "precision": "bf16", "eval_protocol": "ep-aaaa"}


def _record(pilot_dir, kind, protocol, *, in_record=True):
    with registry.open_run(pilot_dir, kind, config={"name": "t"}) as run:
        run.record.data_version = "dv-1"
        result = {
            "split": "val",
            "metrics": {"accuracy": 0.5},
            "eval_protocol": protocol["eval_protocol"],
        }
        if in_record:
            result["protocol"] = protocol
        else:  # older records: the protocol only in protocol.json
            (run.dir / "protocol.json").write_text(json.dumps(protocol))
        run.update(**result)
    return registry.get_run(pilot_dir, run.id)


def test_not_comparable_reason_names_the_protocol_keys(tmp_path):
    pilot_dir = tmp_path / "tt"
    shutil.copytree(
        EXAMPLES / "ticket-triage",
        pilot_dir,
        ignore=shutil.ignore_patterns("runs", "report", "deliverable"),
    )
    pilot = load_pilot(pilot_dir)
    base = _record(pilot_dir, "baseline", PROTOCOL, in_record=False)
    other = _record(pilot_dir, "train", {**PROTOCOL, "batch_size": 8, "eval_protocol": "ep-bbbb"})
    row = run_summary(pilot, other, base)
    assert row["comparable"] is False and "deltas" not in row
    assert (
        row["not_comparable_reason"]
        == "evaluation protocols differ (ep-aaaa vs ep-bbbb): batch_size (32 vs 8)"
    )
    same = _record(pilot_dir, "train", PROTOCOL)
    assert run_summary(pilot, same, base)["comparable"] is True
