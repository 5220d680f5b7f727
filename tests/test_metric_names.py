"""Metric names are checked up front: a misspelt success metric or guard is exit 2 naming the
key and the closest valid names; the catalogue equals what the metric functions return."""

from __future__ import annotations

import shutil

import pytest
import yaml
from conftest import EXAMPLES, run_cli

from lorapilot import metric_names
from lorapilot.evaluate.metrics import classification_metrics, extraction_metrics
from lorapilot.spec import EvalNormalize, load_pilot


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
