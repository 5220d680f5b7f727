"""Success criterion and guards: each rule passing and failing, expansion, missing metrics."""

from __future__ import annotations

import pytest

from lorapilot.evaluate.guards import RuleResult, check_guards, check_success, support_of
from lorapilot.spec import GuardSpec, SuccessSpec

BASE = {
    "macro_f1": 0.70,
    "accuracy": 0.80,
    "invalid_rate": 0.10,
    "per_category": {
        "billing": {"f1": 0.80, "support": 10},
        "tech": {"f1": 0.60, "support": 12},
        "rare": {"f1": 0.50, "support": 2},
    },
}
CAND = {
    "macro_f1": 0.75,
    "accuracy": 0.78,
    "invalid_rate": 0.0,
    "per_category": {
        "billing": {"f1": 0.85, "support": 10},
        "tech": {"f1": 0.45, "support": 12},
        "rare": {"f1": 0.0, "support": 2},
    },
}


def guards(**kw) -> list[RuleResult]:
    min_support = kw.pop("min_support", 5)
    return check_guards([GuardSpec(**kw)], BASE, CAND, min_support)


def test_success_exact_threshold_passes():
    # 0.75 - 0.70 is 0.04999... in floating point; the pre-registered 0.05 must still pass
    r = check_success(SuccessSpec(metric="macro_f1", min_gain=0.05), BASE, CAND)
    assert r == RuleResult("min_gain", "macro_f1", "pass", 0.70, 0.75, 0.05, r.detail)
    assert "gain +0.0500" in r.detail


def test_success_fails():
    r = check_success(SuccessSpec(metric="macro_f1", min_gain=0.10), BASE, CAND)
    assert r.status == "fail" and r.threshold == 0.10


@pytest.mark.parametrize(
    ("kw", "status"),
    [
        ({"metric": "accuracy", "max_drop": 0.05}, "pass"),
        ({"metric": "accuracy", "max_drop": 0.01}, "fail"),
        ({"metric": "accuracy", "min": 0.75}, "pass"),
        ({"metric": "accuracy", "min": 0.90}, "fail"),
        ({"metric": "macro_f1", "min_gain": 0.01}, "pass"),
        ({"metric": "macro_f1", "min_gain": 0.20}, "fail"),
        ({"metric": "invalid_rate", "max": 0.0}, "pass"),
        ({"metric": "accuracy", "max": 0.5}, "fail"),
        ({"metric": "invalid_rate", "max_rise": 0.0}, "pass"),  # 0.10 -> 0.0: fell
        ({"metric": "macro_f1", "max_rise": 0.01}, "fail"),  # rose 0.05
    ],
)
def test_each_rule(kw, status):
    [r] = guards(**kw)
    assert r.status == status
    assert r.metric == kw["metric"]
    assert r.candidate == CAND[kw["metric"]] and r.baseline == BASE[kw["metric"]]


def test_rule_kinds_recorded():
    assert [r.rule for r in guards(metric="accuracy", max_drop=0.1)] == ["max_drop"]
    assert guards(metric="invalid_rate", min=0.0)[0].rule == "min"


def test_per_category_expansion_with_low_support():
    results = guards(metric="per_category.f1", max_drop=0.1, min_support=5)
    by_metric = {r.metric: r for r in results}
    assert list(by_metric) == [
        "per_category.billing.f1",
        "per_category.tech.f1",
        "per_category.rare.f1",
    ]
    assert by_metric["per_category.billing.f1"].status == "pass"
    tech = by_metric["per_category.tech.f1"]
    assert tech.status == "fail" and (tech.baseline, tech.candidate) == (0.60, 0.45)
    rare = by_metric["per_category.rare.f1"]  # dropped 0.5, but 2 examples decide nothing
    assert rare.status == "insufficient_data"
    assert "support 2 examples < min_support 5" in rare.detail
    assert rare.candidate == 0.0


def test_per_category_named_one():
    [r] = guards(metric="per_category.rare.f1", max_drop=0.1, min_support=2)
    assert r.metric == "per_category.rare.f1" and r.status == "fail"
    [r] = guards(metric="per_category.billing.f1", min=0.8)
    assert r.status == "pass"


