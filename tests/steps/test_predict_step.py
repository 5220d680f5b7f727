"""`lorapilot predict` as a user runs it: new inputs through the pilot's own prompts, cut and
decoding, every prediction kept in a `predict` run (and in --out); inputs with an answer
scored as the evaluation scores them; inputs that are the pilot's own examples named; bad
input refused with exit 2, naming the file and line. Tiny random models."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import yaml
from conftest import EXAMPLES, init_tiny_pilot, run_cli, run_json


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """`init`'s classification pilot on the tiny model, trained 4 steps."""
    pilot = init_tiny_pilot(tmp_path_factory.mktemp("predict"), tiny_model_dir, max_steps=4)
    train = run_json("train", str(pilot), "--no-progress")
    return pilot, train


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_predictions_are_the_evaluations_and_answers_are_scored(trained, tmp_path):
    """The validation texts given as new inputs: the same predictions the train run made on
    them (one protocol); with their labels, the same metrics; named as val examples."""
    pilot, train = trained
    val = _rows(pilot / "runs" / train["run_id"] / "predictions.jsonl")
    unlabelled = _jsonl(tmp_path / "in.jsonl", [{"id": f"x{i}", "text": r["text"]}
                                                for i, r in enumerate(val)])  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(unlabelled), "--out",
                   str(tmp_path / "p.jsonl"), "--no-progress")  # fmt: skip
    assert out["status"] == "completed" and out["run_id"].startswith("predict-")
    assert out["train_run"] == train["run_id"] and out["n"] == len(val) and out["n_scored"] == 0
    assert out["metrics"] is None and out["eval_protocol"] == train["eval_protocol"]
    got = _rows(tmp_path / "p.jsonl")
    assert got == _rows(pilot / "runs" / out["run_id"] / "predictions.jsonl")
    assert [g["parsed"] for g in got] == [r["parsed"] for r in val]
    assert all(g["correct"] is None and g["gold"] is None and g["tokens_cut"] == 0 for g in got)
    labels = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["labels"]
    s = out["summary"]
    assert list(s["predicted"]) == labels and sum(s["predicted"].values()) == len(val)
    assert s["not_a_label"] == 0 and s["truncated"] == {"n": 0, "ids": []}
    ids = [f"x{i}" for i in range(len(val))]
    assert out["in_pilot_splits"] == {"val": {"n": len(val), "ids": ids}}
    assert out["warnings"] == []  # validation examples: named, not warned about
    assert out["input"]["n"] == len(val) and len(out["input"]["sha256"]) == 64
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert rec["kind"] == "predict" and rec["parent"] == train["run_id"]
    assert rec["result"]["summary"] == s

    # with their labels, as a CSV: scored, the train run's validation metrics again
    with (tmp_path / "in.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "category"])  # the label under another name, as files come
        w.writerows([r["text"], r["gold"]] for r in val)
    unscored = run_json("predict", str(pilot), "--input", str(tmp_path / "in.csv"))
    assert unscored["n_scored"] == 0 and unscored["metrics"] is None
    scored = run_json("predict", str(pilot), "--input", str(tmp_path / "in.csv"),
                      "--answer-field", "category", "--no-progress")  # fmt: skip
    assert scored["n_scored"] == len(val)
    assert scored["metrics"]["macro_f1"] == pytest.approx(train["metrics"]["macro_f1"])
    assert scored["metrics"]["accuracy"] == pytest.approx(train["metrics"]["accuracy"])
    human = run_cli("predict", str(pilot), "--input", str(tmp_path / "in.csv"),
                    "--answer-field", "category", "--no-progress")  # fmt: skip
    assert human.returncode == 0 and f"{len(val)} inputs carried an answer" in human.stdout


def test_cut_test_and_training_inputs_are_named_and_warned(trained, tmp_path):
    pilot, _ = trained
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    before = (pilot / spec["data"]["file"]).read_bytes()
    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot

    splits = modality_of(load_pilot(pilot)).prepare().splits
    test_text, train_text = splits["test"][0].text, splits["train"][0].text
    long = "please help " * 400  # far over data.max_length
    rows = [
        {"id": "t", "text": test_text},
        {"id": "tr", "text": train_text},
        {"id": "long", "text": long},
        {"id": "new", "text": "A brand new message."},
    ]
    out = run_json("predict", str(pilot), "--input", str(_jsonl(tmp_path / "i.jsonl", rows)),
                   "--no-progress")  # fmt: skip
    assert out["in_pilot_splits"] == {"test": {"n": 1, "ids": ["t"]},
                                      "train": {"n": 1, "ids": ["tr"]}}  # fmt: skip
    assert out["summary"]["truncated"] == {"n": 1, "ids": ["long"]}
    cut = {r["id"]: r["tokens_cut"] for r in _rows(pilot / "runs" / out["run_id"] /
                                                     "predictions.jsonl")}  # fmt: skip
    assert cut["long"] > 0 and cut["new"] == 0
    w = " ".join(out["warnings"])
    assert "1 inputs were cut to fit data.max_length" in w and "long" in w
    assert "reserved test split" in w and "not a test result" in w and "training examples" in w
    assert (pilot / spec["data"]["file"]).read_bytes() == before  # the pilot's data untouched


def test_the_default_run_is_the_one_the_final_test_confirmed(trained, tmp_path):
    pilot, train = trained
    second = run_json("train", str(pilot), "--no-progress", "--set", "train.lr=0.002")
    inputs = _jsonl(tmp_path / "i.jsonl", [{"text": "Thanks, all good."}])
    assert run_json("predict", str(pilot), "--input", str(inputs),
                    "--no-progress")["train_run"] == second["run_id"]  # fmt: skip
    run_json("eval", str(pilot), "--run", train["run_id"], "--split", "test", "--final",
             "--no-progress")  # fmt: skip
    assert run_json("predict", str(pilot), "--input", str(inputs),
                    "--no-progress")["train_run"] == train["run_id"]  # fmt: skip
    base = run_json("predict", str(pilot), "--input", str(inputs), "--base", "--no-progress")
    assert base["train_run"] is None and base["adapter"] is None and base["n"] == 1


@pytest.mark.parametrize(
    ("content", "flags", "needle"),
    [
        (None, [], "no such data file"),
        (
            '{"text": "ok"}\n{"body": "no text"}\n',
            [],
            "i.jsonl:2: missing field 'text' (--field NAME reads",
        ),
        ('{"text": "ok", "label": "nonsense"}\n', [], "is not one of the task labels"),
        ("", [], "i.jsonl"),
        ('{"text": "ok"}\n', ["--base", "--run", "x"], "--base and --run"),
        ('{"text": "ok"}\n', ["--limit", "0"], "--limit 0"),
        ('{"text": "ok"}\n', ["--out", "/nonexistent/folder/p.jsonl"], "--out"),
    ],
)
def test_bad_input_exits_2_naming_it(trained, tmp_path, content, flags, needle):
    pilot, _ = trained
    path = tmp_path / "i.jsonl"
    if content is not None:
        path.write_text(content)
    before = sorted(p.name for p in (pilot / "runs").iterdir())
    proc = run_cli("predict", str(pilot), "--input", str(path), *flags, "--json")
    assert proc.returncode == 2, proc.stderr
    assert needle in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (pilot / "runs").iterdir()) == before  # no run opened


