"""data.fields.text_template: the input built from several columns (a title and a body, a
subject and a message), as every reader reads it; empty columns counted, not hidden; bad
templates refused with the key named."""

from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import init_tiny_pilot, run_cli, run_json
from pydantic import ValidationError

from lorapilot.data.load import load_records
from lorapilot.data.rows import Record
from lorapilot.data.summary import template_report
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, FieldMap, TaskSpec
from lorapilot.spec.data import template_parts

CLF = TaskSpec(kind="classification", labels=["Tops", "Dresses"])
TEMPLATE = "Title: {Title}\nReview: {Review Text}"


def data(template: str = TEMPLATE, file: str = "reviews.csv", **kw) -> DataSpec:
    fields = FieldMap(text_template=template, label="Department Name", id=None)
    return DataSpec(file=file, fields=fields, **kw)


def write_csv(path, rows, header=("Title", "Review Text", "Department Name")):
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_parts_take_column_names_whole_and_keep_literal_braces():
    parts = template_parts("{{json}} {Review Text} {a.b}/{x[0]}")
    assert [n for _, n in parts if n] == ["Review Text", "a.b", "x[0]"]
    assert "".join(literal for literal, _ in parts) == "{json}  /"
    assert FieldMap(text_template="{b}{a}{b}").input_columns("text") == ["b", "a"]


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("no column at all", "names no column"),
        ("{title:>10}", "no format spec or conversion"),
        ("{title!r}", "no format spec or conversion"),
        ("{title", "write a column as {name}"),
        ("{} and {body}", "every placeholder names a column"),
    ],
)
def test_bad_templates_are_refused(template, problem):
    with pytest.raises(ValidationError, match="text_template") as e:
        FieldMap(text_template=template)
    assert problem in str(e.value)


def test_text_and_text_template_together_are_refused():
    with pytest.raises(ValidationError, match="not both"):
        FieldMap(text="body", text_template="{title} {body}")


def test_csv_rows_render_the_template_and_name_their_empty_columns(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", [
        ["Lovely", "Fits well, soft.", "Tops"],
        ["", "Too long for me", "Dresses"],  # no title: its place is left empty, counted
        ["", "", "Tops"],  # nothing to read: an invalid row
    ])  # fmt: skip
    records, skipped = load_records(path, CLF, data(on_error="skip"))
    assert [r.text for r in records] == [
        "Title: Lovely\nReview: Fits well, soft.",
        "Title: \nReview: Too long for me",
    ]
    assert [r.empty_fields for r in records] == [(), ("Title",)]
    assert [r.label for r in records] == ["Tops", "Dresses"]
    (sk,) = skipped
    assert sk.line == 4 and sk.problem == (
        "every column of data.fields.text_template is empty: Title, Review Text"
    )
    with pytest.raises(UsageError, match=r"reviews.csv:4: every column"):
        load_records(path, CLF, data())


def test_a_column_the_csv_lacks_is_named_from_the_header(tmp_path):
    path = write_csv(tmp_path / "reviews.csv", [["a", "Tops"]], header=("Title", "Department Name"))
    with pytest.raises(UsageError, match=r"reviews.csv:1: no column 'Review Text'"):
        load_records(path, CLF, data())


