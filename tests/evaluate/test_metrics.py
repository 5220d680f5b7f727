"""Metrics on hand-computed cases: classification, JSON parsing, extraction, format, bootstrap."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lorapilot.evaluate.metrics import (
    classification_metrics,
    get_metric,
    paired_bootstrap,
    paired_bootstrap_macro_f1,
    paired_bootstrap_metric,
)
from lorapilot.evaluate.structured import extraction_metrics, format_metrics
from lorapilot.evaluate.values import normalize_value, parse_first_json, values_equal
from lorapilot.spec import EvalNormalize, FieldSpec, TaskSpec

NORM = EvalNormalize()
EXACT = EvalNormalize(case=False, whitespace=False, list_order=False)

# ----------------------------------------------------------------------------- classification

# gold a a b b c, pred a b b None a; label d: no support and never predicted
#            pred: a  b  c  d  invalid
# gold a          1  1  0  0  0
# gold b          0  1  0  0  1
# gold c          1  0  0  0  0
LABELS = ["a", "b", "c", "d"]
GOLD = ["a", "a", "b", "b", "c"]
PRED = ["a", "b", "b", None, "a"]


def test_classification_hand_computed():
    m = classification_metrics(GOLD, PRED, LABELS)
    assert m["n"] == 5
    assert m["accuracy"] == pytest.approx(2 / 5)
    assert m["invalid_rate"] == pytest.approx(1 / 5)
    pc = m["per_category"]
    assert pc["a"] == pytest.approx(
        {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2, "predicted": 2}
    )
    assert pc["b"] == pytest.approx(
        {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2, "predicted": 2}
    )
    # c is never predicted: precision 0 by convention, f1 0, and it counts in the macro mean
    assert pc["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "predicted": 0}
    # d has no support and is never predicted: reported, but left out of the macro mean
    assert pc["d"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0, "predicted": 0}
    assert m["macro_f1"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)


def test_confusion_matrix_cell_by_cell():
    m = classification_metrics(GOLD, PRED, LABELS)
    assert m["confusion"]["labels"] == ["a", "b", "c", "d", "invalid"]
    assert m["confusion"]["matrix"] == [
        [1, 1, 0, 0, 0],
        [0, 1, 0, 0, 1],
        [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
    ]


def test_unknown_label_prediction_is_invalid():
    m = classification_metrics(["a", "b"], ["a", "billing?"], ["a", "b"])
    assert m["invalid_rate"] == 0.5
    assert m["accuracy"] == 0.5
    assert m["per_category"]["b"]["recall"] == 0.0
    assert m["confusion"]["matrix"][1] == [0, 0, 1]


def test_all_correct():
    m = classification_metrics(["a", "b", "b"], ["a", "b", "b"], ["a", "b"])
    assert m["accuracy"] == 1.0 and m["macro_f1"] == 1.0 and m["invalid_rate"] == 0.0
    assert m["confusion"] == {"labels": ["a", "b"], "matrix": [[1, 0], [0, 2]]}


def test_classification_rejects_bad_input():
    with pytest.raises(ValueError, match="not in the task's labels"):
        classification_metrics(["zzz"], ["a"], ["a", "b"])
    with pytest.raises(ValueError, match="predictions"):
        classification_metrics(["a"], [], ["a", "b"])
    assert classification_metrics([], [], ["a", "b"])["accuracy"] == 0.0


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Sure! ```json\n{"a": 1}\n``` done', {"a": 1}),
        ('{"a": {"b": {"c": [1, {"d": 2}]}}} trailing', {"a": {"b": {"c": [1, {"d": 2}]}}}),
        ('x {"a": "}{ not a brace"} y', {"a": "}{ not a brace"}),
        ('prose {not json} then {"ok": true}', {"ok": True}),
        ('{"a": 1} {"b": 2}', {"a": 1}),
    ],
)
def test_parse_first_json_finds_object(text, expected):
    assert parse_first_json(text) == (expected, None)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty output"),
        ("   \n", "empty output"),
        ("no json here", "no JSON object"),
        ('{"a": 1', "invalid JSON at character 0"),
        ('{"a": NaN}', "invalid JSON"),
    ],
)
def test_parse_first_json_errors(text, error):
    obj, why = parse_first_json(text)
    assert obj is None
    assert error in why


def test_parse_first_json_deep_nesting_does_not_raise():
    obj, why = parse_first_json('{"a": ' + "[" * 100_000)
    assert obj is None and why


# ----------------------------------------------------------------------------- normalisation


def test_normalize_case_and_whitespace():
    assert normalize_value("  Acme \n  Corp ", NORM) == "acme corp"
    assert values_equal("  Acme \n  Corp ", "acme corp", NORM)
    assert not values_equal("  Acme \n  Corp ", "acme corp", EXACT)


def test_normalize_list_order():
    assert values_equal(["b", "A"], ["a", "B"], NORM)
    assert not values_equal(["b", "a"], ["a", "b"], EvalNormalize(list_order=False))
    # the order is canonical (JSON text), not numeric: only equality depends on it
    assert normalize_value([3, "x", 1.0], NORM) == normalize_value(["x", 1, 3], NORM)
    assert sorted(normalize_value([3, "x", 1.0], NORM), key=str) == [1, 3, "x"]


def test_normalize_numbers():
    assert values_equal(1, 1.0, NORM) and values_equal(1.0, 1, EXACT)
    assert not values_equal("1", 1, NORM)  # numeric strings are not converted
    assert not values_equal(True, 1, NORM)
    assert not values_equal(1.5, 1, NORM)
    assert values_equal(None, None, NORM) and not values_equal(None, "", NORM)
    assert values_equal({"x": [2.0, 1]}, {"x": [1, 2]}, NORM)


# ----------------------------------------------------------------------------- extraction


def invoice_task() -> TaskSpec:
    return TaskSpec(
        kind="extraction",
        fields=[
            FieldSpec(name="name"),
            FieldSpec(name="amount", type="number"),
            FieldSpec(name="note", required=False),
        ],
    )


GOLDS = [
    {"name": "ACME", "amount": 10, "note": None},
    {"name": "Bolt", "amount": 5, "note": "rush"},
    {"name": "Cog", "amount": 7, "note": None},
]
OUTPUTS = [
    '{"name": "acme ", "amount": 10.0, "note": null}',  # all three correct after normalising
    'Here you go: {"name": "Bolt", "amount": 6}',  # name right, amount wrong, note missed
    "I could not find an invoice.",  # nothing parsed: every field null
]


def test_extraction_hand_computed():
    m = extraction_metrics(GOLDS, OUTPUTS, invoice_task(), NORM)
    assert m["n"] == 3
    assert m["json_valid_rate"] == pytest.approx(2 / 3)
    assert m["schema_valid_rate"] == pytest.approx(2 / 3)
    assert m["required_fields_rate"] == pytest.approx(2 / 3)
    assert m["correct"] == [True, False, False]
    assert m["exact_match"] == pytest.approx(1 / 3)
    # non-null predictions 2 + 2 + 0 = 4, non-null gold 2 + 3 + 2 = 7, true positives 2 + 1 + 0 = 3
    assert m["field_precision"] == pytest.approx(3 / 4)
    assert m["field_recall"] == pytest.approx(3 / 7)
    assert m["field_f1"] == pytest.approx(6 / 11)
    pf = m["per_field"]
    assert pf["name"] == pytest.approx(
        {
            "accuracy": 2 / 3,
            "precision": 1.0,
            "recall": 2 / 3,
            "f1": 0.8,
            "support": 3,
            "predicted": 2,
        }
    )
    assert pf["amount"] == pytest.approx(
        {
            "accuracy": 1 / 3,
            "precision": 0.5,
            "recall": 1 / 3,
            "f1": 0.4,
            "support": 3,
            "predicted": 2,
        }
    )
    # null gold and null prediction agree (examples 1 and 3); the missed "rush" does not
    assert pf["note"] == pytest.approx(
        {
            "accuracy": 2 / 3,
            "precision": 0.0,
            "recall": 0.0,
            "f1": 0.0,
            "support": 1,
            "predicted": 0,
        }
    )
    assert m["field_accuracy"] == pytest.approx((2 / 3 + 1 / 3 + 2 / 3) / 3)
    assert m["parsed"][2] is None and m["parse_errors"][2].startswith("no JSON")
    assert m["parsed"][1] == {"name": "Bolt", "amount": 6}
    assert m["per_category"]["note"]["support"] == 1
    assert m["per_category"]["required_only"]["support"] == 2
    assert m["per_category"]["required_only"]["exact_match"] == 0.5


def test_extraction_missing_required_field_and_empty_output():
    gold = [{"name": "X", "amount": 1, "note": None}] * 2
    m = extraction_metrics(gold, ['{"name": "X"}', ""], invoice_task(), NORM)
    assert m["json_valid_rate"] == 0.5
    assert m["required_fields_rate"] == 0.0
    assert m["schema_valid_rate"] == 0.0
    assert m["correct"] == [False, False]
    assert m["parse_errors"] == [None, "empty output"]
    assert m["per_field"]["name"]["accuracy"] == 0.5


def test_extraction_normalisation_is_the_spec_s():
    task = TaskSpec(kind="extraction", fields=[FieldSpec(name="tags", type="list")])
    gold = [{"tags": ["Urgent", "billing"]}]
    out = ['{"tags": ["billing", "urgent"]}']
    assert extraction_metrics(gold, out, task, NORM)["exact_match"] == 1.0
    assert extraction_metrics(gold, out, task, EXACT)["exact_match"] == 0.0


def test_extraction_length_mismatch():
    with pytest.raises(ValueError):
        extraction_metrics(GOLDS, OUTPUTS[:2], invoice_task(), NORM)


# ----------------------------------------------------------------------------- format


def test_format_regex():
    task = TaskSpec(kind="format", regex=r"[A-Z]{3}-\d{3}")
    outputs = [" ABC-123\n", "abc-123", "ABC-123 and more"]
    m = format_metrics(outputs, task)
    assert m["format_valid_rate"] == pytest.approx(1 / 3)
    assert m["valid"] == [True, False, False] == m["correct"]
    m = format_metrics(outputs, task, ["ABC-123"] * 3, EXACT)
    assert m["correct"] == [True, False, False]
    m = format_metrics(outputs, task, ["ABC-123"] * 3, NORM)  # case-insensitive by the spec
    assert m["correct"] == [True, True, False]
    assert m["exact_match"] == pytest.approx(2 / 3)


GSM_REGEX = r"(?s).*\n#### (?P<answer>-?[0-9][0-9,]*(\.[0-9]+)?)"


def test_format_regex_answer_group_compares_the_marked_part():
    """A worked solution is scored on its final answer, not on the whole text: the group
    `answer` of a valid output against the target's (GSM8K's `#### 72`)."""
    task = TaskSpec(kind="format", regex=GSM_REGEX)
    assert task.answer_group
    gold = ["48/2 = 24\n48+24 = 72\n#### 72"] * 4
    outputs = [
        "Half of 48 is 24.\nSo 72 in all.\n#### 72",  # other working, same answer
        "48+24 = 72\n#### 70",  # valid, wrong answer
        "The answer is 72",  # right number, format not followed: no answer
        "48/2 = 24\n48+24 = 72\n#### 72",  # the target itself
    ]
    m = format_metrics(outputs, task, gold, NORM)
    assert m["valid"] == [True, True, False, True]
    assert m["parsed"] == ["72", "70", None, "72"]
    assert m["correct"] == [True, False, False, True]
    assert m["answer_match"] == pytest.approx(2 / 4)
    assert m["exact_match"] == pytest.approx(1 / 4)
    assert m["format_valid_rate"] == pytest.approx(3 / 4)
    # without targets: validity only, no answer_match
    bare = format_metrics(outputs, task)
    assert "answer_match" not in bare and bare["correct"] == bare["valid"]
    # a regex without the group: no answer_match, correct is the exact match
    plain = format_metrics(outputs, TaskSpec(kind="format", regex=r"(?s).*\n#### -?[0-9]+"), gold)
    assert "answer_match" not in plain and plain["correct"] == [False, False, False, True]


def test_format_json_schema():
    schema = {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "error"]}, "code": {"type": "integer"}},
        "required": ["status"],
    }
    task = TaskSpec(kind="format", json_schema=schema)
    outputs = ['```json\n{"status": "ok", "code": 1}\n```', 'x {"status": "bad"}', "nothing"]
    m = format_metrics(outputs, task)
    assert m["valid"] == [True, False, False]
    assert m["format_valid_rate"] == pytest.approx(1 / 3)
    assert m["json_valid_rate"] == pytest.approx(2 / 3)
    targets = [{"status": "ok", "code": 1}, {"status": "error"}, {"status": "ok"}]
    m = format_metrics(outputs, task, targets, NORM)
    assert m["correct"] == [True, False, False]
    assert m["format_valid_rate"] == pytest.approx(1 / 3)
    assert set(m["per_field"]) == {"status", "code"}
    # code: gold non-null once and predicted right once; status: 3 positives, 1 right of 2 predicted
    assert m["per_field"]["code"]["f1"] == 1.0
    assert m["per_field"]["status"]["precision"] == 0.5


# ----------------------------------------------------------------------------- lookup


def test_get_metric_dotted():
    m = classification_metrics(GOLD, PRED, LABELS)
    assert get_metric(m, "macro_f1") == m["macro_f1"]
    assert get_metric(m, "per_category.a.f1") == 0.5
    dotted = {"per_category": {"v1.2": {"f1": 0.25}, "v1": {"f1": 0.5}}}
    assert get_metric(dotted, "per_category.v1.2.f1") == 0.25
    assert get_metric(dotted, "per_category.v1.f1") == 0.5
    with pytest.raises(KeyError, match="per_category.zz.f1"):
        get_metric(m, "per_category.zz.f1")
    with pytest.raises(KeyError):
        get_metric(m, "macro_f1.x")


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_deterministic():
    rng = np.random.default_rng(1)
    base, cand = rng.integers(0, 2, 50).tolist(), rng.integers(0, 2, 50).tolist()
    a = paired_bootstrap(base, cand, n_boot=500, seed=3)
    assert a == paired_bootstrap(base, cand, n_boot=500, seed=3)
    assert a != paired_bootstrap(base, cand, n_boot=500, seed=4)
    assert a["delta"] == pytest.approx(np.mean(cand) - np.mean(base))
    assert a["ci_low"] <= a["delta"] <= a["ci_high"]


def test_bootstrap_identical_inputs():
    scores = [1, 0, 1, 1, 0, 1]
    r = paired_bootstrap(scores, scores)
    assert r["delta"] == 0.0
    assert r["ci_low"] <= 0.0 <= r["ci_high"]


def test_bootstrap_clearly_better():
    base = [1] * 40 + [0] * 60
    cand = [1] * 90 + [0] * 10
    r = paired_bootstrap(base, cand)
    assert r["delta"] == pytest.approx(0.5)
    assert r["ci_low"] > 0
    assert r["p_le_zero"] == 0.0


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(ValueError):
        paired_bootstrap([], [])
    with pytest.raises(ValueError):
        paired_bootstrap([1], [1], stat="median")  # type: ignore[arg-type]


def _classification_case(n=100, seed=0):
    labels = [f"l{i}" for i in range(6)]
    rng = np.random.default_rng(seed)
    gold = [labels[i] for i in rng.integers(0, 6, n)]
    base = [g if rng.random() < 0.5 else labels[rng.integers(0, 6)] for g in gold]
    cand = [
        g if rng.random() < 0.8 else (None if rng.random() < 0.3 else labels[rng.integers(0, 6)])
        for g in gold
    ]
    return labels, gold, base, cand


def test_bootstrap_metric_macro_f1_fast_and_matches_vectorised():
    labels, gold, base, cand = _classification_case()

    def macro(g, p):
        return classification_metrics(g, p, labels)["macro_f1"]

    start = time.perf_counter()
    slow = paired_bootstrap_metric(macro, base, cand, gold, n_boot=1000, seed=7)
    assert (
        time.perf_counter() - start < 10.0
    )  # a complexity guard, not a benchmark (shared CI cores)
    fast = paired_bootstrap_macro_f1(gold, base, cand, labels, n_boot=1000, seed=7)
    assert slow["delta"] == pytest.approx(macro(gold, cand) - macro(gold, base))
    for key in ("delta", "ci_low", "ci_high", "p_le_zero"):
        assert fast[key] == pytest.approx(slow[key], abs=1e-12)
    assert slow["ci_low"] > 0  # the candidate is much better


def test_bootstrap_metric_identical():
    labels, gold, base, _ = _classification_case(n=30)
    r = paired_bootstrap_macro_f1(gold, base, base, labels, n_boot=200)
    assert r["delta"] == 0.0 and r["ci_low"] == 0.0 == r["ci_high"]


def test_most_confused_lists_off_diagonal_cells_largest_first_with_their_share():
    from lorapilot.evaluate.metrics import most_confused

    labels = ["a", "b", "c"]
    matrix = [[5, 3, 0], [1, 4, 1], [0, 3, 0]]  # rows gold, columns predicted
    got = most_confused(matrix, labels, top=3)
    assert [(c["gold"], c["predicted"], c["count"]) for c in got] == [
        ("a", "b", 3),
        ("c", "b", 3),
        ("b", "a", 1),
    ]
    assert got[0]["share"] == 3 / 8 and got[1]["share"] == 1.0
    assert most_confused([[2, 0], [0, 2]], ["x", "y"]) == []


def test_calibration_offsets_divide_out_the_content_free_preference():
    from lorapilot.evaluate.metrics import calibration_offsets

    # the model prefers label 0 whatever the input: 0.8 / 0.1 / 0.1 with no input at all
    free = np.log([[0.8, 0.1, 0.1], [0.8, 0.1, 0.1], [0.8, 0.1, 0.1]])
    off = calibration_offsets(free + 5.0)  # unnormalised sums: only the ratios count
    np.testing.assert_allclose(off, -np.log([0.8, 0.1, 0.1]))
    x = np.log([0.6, 0.3, 0.1])  # plain argmax 0; relative to the bias, 1 gained most
    assert np.argmax(x) == 0 and np.argmax(x + off) == 1
    flat = calibration_offsets(np.log([[0.7, 0.3], [0.3, 0.7]]))  # averaged: no preference
    np.testing.assert_allclose(flat, [np.log(2), np.log(2)])
    with pytest.raises(ValueError, match="finite"):
        calibration_offsets(np.array([[0.0, np.nan]]))


def test_a_predicted_value_outside_its_enum_is_not_schema_valid():
    """16 of 56 Snips answers of a 2-epoch adapter named an intent not in the spec's enum
    ("PutMusic"): valid JSON, a wrong intent, and not an answer of the schema."""
    task = TaskSpec(
        kind="extraction",
        fields=[
            {"name": "intent", "enum": ["PlayMusic", "GetWeather"]},
            {"name": "slots", "type": "map"},
        ],
    )
    gold = [{"intent": "PlayMusic", "slots": {}}] * 2
    preds = ['{"intent": "PlayMusic", "slots": {}}', '{"intent": "PutMusic", "slots": {}}']
    m = extraction_metrics(gold, preds, task, EvalNormalize())
    assert m["json_valid_rate"] == 1.0 and m["schema_valid_rate"] == 0.5