def test_a_csv_column_by_another_name_and_skipped_rows_are_counted(trained, tmp_path):
    pilot, _ = trained
    path = tmp_path / "i.csv"
    path.write_text("body\nfirst message\n\nsecond message\n")
    proc = run_cli("predict", str(pilot), "--input", str(path), "--json")
    assert proc.returncode == 2 and "no column 'text'" in proc.stderr
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["on_error"] = "skip"
    shutil.copy(pilot / "pilot.yaml", tmp_path / "orig.yaml")
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        path.write_text('body\nfirst message\n""\nsecond message\n')
        out = run_json("predict", str(pilot), "--input", str(path), "--field", "body",
                       "--no-progress")  # fmt: skip
    finally:
        shutil.copy(tmp_path / "orig.yaml", pilot / "pilot.yaml")
    assert out["n"] == 2 and out["input"]["skipped"] == 1
    assert any("set aside (field … is empty: 1)" in w for w in out["warnings"])


def test_an_extraction_is_parsed_and_checked_against_its_schema(tmp_path, tiny_model_dir):
    pilot = tmp_path / "inv"
    shutil.copytree(EXAMPLES / "invoice-fields", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["eval"] = {**(spec.get("eval") or {}), "precision": "fp32", "max_new_tokens": 8}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    rows = [{"text": "Invoice INV-1 from Acme, total 12.50 EUR, due 2024-01-31."},
            {"text": "Rechnung 7 von Beta GmbH"}]  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(_jsonl(tmp_path / "i.jsonl", rows)),
                   "--base", "--no-progress")  # fmt: skip
    s = out["summary"]
    assert s["n"] == 2 and 0 <= s["json_valid_rate"] <= 1 and 0 <= s["schema_valid_rate"] <= 1
    assert "format_valid_rate" not in s  # an extraction's validity is the evaluation's name
    got = _rows(pilot / "runs" / out["run_id"] / "predictions.jsonl")
    for g in got:  # a random model writes no JSON: the parse error is named per row
        assert g["correct"] is None and g["gold"] is None
        assert (g["parsed"] is None) == (g["parse_error"] is not None)