def test_missing_metric_fails_without_raising():
    [r] = guards(metric="field_f1", max_drop=0.1)
    assert r.status == "fail" and r.candidate is None and r.baseline is None
    assert "missing" in r.detail
    [r] = guards(metric="per_field.f1", max_drop=0.1)  # no per_field in classification metrics
    assert r.status == "fail" and "missing" in r.detail
    [r] = guards(metric="per_category.nope.f1", min=0.1)
    assert r.status == "fail" and "missing" in r.detail
    r = check_success(SuccessSpec(metric="exact_match", min_gain=0.0), BASE, CAND)
    assert r.status == "fail" and "missing" in r.detail


def test_min_rule_needs_no_baseline():
    [r] = check_guards([GuardSpec(metric="accuracy", min=0.5)], {}, CAND, 5)
    assert r.status == "pass" and r.baseline is None
    [r] = check_guards([GuardSpec(metric="invalid_rate", max=0.05)], {}, CAND, 5)
    assert r.status == "pass" and "<= max 0.05" in r.detail
    [r] = check_guards([GuardSpec(metric="invalid_rate", max_rise=0.05)], {}, CAND, 5)
    assert r.status == "fail" and "baseline missing" in r.detail
    [r] = check_guards([GuardSpec(metric="accuracy", max_drop=0.5)], {}, CAND, 5)
    assert r.status == "fail" and "baseline missing" in r.detail


def test_non_numeric_metric_fails():
    [r] = check_guards([GuardSpec(metric="per_category", min=0.5)], BASE, CAND, 5)
    assert r.status == "fail" and "not a number" in r.detail


def test_guards_in_spec_order():
    specs = [GuardSpec(metric="accuracy", min=0.5), GuardSpec(metric="macro_f1", max_drop=0.0)]
    assert [r.metric for r in check_guards(specs, BASE, CAND, 5)] == ["accuracy", "macro_f1"]


def test_a_guard_on_the_ungrounded_value_rate():
    """The issue's acceptance: a prediction that invents a value raises the rate, and a
    `max` guard on it fails; the grounded prediction passes."""
    from lorapilot.evaluate.structured import extraction_metrics
    from lorapilot.spec import EvalNormalize, TaskSpec

    task = TaskSpec(kind="extraction", grounded=True, fields=[{"name": "city"}])
    gold, text = [{"city": "Oslo"}], ["flight to Oslo"]
    honest = extraction_metrics(gold, ['{"city": "Oslo"}'], task, EvalNormalize(), texts=text)
    invents = extraction_metrics(gold, ['{"city": "Rome"}'], task, EvalNormalize(), texts=text)
    assert invents["ungrounded_value_rate"] == 1.0 and honest["ungrounded_value_rate"] == 0.0
    guard = [GuardSpec(metric="ungrounded_value_rate", max=0.02)]
    assert check_guards(guard, honest, honest, 0)[0].status == "pass"
    assert check_guards(guard, honest, invents, 0)[0].status == "fail"
    rise = [GuardSpec(metric="ungrounded_value_rate", max_rise=0.0)]
    assert check_guards(rise, honest, invents, 0)[0].status == "fail"


