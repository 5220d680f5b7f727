"""A multi-label task's data: the label cell as a list or as separated text, labels kept in
task.labels order, bad cells refused with the row named, splits stratified on each example's
rarest label, and the data report counting examples per label."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from conftest import init_tiny_pilot, run_cli, run_json
from pydantic import ValidationError

from lorapilot.data.format import answer_text
from lorapilot.data.load import load_records
from lorapilot.data.rows import Record
from lorapilot.data.split import label_counts, multi_label_strata
from lorapilot.spec import DataSpec, FieldMap, PilotSpec, TaskSpec

LABELS = ["anger", "joy", "neutral", "sadness"]
TASK = TaskSpec(kind="multi_label_classification", labels=LABELS)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_list_or_separated_text_becomes_the_labels_in_task_order(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [
        {"text": "a", "label": ["sadness", "anger"]},
        {"text": "b", "label": "joy"},
        {"text": "c", "label": " neutral , joy "},
        {"text": "d", "label": ["joy", "joy"]},
    ])  # fmt: skip
    recs, skipped = load_records(f, TASK, DataSpec(file="d.jsonl"))
    assert not skipped
    assert [r.target for r in recs] == [["anger", "sadness"], ["joy"], ["joy", "neutral"], ["joy"]]
    assert all(r.label is None for r in recs)
    assert answer_text(TASK, None, recs[0].target) == "anger, sadness"

    c = tmp_path / "d.csv"
    with c.open("w", newline="") as fh:
        csv.writer(fh).writerows([["text", "tags"], ["x", "anger|joy"]])
    data = DataSpec(file="d.csv", fields=FieldMap(label="tags", label_separator="|"))
    recs, _ = load_records(c, TASK, data)
    assert recs[0].target == ["anger", "joy"]


@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        ([], "names no label"),
        ("", "names no label"),
        ("joy,,anger", "an empty label between separators"),
        (["joy", 3], "must be a list of labels"),
        ({"joy": 1}, "must be a list of labels"),
        (["joy", "fear"], "label 'fear' is not one of the task labels"),
    ],
)
def test_bad_label_cells_are_refused_with_the_line(tmp_path, cell, problem):
    f = write_jsonl(tmp_path / "d.jsonl", [{"text": "ok", "label": "joy"},
                                            {"text": "x", "label": cell}])  # fmt: skip
    recs, skipped = load_records(f, TASK, DataSpec(file="d.jsonl", on_error="skip"))
    assert len(recs) == 1 and len(skipped) == 1
    assert skipped[0].line == 2 and problem in skipped[0].problem


def test_unlisted_labels_drop_the_row_and_name_the_label(tmp_path):
    f = write_jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": ["joy", "fear"]},
                                            {"text": "b", "label": ["joy"]}])  # fmt: skip
    recs, skipped = load_records(f, TASK, DataSpec(file="d.jsonl", unlisted_labels="drop"))
    assert [r.text for r in recs] == ["b"]
    assert skipped[0].label == "fear"


def test_spec_rules_for_multi_label():
    with pytest.raises(ValidationError, match="holds a comma"):
        TaskSpec(kind="multi_label_classification", labels=["a, b", "c"])
    with pytest.raises(ValidationError, match="starts or ends with a space"):
        TaskSpec(kind="multi_label_classification", labels=["a ", "c"])
    TaskSpec(kind="classification", labels=["a, b", "c"])  # one label: a comma is fine
    base = {"name": "x", "hypothesis": "h", "data": {"file": "d.jsonl"},
            "task": {"kind": "multi_label_classification", "labels": LABELS}}  # fmt: skip
    spec = PilotSpec.model_validate(base)
    assert spec.eval.mode == "generate" and spec.success.metric == "macro_f1"
    with pytest.raises(ValidationError, match="eval.mode: score ranks single labels"):
        PilotSpec.model_validate({**base, "eval": {"mode": "score"}})
    with pytest.raises(ValidationError, match="unknown metric 'micro_f2'"):
        PilotSpec.model_validate({**base, "success": {"metric": "micro_f2", "min_gain": 0.1}})
    PilotSpec.model_validate({**base, "guards": [{"metric": "per_category.joy.f1",
                                                  "max_drop": 0.1}]})  # fmt: skip
    sep = {"file": "d.jsonl", "fields": {"label_separator": "o"}}  # 'o' is in joy
    with pytest.raises(ValidationError, match="occurs in the label 'joy'"):
        PilotSpec.model_validate({**base, "data": sep})
    single = {**base, "task": {"kind": "classification", "labels": LABELS}}
    with pytest.raises(ValidationError, match="splits a multi-label example's labels"):
        PilotSpec.model_validate({**single, "data": {**sep, "fields": {"label_separator": "|"}}})


def _rec(i: int, labels: list[str]) -> Record:
    return Record(id=str(i), text=f"t{i}", label=None, target=labels, source=f"f:{i}",
                  split=None, category=labels[0])  # fmt: skip


def test_the_stratum_is_the_rarest_label_and_counts_are_per_label():
    recs = [_rec(i, ["joy"]) for i in range(5)] + [_rec(5, ["joy", "sadness"]),
                                                    _rec(6, ["anger", "sadness"])]  # fmt: skip
    strata = multi_label_strata(recs, LABELS)
    # sadness (2) is rarer than joy (6); anger (1) rarer than sadness
    assert [r.category for r in strata] == ["joy"] * 5 + ["sadness", "anger"]
    counts = label_counts({"train": strata}, LABELS)
    assert counts == {"train": {"anger": 1, "joy": 6, "neutral": 0, "sadness": 2}}


def test_data_report_and_training_on_a_multi_label_pilot(tmp_path, tiny_model_dir):
    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=2)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    sets = [["anger"], ["joy"], ["joy", "neutral"], ["sadness"], ["anger", "sadness"]]
    write_jsonl(pilot / "data" / "ml.jsonl", [
        {"id": f"r{i}", "text": f"message number {i} about {' and '.join(s)}", "tags": s}
        for i, s in enumerate(sets * 8)
    ])  # fmt: skip
    spec["task"] = {"kind": "multi_label_classification", "labels": LABELS,
                    "system": "Name every emotion: {labels}."}  # fmt: skip
    spec["data"] = {"file": "data/ml.jsonl", "fields": {"label": "tags"},
                    "source": "generated in the test", "permission": "test data"}  # fmt: skip
    spec.pop("eval", None)
    spec["success"] = {"metric": "micro_f1", "min_gain": 0.05}
    spec["guards"] = [{"metric": "per_category.f1", "max_drop": 0.5}]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    d = run_json("data", str(pilot), "--json")
    # an example counts for each of its labels: joy is in two of the five sets, 8 times each
    assert sum(d["per_category"]["joy"].values()) == 16
    sets_report = d["label_sets"]
    assert sets_report["labels_per_example"]["train"]["mean"] > 1.0
    assert {tuple(c["labels"]) for c in sets_report["commonest_combinations"]} == {
        ("joy", "neutral"),
        ("anger", "sadness"),
    }
    view = run_cli("data", str(pilot))
    assert view.returncode == 0 and "examples per split and label" in view.stdout

    base = run_json("baseline", str(pilot), "--json")
    assert set(base["metrics"]) >= {"micro_f1", "macro_f1", "accuracy", "invalid_rate"}
    lines = (pilot / "runs" / base["run_id"] / "predictions.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert all(isinstance(r["gold"], list) and "unknown_labels" in r for r in rows)

    # the embedding-classifier alternative: one binary probe per label, the labels at
    # probability >= 0.5 (else the likeliest), written and parsed as an adapter's answer
    probe = run_json("baseline", str(pilot), "--linear-probe")
    assert probe["protocol"]["linear_probe"]["classifier"] == "one-vs-rest logistic regression"
    assert probe["linear_probe"]["fitted_on"]["n"] == d["splits"]["train"]
    for r in (json.loads(x) for x in open(probe["predictions"])):
        on = [lab for lab in LABELS if r["scores"][lab] >= 0.5]
        assert r["parsed"] == (on or [max(LABELS, key=r["scores"].get)])
        assert r["raw_output"] == ", ".join(r["parsed"]) and not r["unknown_labels"]
    assert probe["metrics"]["invalid_rate"] == 0.0

    t = run_json("train", str(pilot), "--json")
    assert "micro_f1" in t["metrics"] and t["status"] == "completed"
    c = run_json("compare", str(pilot), "--json")
    assert c["baseline"] == base["run_id"] and c["linear_probe"]["why_not"] is None
    assert c["linear_probe"]["run_id"] == probe["run_id"]
    assert c["selection"]["metric"] == "micro_f1"
    assert c["decision"] in ("GO", "NO-GO", "INCONCLUSIVE")
    assert any("micro_f1" in r and "CI of the gain" in r for r in c["reasons"]), c["reasons"]

    inputs = write_jsonl(tmp_path / "new.jsonl", [{"text": "message about joy"},
                                                  {"text": "x", "tags": ["joy"]}])  # fmt: skip
    p = run_json("predict", str(pilot), "--input", str(inputs), "--json")
    assert set(p["summary"]["predicted"]) == set(LABELS)


def test_a_saved_dataset_with_a_list_of_class_labels_reads_their_names(tmp_path):
    """HF multi-label sets (go_emotions) hold `List(ClassLabel)`: integers, named here."""
    datasets = pytest.importorskip("datasets")
    from lorapilot.data.dataset import load_all
    from lorapilot.spec import load_pilot

    tags = datasets.Sequence(datasets.ClassLabel(names=LABELS))
    feats = datasets.Features({"text": datasets.Value("string"), "tags": tags})
    rows = [{"text": "a", "tags": [3, 0]}, {"text": "b", "tags": [1]}, {"text": "c", "tags": []}]
    pilot = tmp_path / "p"
    datasets.Dataset.from_list(rows, features=feats).save_to_disk(str(pilot / "data" / "ds"))
    (pilot / "pilot.yaml").write_text(yaml.safe_dump({
        "name": "m", "hypothesis": "h",
        "task": {"kind": "multi_label_classification", "labels": LABELS},
        "data": {"file": "data/ds", "fields": {"label": "tags", "id": None}, "on_error": "skip"},
    }))  # fmt: skip
    recs, skipped = load_all(load_pilot(pilot))
    assert [r.target for r in recs] == [["anger", "sadness"], ["joy"]]
    assert len(skipped) == 1 and "names no label" in skipped[0].problem
