"""Multi-label classification metrics: every label a yes/no decision per example, parsed from
a comma-separated answer; the bootstrap recomputes the same numbers from per-example counts."""

from __future__ import annotations

import pytest

from lorapilot.decision.rule import bootstrap_for
from lorapilot.evaluate.metrics import (
    multi_label_counts,
    multi_label_metrics,
    multi_label_totals,
    parse_label_set,
)
from lorapilot.evaluate.predictions import prediction_summary
from lorapilot.evaluate.served import gbnf_label_set
from lorapilot.spec import TaskSpec, metric_names

LABELS = ["anger", "joy", "neutral", "sadness"]


def test_answers_parse_to_labels_in_task_order_and_name_what_is_not_a_label():
    assert parse_label_set("sadness, Anger", LABELS) == (["anger", "sadness"], [])
    assert parse_label_set(" joy ,joy, ", LABELS) == (["joy"], [])
    assert parse_label_set("joy, happiness", LABELS) == (["joy"], ["happiness"])
    assert parse_label_set("I feel nothing", LABELS) == (None, ["I feel nothing"])
    assert parse_label_set("", LABELS) == (None, [])


def test_metrics_count_each_label_as_a_decision():
    gold = [["anger", "sadness"], ["joy"], ["neutral"], ["joy", "neutral"]]
    pred = [["anger"], ["joy"], None, ["joy", "neutral"]]
    m = multi_label_metrics(gold, pred, LABELS, invalid=[False, False, True, False])
    assert m["n"] == 4
    assert m["accuracy"] == pytest.approx(2 / 4)  # the whole set right: rows 2 and 4
    assert m["invalid_rate"] == pytest.approx(1 / 4)
    # pooled: tp 4 (anger, joy, joy, neutral), gold 6, predicted 4
    assert m["micro_f1"] == pytest.approx(2 * 1.0 * (4 / 6) / (1.0 + 4 / 6))
    per = m["per_category"]
    assert per["sadness"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1,
                              "predicted": 0}  # fmt: skip
    assert per["neutral"]["recall"] == pytest.approx(0.5)
    assert per["neutral"]["precision"] == pytest.approx(1.0)
    f1s = [per[lab]["f1"] for lab in LABELS]
    assert m["macro_f1"] == pytest.approx(sum(f1s) / 4)
    assert m["labels_per_example"] == pytest.approx(6 / 4)
    assert m["predicted_per_example"] == pytest.approx(4 / 4)
    scalars = {k for k, v in m.items() if isinstance(v, float)}
    assert scalars == set(metric_names.TOP_LEVEL["multi_label_classification"])


def test_summed_counts_give_the_same_metrics_as_the_whole_computation():
    gold = [["anger"], ["joy", "sadness"], ["neutral"]]
    pred = [["anger", "joy"], ["sadness"], ["neutral"]]
    totals: dict = {}
    for g, p in zip(gold, pred, strict=True):
        for k, v in multi_label_counts(g, p, LABELS).items():
            totals[k] = totals.get(k, 0) + v
    assert multi_label_totals(totals, LABELS) == multi_label_metrics(gold, pred, LABELS)


def test_gold_outside_the_labels_is_an_error():
    with pytest.raises(ValueError, match="not in the task's labels"):
        multi_label_metrics([["fear"]], [["joy"]], LABELS)


def test_bootstrap_recomputes_the_gain_from_the_rows():
    gold = [["anger"], ["joy"], ["joy", "neutral"], ["sadness"]] * 5
    base = [{"id": str(i), "gold": g, "parsed": None, "unknown_labels": ["x"]}
            for i, g in enumerate(gold)]  # fmt: skip
    cand = [{"id": str(i), "gold": g, "parsed": g, "unknown_labels": []}
            for i, g in enumerate(gold)]  # fmt: skip
    for metric in ("macro_f1", "micro_f1", "accuracy", "invalid_rate"):
        b = bootstrap_for("multi_label_classification", metric, base, cand, LABELS, n_boot=200)
        assert b is not None, metric
        want = -1.0 if metric == "invalid_rate" else 1.0
        assert b["delta"] == pytest.approx(want), metric
    one = bootstrap_for("multi_label_classification", "per_category.joy.recall", base, cand,
                        LABELS, n_boot=200)  # fmt: skip
    assert one is not None and one["delta"] == pytest.approx(1.0)


def test_prediction_summary_counts_an_input_for_each_of_its_labels():
    task = TaskSpec(kind="multi_label_classification", labels=LABELS)
    rows = [{"parsed": ["anger", "joy"], "unknown_labels": []},
            {"parsed": ["joy"], "unknown_labels": ["meh"]},
            {"parsed": None, "unknown_labels": []}]  # fmt: skip
    s = prediction_summary(task, rows)
    assert s["predicted"] == {"anger": 1, "joy": 2, "neutral": 0, "sadness": 0}
    assert s["not_a_label"] == 2


def test_the_grammar_holds_every_ordered_set_of_labels_and_nothing_else():
    g = gbnf_label_set(["a", "b", "c"])
    rules = dict(line.split(" ::= ") for line in g.strip().splitlines())
    assert rules == {
        "root": "l0 | l1 | l2",
        "l0": '"a" (", " (l1 | l2))?',
        "l1": '"b" (", " (l2))?',
        "l2": '"c"',
    }
    with pytest.raises(ValueError):
        gbnf_label_set([])