def test_grounding_counts_free_text_only_closed_sets_are_left_out():
    """#35 item 3: an intent (a closed set: `enum`, or `grounded: false`) beside a slot map is
    not counted as invented; a prediction equal to gold has ungrounded_value_rate 0, and an
    invented slot value still counts."""
    import json

    from lorapilot.data.targets import grounded_strings
    from lorapilot.evaluate.leaves import root_spec
    from lorapilot.evaluate.structured import extraction_metrics
    from lorapilot.spec import EvalNormalize, TaskSpec

    texts = ["play the latest album by adele on spotify", "book a table for two in paris"]
    gold = [
        {"intent": "PlayMusic", "slots": {"artist": "adele", "service": "spotify"}},
        {"intent": "BookRestaurant", "slots": {"party_size": "two", "city": "paris"}},
    ]
    for intent in (
        {"name": "intent", "enum": ["PlayMusic", "BookRestaurant"]},
        {"name": "intent", "grounded": False},
    ):
        slots = {"name": "slots", "type": "map", "values": "string"}
        task = TaskSpec(kind="extraction", grounded=True, fields=[intent, slots])
        preds = [json.dumps(g) for g in gold]
        m = extraction_metrics(gold, preds, task, EvalNormalize(), texts=texts)
        assert m["ungrounded_value_rate"] == 0.0
        invented = [*preds[:1], json.dumps({**gold[1], "slots": {"city": "rome"}})]
        m2 = extraction_metrics(gold, invented, task, EvalNormalize(), texts=texts)
        assert m2["ungrounded_value_rate"] == pytest.approx(1 / 3)  # rome of adele, spotify, rome
        assert grounded_strings(gold[0], root_spec(task)) == ["adele", "spotify"]
    free = TaskSpec(kind="extraction", grounded=True, fields=[{"name": "intent"}, slots])
    before = extraction_metrics(
        gold, [json.dumps(g) for g in gold], free, EvalNormalize(), texts=texts
    )
    assert before["ungrounded_value_rate"] == pytest.approx(2 / 6)  # the two intents, as before


def test_field_accuracy_comes_with_the_gold_and_predicted_counts():
    """#35 item 8: an adapter that answers empty lists keeps a high field_accuracy on mostly
    empty gold; the counts beside it show it (CoNLL: accuracy 0.695, recall 0.07)."""
    import json

    from lorapilot.evaluate.structured import extraction_metrics
    from lorapilot.spec import EvalNormalize, TaskSpec

    fields = [{"name": n, "type": "list", "items": "string", "required": False}
              for n in ("per", "org", "loc", "misc")]  # fmt: skip
    task = TaskSpec(kind="extraction", fields=fields)
    gold = [{"per": ["Ada"], "org": [], "loc": [], "misc": []}] + [
        {"per": [], "org": [], "loc": [], "misc": []}
    ] * 3
    empty = [json.dumps({"per": [], "org": [], "loc": [], "misc": []})] * 4
    m = extraction_metrics(gold, empty, task, EvalNormalize())
    assert m["field_accuracy"] > 0.9 and m["leaf_recall"] == 0.0
    assert (m["leaf_gold"], m["leaf_predicted"]) == (1, 0)  # the one name, not given
    # an empty list is a value at field level: 16 fields given, 16 in gold
    assert (m["field_gold"], m["field_predicted"]) == (16, 16)
    cat = next(iter(m["per_category"].values()))
    assert "field_gold" in cat and "field_predicted" in cat


# --------------------------------------------------------------------------- support and noise


def test_every_rule_carries_the_support_its_metric_is_computed_over():
    extraction = {
        "n": 40,
        "leaf_f1": 0.5, "leaf_precision": 0.6, "leaf_gold": 90, "leaf_predicted": 70,
        "field_recall": 0.4, "field_gold": 60, "field_predicted": 50,
        "ungrounded_value_rate": 1 / 15, "grounding_checked": 15,
        "exact_match": 0.3,
        "per_field": {"slots": {"f1": 0.5, "precision": 0.4, "support": 33, "predicted": 20,
                                "accuracy": 0.7, "leaf_f1": 0.2, "leaf_gold": 31}},
        "per_category": {"book.a": {"support": 7, "field_f1": 0.2, "field_gold": 12}},
    }  # fmt: skip
    expected = {
        "leaf_f1": (90, "gold values"),
        "leaf_precision": (70, "predicted values"),
        "field_recall": (60, "gold values"),
        "ungrounded_value_rate": (15, "values checked"),
        "exact_match": (40, "examples"),
        "per_field.slots.f1": (33, "gold values"),
        "per_field.slots.precision": (20, "predicted values"),
        "per_field.slots.accuracy": (40, "examples"),  # a share of examples
        "per_field.slots.leaf_f1": (31, "gold values"),
        "per_category.book.a.field_f1": (12, "gold values"),
        "per_category.book.a.exact_match": (7, "examples"),
        "per_category.nope.f1": (None, None),
    }
    assert {m: support_of(extraction, m) for m in expected} == expected
    assert support_of(CAND, "per_category.tech.f1") == (12, "examples")
    assert support_of({"per_category": {"a": {"precision": 1.0, "predicted": 3}}},
                      "per_category.a.precision") == (3, "predicted examples")  # fmt: skip
    assert support_of({}, "accuracy") == (None, None)


