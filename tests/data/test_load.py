"""Loading JSONL/CSV/Parquet: every validation rule under both error policies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lorapilot.data import load as load_mod
from lorapilot.data.load import load_records
from lorapilot.data.rows import Record, Skipped
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, FieldMap, FieldSpec, TaskSpec

CLF = TaskSpec(kind="classification", labels=["billing", "bug", "other"])
EXT = TaskSpec(
    kind="extraction",
    fields=[
        FieldSpec(name="vendor"),
        FieldSpec(name="total", type="number"),
        FieldSpec(name="discount", type="number", required=False),
        FieldSpec(name="currency", enum=["EUR", "USD"], required=False),
    ],
)


def spec(on_error: str = "fail", file: str = "data.jsonl", **kw) -> DataSpec:
    return DataSpec(file=file, on_error=on_error, **kw)


def jline(**obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


GOOD_CLF = jline(id="a", text="printer is on fire", label="bug")
GOOD_EXT = jline(id="a", text="ACME invoice, total 12", target={"vendor": "ACME", "total": 12})


def write(tmp_path: Path, content: bytes, name: str = "data.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(content)
    return p


# --------------------------------------------------------------------------- one rule each

DEEP = (
    b'{"id": "b", "text": "x", "label": "bug", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
)

RULES = [
    # (task, bad line, expected problem text)
    (CLF, b'{"id": "b", "text": "x", "label": "bug"\n', "invalid JSON: Expecting ',' delimiter"),
    (CLF, b'{"id": "b", "text": "caf\xe9", "label": "bug"}\n', "invalid UTF-8"),
    (CLF, jline(id="b", text="x" * (1 << 20), label="bug"), "line too long"),
    (CLF, b'["b", "x", "bug"]\n', "record is not a JSON object (got array)"),
    (CLF, jline(id="b", label="bug"), "missing field 'text'"),
    (CLF, jline(id="b", text="x"), "missing field 'label'"),
    (CLF, jline(id="b", text=42, label="bug"), "field 'text' must be a string, got number"),
    (CLF, jline(id="b", text=" \n\t ", label="bug"), "field 'text' is empty"),
    (
        CLF,
        jline(id="b", text="x", label="Bug\x07 "),
        "label 'Bug\\x07 ' is not one of the task labels",
    ),
    (CLF, jline(id="b", text="x", label=1), "field 'label' must be a string, got number"),
    (
        EXT,
        jline(id="b", text="x", target=["ACME", 12]),
        "field 'target' must be a JSON object, got array",
    ),
    (
        EXT,
        jline(id="b", text="x", target={"vendor": "ACME", "total": "12"}),
        "target.total: '12' is not of type 'number'",
    ),
    (
        EXT,
        jline(id="b", text="x", target={"vendor": "ACME"}),
        "target: 'total' is a required property",
    ),
    (EXT, jline(id="b", text="x"), "missing field 'target'"),
    (
        EXT,
        jline(id="b", text="x", target={"vendor": "ACME", "total": 1, "currency": "usd"}),
        "target.currency: 'usd' is not one of ['EUR', 'USD'] (not one of the field's `enum`",
    ),
    (CLF, jline(id="a", text="again", label="bug"), "duplicate id 'a' (first at data.jsonl:1)"),
    (CLF, jline(id=[1], text="x", label="bug"), "field 'id' must be a string or an integer"),
    (CLF, DEEP, "JSON nested too deeply"),
    (CLF, jline(id="b", text="a\x00b", label="bug"), "field 'text' contains a NUL byte"),
    (CLF, b'{"id": "b", "text": "x", "label": "bug", "n": NaN}\n', "NaN is not allowed"),
    (CLF, b'{"id": "b", "text": "\\ud800", "label": "bug"}\n', "unpaired surrogate"),
]


@pytest.mark.parametrize(("task", "bad", "problem"), RULES, ids=[r[2][:40] for r in RULES])
def test_rule_fail_names_file_line_and_problem(tmp_path, task, bad, problem):
    good = GOOD_CLF if task is CLF else GOOD_EXT
    path = write(tmp_path, good + bad)
    with pytest.raises(UsageError) as exc:
        load_records(path, task, spec("fail"), display_path="data.jsonl")
    assert str(exc.value).startswith("data.jsonl:2: ")
    assert problem in str(exc.value)


@pytest.mark.parametrize(("task", "bad", "problem"), RULES, ids=[r[2][:40] for r in RULES])
def test_rule_skip_records_the_line_and_goes_on(tmp_path, task, bad, problem):
    good = GOOD_CLF if task is CLF else GOOD_EXT
    after = (
        jline(id="z", text="after the bad one", label="other")
        if task is CLF
        else jline(id="z", text="after", target={"vendor": "B", "total": 1, "discount": 0.5})
    )
    path = write(tmp_path, good + bad + after)
    records, skipped = load_records(path, task, spec("skip"), display_path="data.jsonl")
    assert [r.id for r in records] == ["a", "z"]
    assert len(skipped) == 1
    assert skipped[0].file == "data.jsonl" and skipped[0].line == 2
    assert problem in skipped[0].problem


def test_broken_line_7_is_named(tmp_path):
    lines = [jline(id=str(i), text=f"text {i}", label="bug") for i in range(1, 10)]
    lines[6] = b'{"id": "7", "text": oops}\n'
    path = write(tmp_path, b"".join(lines))
    with pytest.raises(UsageError, match=r"data\.jsonl:7: invalid JSON"):
        load_records(path, CLF, spec(), display_path="data.jsonl")


def test_display_path_defaults_to_path(tmp_path):
    path = write(tmp_path, GOOD_CLF + b"{\n")
    with pytest.raises(UsageError, match=f"^{path}:2: "):
        load_records(path, CLF, spec())


def test_long_label_is_shown_cut_to_80_chars(tmp_path):
    path = write(tmp_path, jline(id="a", text="x", label="L" * 500))
    with pytest.raises(UsageError) as exc:
        load_records(path, CLF, spec())
    assert f"label {'L' * 80!r}… is not one of the task labels (billing, bug, other)" in str(
        exc.value
    )


def test_line_at_the_limit_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setattr(load_mod, "MAX_LINE_BYTES", 100)
    ok = jline(id="a", label="bug", text="x" * 60)
    ok = ok[:-2] + b" " * (101 - len(ok)) + b"}\n"  # content exactly 100 bytes
    assert len(ok) == 101
    too_long = jline(id="b", label="bug", text="y" * 100)
    records, skipped = load_records(
        write(tmp_path, ok + too_long + ok.replace(b'"a"', b'"c"')), CLF, spec("skip")
    )
    assert [r.id for r in records] == ["a", "c"]
    assert [(s.line, s.problem) for s in skipped] == [(2, "line too long (over 100 bytes)")]


# --------------------------------------------------------------------------- files


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="nope.jsonl: no such data file"):
        load_records(tmp_path / "nope.jsonl", CLF, spec(), display_path="nope.jsonl")


def test_directory_is_not_a_file(tmp_path):
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(UsageError, match="not a file"):
        load_records(tmp_path / "d.jsonl", CLF, spec())


@pytest.mark.parametrize("content", [b"", b"\n\n  \n", b"\xef\xbb\xbf"])
def test_empty_file(tmp_path, content):
    with pytest.raises(UsageError, match="no records"):
        load_records(write(tmp_path, content), CLF, spec("skip"))


def test_all_invalid_under_skip_returns_no_records(tmp_path):
    records, skipped = load_records(write(tmp_path, b"{\n[]\n"), CLF, spec("skip"))
    assert records == [] and [s.line for s in skipped] == [1, 2]


def test_unknown_extension(tmp_path):
    path = write(tmp_path, GOOD_CLF, "data.txt")
    with pytest.raises(UsageError, match="set data.format"):
        load_records(path, CLF, spec())
    records, _ = load_records(path, CLF, spec(format="jsonl"))
    assert len(records) == 1


def test_bom_crlf_blank_lines_and_records(tmp_path):
    content = (
        b"\xef\xbb\xbf"
        + GOOD_CLF.replace(b"\n", b"\r\n")
        + b"\n"
        + jline(text="no id", label="other")
    )
    records, skipped = load_records(
        write(tmp_path, content), CLF, spec(), split="val", display_path="d/data.jsonl"
    )
    assert skipped == []
    assert records == [
        Record("a", "printer is on fire", "bug", None, "d/data.jsonl:1", "val", "bug"),
        Record("data-3", "no id", "other", None, "d/data.jsonl:3", "val", "other"),
    ]


def test_integer_ids_and_mapped_fields(tmp_path):
    content = jline(key=7, body="hello", cls="billing")
    data = spec(fields=FieldMap(text="body", label="cls", id="key"))
    records, _ = load_records(write(tmp_path, content), CLF, data)
    assert (records[0].id, records[0].text, records[0].label) == ("7", "hello", "billing")
    with pytest.raises(UsageError, match="missing field 'body'"):
        load_records(write(tmp_path, jline(text="x", label="bug")), CLF, data)


def test_no_id_column_configured(tmp_path):
    data = spec(fields=FieldMap(id=None))
    records, _ = load_records(write(tmp_path, GOOD_CLF + GOOD_CLF), CLF, data)
    assert [r.id for r in records] == ["data-1", "data-2"]


def test_extraction_categories_and_string_target(tmp_path):
    content = GOOD_EXT + jline(
        id="b", text="y", target=json.dumps({"vendor": "B", "total": 2, "discount": 1})
    )
    records, _ = load_records(write(tmp_path, content), EXT, spec())
    assert [r.category for r in records] == ["required_only", "discount"]
    assert records[1].target == {"vendor": "B", "total": 2, "discount": 1}
    assert records[0].label is None


def test_data_category_from_a_column_or_a_target_path(tmp_path):
    slots = TaskSpec(
        kind="extraction",
        fields=[FieldSpec(name="intent"), FieldSpec(name="slots", type="map", values="string")],
    )
    content = jline(id="a", text="to oslo", doc="note", target={"intent": "book", "slots": {}})
    content += jline(id="b", text="rain?", doc="mail", target={"intent": "weather", "slots": {}})
    by_path, _ = load_records(write(tmp_path, content), slots, spec(category="target.intent"))
    assert [r.category for r in by_path] == ["book", "weather"]
    by_column, _ = load_records(write(tmp_path, content), slots, spec(category="doc"))
    assert [r.category for r in by_column] == ["note", "mail"]
    missing = content + jline(id="c", text="x", target={"intent": "book", "slots": {}})
    with pytest.raises(UsageError, match=r"data.jsonl:3: missing field 'doc' \(data.category\)"):
        load_records(write(tmp_path, missing), slots, spec(category="doc"))
    with pytest.raises(UsageError, match="data.category 'target.slots' is object"):
        load_records(write(tmp_path, content), slots, spec(category="target.slots"))


def test_a_json_array_file_is_read_record_by_record_with_their_lines(tmp_path):
    """A .json file holding one array of records (Alpaca's data.json, NLU++'s folds): each
    record named by the line it starts on, a record that is not an object set aside like a
    bad line; invalid JSON fails the whole file (an array has no next line to resume at)."""
    body = (b'\xef\xbb\xbf  [\n  {"id": "a", "text": "printer is on fire", "label": "bug"},\n'
            b'  {"id": "b",\n   "text": "refund please",\n   "label": "billing"},\n  7,\n'
            b'  {"id": "c", "text": "hello", "label": "other"}\n]\n')  # fmt: skip
    path = write(tmp_path, body, "data.json")
    records, skipped = load_records(path, CLF, spec("skip", file="data.json"))
    assert [(r.id, r.label, r.source) for r in records] == [
        ("a", "bug", f"{path}:2"), ("b", "billing", f"{path}:3"), ("c", "other", f"{path}:7")
    ]  # fmt: skip
    assert [(s.line, s.problem) for s in skipped] == [
        (6, "record is not a JSON object (got number)")
    ]
    with pytest.raises(UsageError, match=rf"^{path}:6: record is not a JSON object"):
        load_records(path, CLF, spec(file="data.json"))
    rec = b'{"text": "a", "label": "bug"}'
    broken = [
        (b"[\n " + rec + b'\n {"text": "b"}\n]', ":3: invalid JSON in a JSON array file: "
         "expected ',' or ']' after a record"),
        (b"[\n " + rec + b',\n {"text" "b"}\n]', ":3: invalid JSON in a JSON array"),
        (b"[\n " + rec + b'\n]\n\n{"x": 1}', ":5: text after the JSON array's end"),
        (b"[\n " + rec, ":2: invalid JSON in a JSON array file: expected"),
    ]  # fmt: skip
    for content, said in broken:
        path = write(tmp_path, content, "data.json")
        with pytest.raises(UsageError, match=re.escape(said)):
            load_records(path, CLF, spec("skip", file="data.json"))
    with pytest.raises(UsageError, match="no records"):
        load_records(write(tmp_path, b"[ ]", "data.json"), CLF, spec(file="data.json"))
    # a .jsonl file is JSON Lines whatever its first line holds
    lines = write(tmp_path, b"[1, 2]\n" + GOOD_CLF, "data.jsonl")
    records, skipped = load_records(lines, CLF, spec("skip"))
    assert len(records) == 1 and skipped[0].line == 1


# --------------------------------------------------------------------------- CSV


def test_csv_loading(tmp_path):
    content = (
        "\ufeffid,text,target\n"
        'a,"ACME\ninvoice, total 12","{""vendor"": ""ACME"", ""total"": 12}"\n'
        "\n"
        'b,plain,"{""vendor"": ""B"", ""total"": 1.5, ""discount"": null}"\n'
    ).encode()
    records, skipped = load_records(
        write(tmp_path, content, "d.csv"), EXT, spec(file="d.csv"), display_path="d.csv"
    )
    assert skipped == []
    assert [(r.id, r.text, r.source) for r in records] == [
        ("a", "ACME\ninvoice, total 12", "d.csv:2"),  # the data row's first line
        ("b", "plain", "d.csv:5"),
    ]
    assert records[1].target == {"vendor": "B", "total": 1.5, "discount": None}


def test_csv_row_problems(tmp_path):
    content = (
        b"text,label\n"
        b"ok one,bug\n"
        b"caf\xe9,bug\n"
        b"too,many,cells\n"
        b",bug\n"
        b"no label,\n"
        b"bad label,Bug\n"
        + b"x" * (2 << 20)
        + b",bug\n"
        + b"long but fine "
        + b"y" * 500_000
        + b",other\n"
    )
    path = write(tmp_path, content, "d.csv")
    records, skipped = load_records(path, CLF, spec("skip", file="d.csv"), display_path="d.csv")
    assert [r.source for r in records] == ["d.csv:2", "d.csv:9"]
    assert [r.id for r in records] == ["d-2", "d-9"]
    assert [(s.line, s.problem.split(" (")[0]) for s in skipped] == [
        (3, "invalid UTF-8"),
        (4, "has 3 columns, the header has 2"),
        (5, "field 'text' is empty"),
        (6, "missing field 'label'"),
        (7, "label 'Bug' is not one of the task labels"),
        (8, "line too long"),
    ]
    with pytest.raises(UsageError, match=r"^d\.csv:3: invalid UTF-8"):
        load_records(path, CLF, spec("fail", file="d.csv"), display_path="d.csv")


def test_csv_target_not_json(tmp_path):
    content = b"text,target\nx,{not json}\n"
    with pytest.raises(UsageError, match=r"d\.csv:2: field 'target' is not valid JSON: Expecting"):
        load_records(
            write(tmp_path, content, "d.csv"), EXT, spec(file="d.csv"), display_path="d.csv"
        )


def test_csv_missing_column_is_named(tmp_path):
    with pytest.raises(
        UsageError, match=r"d\.csv:1: no column 'label' \(columns: text, category\)"
    ):
        load_records(
            write(tmp_path, b"text,category\nx,bug\n", "d.csv"),
            CLF,
            spec(file="d.csv"),
            display_path="d.csv",
        )


# --------------------------------------------------------------------------- Parquet


def test_parquet_struct_and_string_targets(tmp_path):
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "id": ["a", "b", "c"],
            "text": ["one", "two", "three"],
            "target": [
                {"vendor": "A", "total": 1.0, "discount": None},
                {"vendor": "B", "total": 2.0, "discount": 0.5},
                {"vendor": "C", "total": None, "discount": None},
            ],
        }
    )
    pq.write_table(table, path)
    records, skipped = load_records(
        path, EXT, spec("skip", file="d.parquet"), display_path="d.parquet"
    )
    assert [(r.id, r.source, r.category) for r in records] == [
        ("a", "d.parquet:row 1", "required_only"),
        ("b", "d.parquet:row 2", "discount"),
    ]
    assert records[1].target == {"vendor": "B", "total": 2.0, "discount": 0.5}
    assert skipped == [Skipped("d.parquet", 3, "target.total: None is not of type 'number'")]
    with pytest.raises(UsageError, match=r"^d\.parquet:row 3: target\.total"):
        load_records(path, EXT, spec("fail", file="d.parquet"), display_path="d.parquet")

    path2 = tmp_path / "s.parquet"
    pq.write_table(
        pa.table({"text": ["x", "y"], "target": ['{"vendor": "A", "total": 1}', "[1]"]}), path2
    )
    records, skipped = load_records(
        path2, EXT, spec("skip", file="s.parquet"), display_path="s.parquet"
    )
    assert [r.id for r in records] == ["s-1"]
    assert skipped[0].line == 2 and "must be a JSON object, got array" in skipped[0].problem


def test_parquet_classification_and_wrong_type(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a", "b"], "label": ["bug", "other"], "id": [10, 11]}), path)
    records, _ = load_records(path, CLF, spec(file="c.parquet"))
    assert [(r.id, r.label) for r in records] == [("10", "bug"), ("11", "other")]
    pq.write_table(pa.table({"text": [1, 2], "label": ["bug", "bug"]}), path)
    with pytest.raises(UsageError, match="row 1: field 'text' must be a string, got number"):
        load_records(path, CLF, spec(file="c.parquet"))


def test_parquet_unreadable_or_missing_column(tmp_path):
    path = write(tmp_path, b"not parquet at all", "x.parquet")
    with pytest.raises(UsageError, match="not a readable Parquet file"):
        load_records(path, CLF, spec(file="x.parquet"))
    pq.write_table(pa.table({"body": ["a"], "label": ["bug"]}), path)
    with pytest.raises(UsageError, match="no column 'text'"):
        load_records(path, CLF, spec(file="x.parquet"))


# --------------------------------------------------------------------------- properties

_line = st.binary(max_size=60).filter(lambda b: b"\n" not in b and b.strip() != b"")
_json_ish = st.lists(
    st.one_of(
        _line,
        st.sampled_from(
            [
                GOOD_CLF.rstrip(b"\n"),
                b'{"text": "x", "label": "bug"}',
                b'{"id": 1}',
                b"[[[[",
                b"\xef\xbb\xbf{}",
            ]
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=_json_ish)
def test_random_lines_are_skipped_or_fail_cleanly(tmp_path, lines):
    path = write(tmp_path, b"\n".join(lines) + b"\n")
    first = lines[0].removeprefix(b"\xef\xbb\xbf")  # a BOM at the file start is not content
    n_records = sum(1 for line in [first, *lines[1:]] if line.strip())
    if n_records == 0:
        with pytest.raises(UsageError, match="no records"):
            load_records(path, CLF, spec("skip"))
        return
    records, skipped = load_records(path, CLF, spec("skip"))
    assert len(records) + len(skipped) == n_records
    assert all(isinstance(s, Skipped) and 1 <= s.line <= len(lines) and s.problem for s in skipped)
    if skipped:
        with pytest.raises(UsageError, match=rf"^{path}:{skipped[0].line}: "):
            load_records(path, CLF, spec("fail"))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.binary(max_size=300),
    fmt=st.sampled_from(["jsonl", "csv"]),
    task=st.sampled_from([CLF, EXT]),
)
def test_random_bytes_never_crash(tmp_path, content, fmt, task):
    path = write(tmp_path, content, f"r.{fmt}")
    for policy in ("skip", "fail"):
        try:
            load_records(path, task, spec(policy, file=f"r.{fmt}"))
        except UsageError:
            pass


# --------------------------------------------------------------------------- spec columns


def test_parquet_reads_the_category_and_group_columns(tmp_path):
    """A columnar reader loads the columns data.category and data.split.group name (it read
    only text/label/target/id, so every row lacked its category)."""
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.table(
            {
                "id": ["a", "b"],
                "text": ["one", "two"],
                "doc": ["note", "mail"],
                "who": [7, 9],
                "target": [{"vendor": "A", "total": 1.0}, {"vendor": "B", "total": 2.0}],
            }
        ),
        path,
    )
    data = spec(file="d.parquet", category="doc", split={"group": "who"})
    records, skipped = load_records(path, EXT, data, display_path="d.parquet")
    assert skipped == []
    assert [(r.category, r.group) for r in records] == [("note", "7"), ("mail", "9")]


def test_group_column_missing_from_the_header_or_a_row(tmp_path):
    data = spec(file="d.csv", split={"group": "who"})
    with pytest.raises(
        UsageError, match=r"^d\.csv:1: no column 'who' \(columns: id, text, label\)"
    ):
        load_records(write(tmp_path, b"id,text,label\na,x,bug\n", "d.csv"), CLF, data,
                     display_path="d.csv")  # fmt: skip
    content = jline(id="a", text="x", label="bug", who="u1") + jline(id="b", text="y", label="bug")
    data = spec("skip", split={"group": "who"})
    records, skipped = load_records(write(tmp_path, content), CLF, data, display_path="data.jsonl")
    assert [r.group for r in records] == ["u1"]
    assert skipped == [Skipped("data.jsonl", 2, "missing field 'who' (data.split.group)")]


def test_unlisted_labels_drop_leaves_them_out_counted_whatever_on_error_says(tmp_path):
    content = (
        jline(id="a", text="x", label="bug")
        + jline(id="b", text="y", label="Not sure")
        + jline(id="c", text="z", label="billing")
    )
    with pytest.raises(UsageError, match="set data.unlisted_labels: drop"):
        load_records(write(tmp_path, content), CLF, spec())
    records, skipped = load_records(
        write(tmp_path, content), CLF, spec(unlisted_labels="drop"), display_path="data.jsonl"
    )
    assert [r.id for r in records] == ["a", "c"]
    assert skipped == [
        Skipped("data.jsonl", 2, "label 'Not sure' is not in task.labels", label="Not sure")
    ]
    # an invalid row is still invalid: data.on_error: fail stops on it
    broken = content + jline(id="d", text="", label="bug")
    with pytest.raises(UsageError, match=r"data.jsonl:4: field 'text' is empty"):
        load_records(write(tmp_path, broken), CLF, spec(unlisted_labels="drop"))


def test_skipped_summary_groups_rows_by_problem_with_their_values():
    from lorapilot.data.rows import skipped_summary

    rows = [Skipped("d.csv", i, f"label {lab!r} is not one of the task labels (a, b)")
            for i, lab in enumerate(["x", "y", "x", "it's"], 2)]  # fmt: skip
    rows.append(Skipped("d.csv", 9, "image 'img/1.jpg': no such file"))
    assert skipped_summary(rows, values=2) == [
        {
            "problem": "label … is not one of the task labels (a, b)",
            "count": 4,
            "first": "d.csv:2",
            "values": {"'x'": 2, '"it\'s"': 1},
            "n_values": 3,
        },
        {"problem": "image …: no such file", "count": 1, "first": "d.csv:9",
         "values": {"'img/1.jpg'": 1}, "n_values": 1},
    ]  # fmt: skip