def test_an_adapter_off_its_base_is_refused_and_the_run_kept_as_failed(trained, tmp_path):
    """The pins verify checks: a tokenizer other than the trained one, the base weights."""
    pilot, train = trained
    manifest_path = pilot / "runs" / train["run_id"] / "adapter" / "lorapilot.json"
    original = manifest_path.read_text()
    inputs = _jsonl(tmp_path / "i.jsonl", [{"text": "Thanks, all good."}])
    changes = [
        ("tokenizer_sha256", "0" * 64, "tokenizer sha256"),
        ("base", {"sha256": "1" * 64}, "but the adapter was trained on"),
    ]
    for key, value, needle in changes:
        manifest = json.loads(original)
        manifest[key] = value
        manifest_path.write_text(json.dumps(manifest))
        try:
            proc = run_cli("predict", str(pilot), "--input", str(inputs), "--run",
                           train["run_id"], "--json")  # fmt: skip
        finally:
            manifest_path.write_text(original)
        assert proc.returncode == 1, proc.stderr
        out = json.loads(proc.stdout)
        assert (
            needle in " ".join(out["problems"])
            and "not on what it was trained with" in out["error"]
        )
    failed = [r for r in run_json("runs", str(pilot))["runs"] if r["kind"] == "predict"]
    assert [r["status"] for r in failed[-2:]] == ["failed", "failed"]


def test_a_parquet_file_is_read_its_answer_column_when_present(trained, tmp_path):
    """Parquet as the pilot reads it: only the input column needed, the label read when the
    file has one (a null label: that row predicted, not scored)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pilot, _ = trained
    labels = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["labels"]
    table = pa.table({"text": ["Love it, thanks!", "Where is my parcel?", "Broken on arrival"],
                      "label": [labels[0], None, labels[1]], "other": [1, 2, 3]})  # fmt: skip
    pq.write_table(table, tmp_path / "i.parquet")
    out = run_json("predict", str(pilot), "--input", str(tmp_path / "i.parquet"), "--no-progress")
    assert out["n"] == 3 and out["n_scored"] == 2 and out["metrics"]["n"] == 2
    assert out["input"]["n_with_answer"] == 2
    pq.write_table(table.drop(["label"]), tmp_path / "bare.parquet")
    bare = run_json("predict", str(pilot), "--input", str(tmp_path / "bare.parquet"))
    assert bare["n"] == 3 and bare["n_scored"] == 0


def test_a_saved_hf_dataset_split_is_read_and_a_datasetdict_names_its_splits(trained, tmp_path):
    """A folder datasets' save_to_disk wrote for one split, read as the pilot reads HF data
    (the label optional); a DatasetDict folder or a plain folder is refused, naming why."""
    datasets = pytest.importorskip("datasets")
    pilot, _ = trained
    labels = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["labels"]
    rows = {"text": ["Love it, thanks!", "Where is my parcel?", "Broken on arrival"],
            "label": [labels[0], None, labels[1]]}  # fmt: skip
    ds = datasets.Dataset.from_dict(rows)
    ds.save_to_disk(str(tmp_path / "new"))
    out = run_json("predict", str(pilot), "--input", str(tmp_path / "new"), "--no-progress")
    assert out["n"] == 3 and out["n_scored"] == 2 and len(out["input"]["sha256"]) == 64
    _jsonl(tmp_path / "same.jsonl", [{"text": t} for t in rows["text"]])
    same = run_json("predict", str(pilot), "--input", str(tmp_path / "same.jsonl"))
    parsed = [json.loads(x)["parsed"] for x in open(out["predictions"])]
    assert parsed == [json.loads(x)["parsed"] for x in open(same["predictions"])]
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    proc = run_cli("predict", str(pilot), "--input", str(tmp_path / "dd"))
    assert proc.returncode == 2 and "holds a DatasetDict (splits: test, train)" in proc.stderr
    (tmp_path / "plain").mkdir()
    proc = run_cli("predict", str(pilot), "--input", str(tmp_path / "plain"))
    assert proc.returncode == 2 and "or a folder datasets' save_to_disk wrote" in proc.stderr