def test_a_guard_on_fewer_values_than_min_support_is_not_judged():
    # the CoNLL case: 1 invented value among the 15 the model predicted
    cand = {"n": 200, "ungrounded_value_rate": 1 / 15, "grounding_checked": 15}
    guard = [GuardSpec(metric="ungrounded_value_rate", max=0.02)]
    (r,) = check_guards(guard, {}, cand, min_support=20)
    assert r.status == "insufficient_data" and (r.support, r.support_of) == (15, "values checked")
    assert "support 15 values checked < min_support 20: too few to judge (it would fail)" in (
        r.detail
    )
    (r,) = check_guards(guard, {}, cand, min_support=10)
    assert r.status == "fail"  # no CI given: the point estimate decides


def test_a_miss_whose_ci_reaches_the_threshold_is_within_noise():
    base, cand = {"n": 50, "accuracy": 0.80}, {"n": 50, "accuracy": 0.72}
    guard = [GuardSpec(metric="accuracy", max_drop=0.05)]  # dropped 0.08
    (noisy,) = check_guards(guard, base, cand, 5, {"accuracy": {"ci_low": -0.2, "ci_high": 0.01}})
    assert noisy.status == "within_noise" and (noisy.ci_low, noisy.ci_high) == (-0.2, 0.01)
    assert "change CI [-0.2000, +0.0100] reaches the threshold" in noisy.detail
    assert "support 50 examples" in noisy.detail
    # the whole CI lies beyond: at least a 0.06 drop
    (failed,) = check_guards(
        guard, base, cand, 5, {"accuracy": {"ci_low": -0.12, "ci_high": -0.06}}
    )
    assert failed.status == "fail"
    # a pass stays a pass whatever its CI
    (ok,) = check_guards(guard, base, {"n": 50, "accuracy": 0.79}, 5,
                         {"accuracy": {"ci_low": -0.3, "ci_high": 0.1}})  # fmt: skip
    assert ok.status == "pass"


@pytest.mark.parametrize(
    ("guard", "cand", "interval", "status"),
    [
        # absolute rules are judged on the candidate's own CI (value_low / value_high)
        ({"max": 0.02}, 0.07, {"value_low": 0.0, "value_high": 0.2}, "within_noise"),
        ({"max": 0.02}, 0.07, {"value_low": 0.03, "value_high": 0.2}, "fail"),
        ({"min": 0.9}, 0.85, {"value_low": 0.7, "value_high": 0.95}, "within_noise"),
        ({"min": 0.9}, 0.85, {"value_low": 0.7, "value_high": 0.88}, "fail"),
        # relative rules on the CI of the change
        ({"min_gain": 0.1}, 0.55, {"ci_low": -0.05, "ci_high": 0.12}, "within_noise"),
        ({"min_gain": 0.1}, 0.55, {"ci_low": -0.05, "ci_high": 0.08}, "fail"),
        ({"max_rise": 0.01}, 0.55, {"ci_low": -0.01, "ci_high": 0.1}, "within_noise"),
        ({"max_rise": 0.01}, 0.55, {"ci_low": 0.02, "ci_high": 0.1}, "fail"),
    ],
)
def test_each_rule_fails_only_beyond_its_ci(guard, cand, interval, status):
    (r,) = check_guards(
        [GuardSpec(metric="m", **guard)], {"n": 30, "m": 0.5}, {"n": 30, "m": cand}, 5,
        {"m": interval},
    )  # fmt: skip
    assert r.status == status