def test_jsonl_absent_null_and_numbers_and_a_list_refused(tmp_path):
    rows = [
        {"Title": "Cute", "Review Text": "Love it", "Department Name": "Tops"},
        {"Review Text": "No title key", "Department Name": "Tops"},  # absent: empty
        {"Title": None, "Review Text": 5, "Department Name": "Dresses"},  # a number: as read
        {"Title": ["a"], "Review Text": "x", "Department Name": "Tops"},
        {"Title": True, "Review Text": "x", "Department Name": "Tops"},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, skipped = load_records(path, CLF, data(file="r.jsonl", on_error="skip"))
    assert [r.text for r in records] == [
        "Title: Cute\nReview: Love it",
        "Title: \nReview: No title key",
        "Title: \nReview: 5",
    ]
    assert [r.empty_fields for r in records] == [(), ("Title",), ("Title",)]
    assert [(s.line, s.problem) for s in skipped] == [
        (4, "field 'Title' (data.fields.text_template) must be a string or a number, got array"),
        (5, "field 'Title' (data.fields.text_template) must be a string or a number, "
            "got boolean"),
    ]  # fmt: skip


def test_parquet_nulls_and_nan_are_empty(tmp_path):
    path = tmp_path / "r.parquet"
    table = pa.table({
        "Title": ["A", None, "C"],
        "Review Text": ["one", "two", None],
        "score": [1.5, math.nan, 3.0],
        "Department Name": ["Tops", "Tops", "Dresses"],
    })  # fmt: skip
    pq.write_table(table, path)
    tmpl = "{Title} | {Review Text} | {score}"
    records, _ = load_records(path, CLF, data(template=tmpl, file="r.parquet"))
    assert [r.text for r in records] == ["A | one | 1.5", " | two | ", "C |  | 3.0"]
    assert [r.empty_fields for r in records] == [(), ("Title", "score"), ("Review Text",)]


def _prepared(**splits):
    def rec(i, empty):
        return Record(id=str(i), text="t", label="Tops", target=None, source="f:1",
                      split=None, category="Tops", empty_fields=empty)  # fmt: skip

    return SimpleNamespace(
        splits={s: [rec(i, e) for i, e in enumerate(v)] for s, v in splits.items()}
    )


def test_the_report_counts_empty_columns_per_split_and_warns():
    spec = SimpleNamespace(
        data=data(template="{Title} {Body} {Titel}"), task=CLF
    )  # Titel: a misspelt column, empty everywhere
    pilot = SimpleNamespace(spec=spec)
    prepared = _prepared(
        train=[("Titel",), ("Title", "Titel"), ("Titel",)], val=[("Title", "Titel")]
    )
    rep = template_report(pilot, prepared)
    assert rep["columns"] == ["Title", "Body", "Titel"]
    assert rep["empty"]["Title"] == {"train": 1, "val": 1, "total": 2}
    assert rep["empty"]["Body"]["total"] == 0
    assert rep["warnings"] == [
        "2 of 4 example(s) have an empty 'Title' (data.fields.text_template): its place in "
        "their text is left empty",
        "column 'Titel' of data.fields.text_template is empty or absent in all 4 examples: is "
        "the name spelt as in the data?",
    ]


@pytest.fixture(scope="module")
def templated(tmp_path_factory, tiny_model_dir):
    """`init`'s pilot with its messages split into a subject and a body (a CSV)."""
    pilot = init_tiny_pilot(tmp_path_factory.mktemp("template"), tiny_model_dir)
    rows = [json.loads(x) for x in (pilot / "data" / "examples.jsonl").read_text().splitlines()]
    with (pilot / "data" / "mail.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "subject", "body", "label"])
        for i, r in enumerate(rows):
            subject = "" if i % 10 == 0 else " ".join(r["text"].split()[:2])  # every 10th: none
            w.writerow([r["id"], subject, r["text"], r["label"]])
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["file"] = "data/mail.csv"
    spec["data"]["fields"] = {"text_template": "Subject: {subject}\n\n{body}", "label": "label"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot, rows


def test_the_data_verb_versions_the_rendered_text_and_reports_the_empty_subjects(templated):
    pilot, rows = templated
    out = run_json("data", str(pilot))
    tt = out["text_template"]
    assert tt["template"] == "Subject: {subject}\n\n{body}"
    assert tt["columns"] == ["subject", "body"]
    no_subject = len(range(0, len(rows), 10))
    assert tt["empty"]["subject"]["total"] == no_subject and tt["empty"]["body"]["total"] == 0
    assert f"{no_subject} of {len(rows)} example(s) have an empty 'subject'" in out["warnings"][0]
    shown = run_json("inspect", str(pilot))
    rendered = [e["rendered"] for e in shown["examples"]]
    assert rendered and all("Message:\nSubject: " in t for t in rendered)


def test_predict_reads_the_template_s_columns_and_refuses_field(templated, tmp_path):
    pilot, _ = templated
    new = tmp_path / "new.csv"
    new.write_text("subject,text\nHello,the app crashes\n")
    res = run_cli("predict", str(pilot), "--input", str(new), "--base")
    assert res.returncode == 2 and "no column 'body'" in (res.stdout + res.stderr)
    res = run_cli("predict", str(pilot), "--input", str(new), "--field", "text", "--base")
    assert res.returncode == 2
    assert "data.fields.text_template names (subject, body)" in " ".join(
        (res.stdout + res.stderr).split()
    )


def test_check_names_the_key_of_a_bad_template(templated, tmp_path):
    pilot, _ = templated
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["fields"]["text_template"] = "Subject: {subject!r}"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    res = run_cli("check", str(bad))
    assert res.returncode == 2
    assert "data.fields.text_template" in (res.stdout + res.stderr) and "{subject!r}" in (
        res.stdout + res.stderr
    )


def test_a_saved_hf_dataset_reads_the_template_s_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"q": "What is 2+2?", "ctx": "Arithmetic.", "n": 4, "lab": "Tops"},
        {"q": "Why?", "ctx": None, "n": 1, "lab": "Dresses"},
    ]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    spec = DataSpec(
        file="ds", fields=FieldMap(text_template="Q: {q}\nC: {ctx} ({n})", label="lab", id=None)
    )
    records, _ = load_records(tmp_path / "ds", CLF, spec, display_path="ds")
    assert [r.text for r in records] == ["Q: What is 2+2?\nC: Arithmetic. (4)", "Q: Why?\nC:  (1)"]
    assert [r.empty_fields for r in records] == [(), ("ctx",)]
    bad = spec.model_copy(update={"fields": FieldMap(text_template="{q} {body}", label="lab")})
    with pytest.raises(UsageError, match=r"ds: no column 'body' \(columns: q, ctx, n, lab\)"):
        load_records(tmp_path / "ds", CLF, bad, display_path="ds")
