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


def test_a_near_constant_baseline_is_named_as_a_limitation():
    """#35 item 6 (the warning): a zero-shot baseline that puts more than half of the
    examples in one class is a weak starting point, and the report says so with the numbers."""
    from lorapilot.report.collect import degenerate_baseline

    rows = [{"parsed": "Refund_not_showing_up"}] * 149 + [{"parsed": "card_arrival"}] * 5
    [line] = degenerate_baseline(rows)
    assert "'Refund_not_showing_up' for 149 of 154" in line and "(97%)" in line
    balanced = [{"parsed": lab} for lab in ("a", "b", "c")] * 10
    assert degenerate_baseline(balanced) == [] and degenerate_baseline(None) == []
    assert (
        degenerate_baseline([{"parsed": "a"}] * 5 + [{"parsed": "b"}] * 5) == []
    )  # half: not more
