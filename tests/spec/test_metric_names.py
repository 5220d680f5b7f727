"""Metric names are checked up front: a misspelt success metric or guard is exit 2 naming the
key and the closest valid names; the catalogue equals what the metric functions return."""

from __future__ import annotations

import shutil

import pytest
import yaml
from conftest import EXAMPLES, run_cli

from lorapilot.evaluate.metrics import classification_metrics
from lorapilot.evaluate.structured import extraction_metrics
from lorapilot.spec import EvalNormalize, load_pilot, load_spec_file, metric_names


@pytest.mark.parametrize(
    ("where", "metric", "needle"),
    [
        ("success", "macro_f1x", "success.metric: unknown metric 'macro_f1x'"),
        ("success", "bogus_metric", "success.metric: unknown metric 'bogus_metric'"),
        ("guard", "per_category.f2", "guards[0].metric: unknown metric 'per_category.f2'"),
    ],
)
def test_unknown_metric_is_exit_2_naming_the_key(tmp_path, where, metric, needle):
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    if where == "success":
        spec["success"]["metric"] = metric
    else:
        spec["guards"] = [{"metric": metric, "max_drop": 0.05}]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_cli("check", str(pilot))
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and needle in text and "Traceback" not in text
    if metric == "macro_f1x":
        assert "closest: macro_f1" in text


def test_valid_names_pass_including_one_category_and_one_field():
    labels, fields = ["billing", "tech"], ["total", "date"]
    for name in ("macro_f1", "per_category.f1", "per_category.billing.recall"):
        assert metric_names.problem(name, "classification", labels, None) is None
    for name in ("field_f1", "per_field.f1", "per_field.total.accuracy", "per_category.x.field_f1"):
        assert metric_names.problem(name, "extraction", None, fields) is None
    assert metric_names.problem("per_category.nope.f1", "classification", labels, None)
    assert metric_names.problem("macro_f1", "extraction", None, fields)


def test_the_catalogue_is_what_the_metric_functions_return():
    m = classification_metrics(["a", "b"], ["a", None], ["a", "b"])
    scalars = {k for k, v in m.items() if isinstance(v, float)}
    assert scalars == set(metric_names.TOP_LEVEL["classification"])
    assert set(m["per_category"]["a"]) == set(metric_names.PER_CATEGORY_CLASSIFICATION)

    task = load_pilot(EXAMPLES / "invoice-fields").spec.task
    gold = [{f.name: None for f in task.fields}]
    e = extraction_metrics(gold, ['{"vendor": "x"}'], task, EvalNormalize())
    scalars = {k for k, v in e.items() if isinstance(v, float)}
    assert scalars == set(metric_names.TOP_LEVEL["extraction"])
    assert set(next(iter(e["per_field"].values()))) == set(metric_names.PER_FIELD)
    assert set(next(iter(e["per_category"].values()))) == set(metric_names.PER_CATEGORY_EXTRACTION)


def test_nested_paths_map_keys_and_grounding_are_known_names():
    fields = ["intent", "slots", "slots.*", "line_items", "line_items[].amount"]
    for name in ("leaf_f1", "per_field.slots.city.f1", "per_field.line_items[].amount.f1",
                 "per_category.book.leaf_f1", "per_field.slots.f1"):  # fmt: skip
        assert metric_names.problem(name, "extraction", None, fields) is None, name
    assert metric_names.problem("per_field.line_items[].price.f1", "extraction", None, fields)
    subtrees = ["slots", "line_items"]  # a structured field's leaves, scored on their own
    for name in ("per_field.slots.leaf_f1", "per_field.line_items.leaf_recall"):
        assert metric_names.problem(name, "extraction", None, fields, subtrees=subtrees) is None
        assert metric_names.problem(name, "extraction", None, fields)  # not without them
    assert metric_names.problem(
        "per_field.intent.leaf_f1", "extraction", None, fields, subtrees=subtrees
    )
    assert metric_names.problem("per_field.slots.city.bogus", "extraction", None, fields)
    assert metric_names.problem("ungrounded_value_rate", "extraction", None, fields)
    for name in ("ungrounded_value_rate", "per_category.x.ungrounded_value_rate"):
        assert metric_names.problem(name, "extraction", None, fields, grounded=True) is None


