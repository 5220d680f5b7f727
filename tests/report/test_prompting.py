"""The prompting comparison (`prompting` in compare and report): the chosen adapter is set
against the few-shot baseline only where the two evaluations differ by the demonstrations
alone; otherwise `why_not` names what differs. Run records written by hand, no model."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import EXAMPLES

from lorapilot.records import registry
from lorapilot.report.prompting import prompting_alternative, prompting_warnings
from lorapilot.spec import load_pilot

PROTOCOL = {"mode": "score", "precision": "fp32", "eval_protocol": "ep-zero"}
SHOTS = {"k": 3, "seed": 0, "ids": ["a", "b", "c"]}
LABELS = ["billing", "technical"]


def _run(pilot_dir, kind, protocol, macro_f1, parsed, data_version="dv-1", shots=None):
    with registry.open_run(pilot_dir, kind, config={"name": "t"}) as run:
        run.record.data_version = data_version
        rows = [{"id": f"x{i}", "gold": LABELS[i % 2], "parsed": p} for i, p in enumerate(parsed)]
        (run.dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        run.update(
            split="val", metrics={"macro_f1": macro_f1}, protocol=protocol,
            eval_protocol=protocol["eval_protocol"], **({"shots": shots} if shots else {}),
        )  # fmt: skip
    return run.id


@pytest.fixture
def pilot(tmp_path):
    shutil.copytree(EXAMPLES / "ticket-triage", tmp_path / "tt",
                    ignore=shutil.ignore_patterns("runs", "report", "deliverable"))  # fmt: skip
    return load_pilot(tmp_path / "tt")


def test_no_few_shot_run_no_comparison_and_no_adapter_says_so(pilot):
    assert prompting_alternative(pilot, None) is None
    few_proto = {**PROTOCOL, "shots": SHOTS, "eval_protocol": "ep-few"}
    _run(pilot.dir, "baseline", few_proto, 0.4, ["billing"] * 20, shots=SHOTS)
    p = prompting_alternative(pilot, None)
    assert p["shots"] == 3 and p["few_shot"] == 0.4 and p["why_not"] == "no adapter chosen yet"


def test_the_gain_is_paired_and_weighed_against_min_gain(pilot):
    few_proto = {**PROTOCOL, "shots": SHOTS, "eval_protocol": "ep-few"}
    golds = [LABELS[i % 2] for i in range(20)]
    _run(pilot.dir, "baseline", few_proto, 0.333, ["billing"] * 20, shots=SHOTS)
    train = _run(pilot.dir, "train", PROTOCOL, 1.0, golds)
    p = prompting_alternative(pilot, {"id": train, "metrics": {"macro_f1": 1.0}})
    assert p["why_not"] is None and p["gain"] == pytest.approx(0.667)
    assert p["ci_low"] > 0 and p["adapter_beats_prompting"] is True
    assert prompting_warnings(p) == []
    close = _run(pilot.dir, "train", PROTOCOL, 0.36, ["billing"] * 19 + ["technical"])
    q = prompting_alternative(pilot, {"id": close, "metrics": {"macro_f1": 0.36}})
    assert q["adapter_beats_prompting"] is False  # +0.027 < min_gain 0.10
    (warning,) = prompting_warnings(q)
    assert f"the chosen adapter ({close}) gains +0.027 macro_f1" in warning
    assert "a few-shot prompt may serve instead of the adapter" in warning


@pytest.mark.parametrize(
    ("train_proto", "data_version", "named"),
    [
        ({**PROTOCOL, "precision": "bf16"}, "dv-1", "precision (fp32 vs bf16)"),
        (PROTOCOL, "dv-2", "data version (dv-1 vs dv-2)"),
    ],
)
def test_another_evaluation_is_not_compared_and_says_what_differs(
    pilot, train_proto, data_version, named
):
    few_proto = {**PROTOCOL, "shots": SHOTS, "eval_protocol": "ep-few"}
    _run(pilot.dir, "baseline", few_proto, 0.4, ["billing"] * 20, shots=SHOTS)
    train = _run(pilot.dir, "train", train_proto, 0.9, ["billing"] * 20, data_version)
    p = prompting_alternative(pilot, {"id": train, "metrics": {"macro_f1": 0.9}})
    assert p["gain"] is None and p["adapter_beats_prompting"] is None
    assert p["why_not"].startswith("besides the demonstrations, the evaluations differ: ")
    assert named in p["why_not"]
    assert prompting_warnings(p) == []
