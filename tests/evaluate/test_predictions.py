"""The summary of predictions without answers (pure): labels counted, validity and grounding
of JSON answers as the evaluation counts them, cut inputs named."""

from __future__ import annotations

import pytest

from lorapilot.evaluate.predictions import prediction_summary
from lorapilot.spec import TaskSpec


def test_a_classification_counts_each_label_and_the_answers_that_are_none():
    task = TaskSpec(kind="classification", labels=["a", "b", "c"])
    rows = [
        {"id": "1", "parsed": "b", "tokens_cut": 0},
        {"id": "2", "parsed": "b", "tokens_cut": 12},
        {"id": "3", "parsed": None, "tokens_cut": 0},  # generated, not a label
    ]
    s = prediction_summary(task, rows)
    assert s == {"n": 3, "predicted": {"a": 0, "b": 2, "c": 0}, "not_a_label": 1,
                 "truncated": {"n": 1, "ids": ["2"]}}  # fmt: skip


def test_an_extraction_s_validity_and_grounding_are_the_evaluation_s():
    task = TaskSpec(kind="extraction", grounded=True,
                    fields=[{"name": "city"}, {"name": "n", "type": "integer"}])  # fmt: skip
    rows = [
        {"id": "1", "text": "to Paris", "raw_output": '{"city": "Paris", "n": 1}'},
        {"id": "2", "text": "to Rome", "raw_output": '{"city": "Oslo", "n": "x"}'},
        {"id": "3", "text": "to Rome", "raw_output": "no json here"},
    ]
    s = prediction_summary(task, rows)
    assert s["n"] == 3 and s["json_valid_rate"] == pytest.approx(2 / 3)
    assert s["schema_valid_rate"] == pytest.approx(1 / 3)  # "x" is not an integer
    # the string values: Paris (in its input), Oslo and "x" (not in "to Rome")
    assert s["ungrounded_value_rate"] == pytest.approx(2 / 3)
    assert "format_valid_rate" not in s and s["truncated"] == {"n": 0, "ids": []}


def test_a_regex_format_task_counts_the_outputs_that_match():
    task = TaskSpec(kind="format", regex=r"#### (?P<answer>-?\d+)")
    rows = [{"id": "1", "raw_output": "#### 42"}, {"id": "2", "raw_output": "42"}]
    s = prediction_summary(task, rows)
    assert s["format_valid_rate"] == 0.5 and "predicted" not in s