def test_the_spec_checks_nested_metric_names(tmp_path):
    from lorapilot.errors import UsageError

    spec = {
        "name": "slots",
        "hypothesis": "h",
        "task": {
            "kind": "extraction",
            "fields": [{"name": "intent"}, {"name": "slots", "type": "map", "values": "string"}],
        },
        "data": {"file": "d.jsonl", "category": "target.intent"},
        "success": {"metric": "leaf_f1", "min_gain": 0.05},
        "guards": [{"metric": "per_field.slots.city.f1", "max_drop": 0.1}],
    }
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec))
    loaded, _ = load_spec_file(tmp_path / "pilot.yaml")
    assert loaded.data.category == "target.intent"
    # the slots' leaves on their own, as success or guard (#35 item 4), judged from metrics
    from lorapilot.evaluate.guards import check_guards
    from lorapilot.evaluate.structured import extraction_metrics
    from lorapilot.spec import EvalNormalize

    sub = {**spec, "guards": [{"metric": "per_field.slots.leaf_f1", "max_drop": 0.1}]}
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(sub))
    loaded, _ = load_spec_file(tmp_path / "pilot.yaml")
    gold = [{"intent": "a", "slots": {"city": "Oslo", "day": "mon"}}]
    before = extraction_metrics(gold, ['{"intent": "a", "slots": {"city": "Oslo"}}'],
                                loaded.task, EvalNormalize())  # fmt: skip
    after = extraction_metrics(gold, ['{"intent": "a", "slots": {}}'], loaded.task, EvalNormalize())
    (result,) = check_guards(loaded.guards, before, after, min_support=1)
    assert result.metric == "per_field.slots.leaf_f1" and result.status == "fail"
    assert (result.baseline, result.candidate) == (pytest.approx(2 / 3), 0.0)
    for bad, where in (
        ({"success": {"metric": "leaf_f2", "min_gain": 0.05}}, "leaf_f1"),
        ({"data": {"file": "d.jsonl", "category": "target.slots"}}, "data.category"),
        ({"data": {"file": "d.jsonl", "category": "target.nope"}}, "data.category"),
    ):
        (tmp_path / "pilot.yaml").write_text(yaml.safe_dump({**spec, **bad}))
        with pytest.raises(UsageError, match=where.replace(".", r"\.")):
            load_spec_file(tmp_path / "pilot.yaml")


def test_answer_match_needs_the_regex_answer_group(tmp_path):
    """`answer_match` is a regex format task's metric only where task.regex marks the answer;
    named without the group it is exit 2 naming the key and how to mark it."""
    from lorapilot.evaluate.structured import format_metrics

    spec = {
        "name": "gsm",
        "hypothesis": "h",
        "task": {"kind": "format", "regex": r"(?s).*\n#### (?P<answer>-?[0-9.,]+)"},
        "data": {"file": "d.jsonl", "fields": {"text": "question", "target": "answer"}},
        "success": {"metric": "answer_match", "min_gain": 0.1},
        "guards": [{"metric": "format_valid_rate", "max_drop": 0.05}],
    }
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec))
    loaded, _ = load_spec_file(tmp_path / "pilot.yaml")
    m = format_metrics(["1\n#### 2"], loaded.task, ["3\n#### 2"], EvalNormalize())
    assert m["answer_match"] == 1.0 and m["exact_match"] == 0.0
    spec["task"]["regex"] = r"(?s).*\n#### -?[0-9.,]+"
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec))
    proc = run_cli("check", str(tmp_path))
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in text
    assert "success.metric: answer_match compares" in text and "(?P<answer>" in text
