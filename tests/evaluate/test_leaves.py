"""Nested extraction targets scored leaf by leaf, on hand-computed cases for each shape."""

from __future__ import annotations

import itertools
import random

import pytest

from lorapilot.errors import UsageError
from lorapilot.evaluate import leaves
from lorapilot.evaluate.metrics import (
    classification_counts,
    classification_metrics,
    classification_totals,
)
from lorapilot.evaluate.structured import extraction_metrics
from lorapilot.spec import EvalNormalize, TaskSpec, ValueSpec

NORM = EvalNormalize()


def spec(**kw) -> ValueSpec:
    return ValueSpec(**kw)


INVOICE = spec(
    type="object",
    fields=[
        {"name": "number"},
        {"name": "address", "type": "object", "required": False,
         "fields": [{"name": "city"}, {"name": "zip"}]},
        {"name": "tags", "type": "list", "items": "string"},
        {"name": "lines", "type": "list",
         "items": {"type": "object",
                   "fields": [{"name": "desc"}, {"name": "amount", "type": "number"}]}},
    ],
)  # fmt: skip


def test_paths_of_each_shape():
    assert INVOICE.leaf_paths() == [
        "number", "address.city", "address.zip", "tags[]", "lines[].desc", "lines[].amount",
    ]  # fmt: skip
    assert spec(type="map", values="string").leaf_paths("slots") == ["slots.*"]
    assert spec(type="list").leaf_paths("x") == ["x"]  # untyped: one leaf


def test_a_perfect_prediction_in_another_order_matches_every_leaf():
    gold = {
        "number": "A1",
        "address": {"city": "Oslo", "zip": "0150"},
        "tags": ["urgent", "paid"],
        "lines": [{"desc": "pen", "amount": 2}, {"desc": "ink", "amount": 5.0}],
    }
    pred = {
        "lines": [{"amount": 5, "desc": "Ink"}, {"desc": "pen", "amount": 2}],
        "tags": ["paid", "urgent"],
        "address": {"zip": "0150", "city": "oslo"},
        "number": "a1",
    }
    counts = leaves.compare(gold, pred, INVOICE, NORM)
    assert counts == {
        "number": [1, 1, 1],
        "address.city": [1, 1, 1],
        "address.zip": [1, 1, 1],
        "tags[]": [2, 2, 2],
        "lines[].desc": [2, 2, 2],
        "lines[].amount": [2, 2, 2],
    }


def test_extra_keys_missing_object_duplicated_item_and_misaligned_lines():
    gold = {
        "number": "A1",
        "address": {"city": "Oslo", "zip": "0150"},
        "tags": ["urgent"],
        "lines": [{"desc": "pen", "amount": 2}, {"desc": "ink", "amount": 5}],
    }
    pred = {
        "number": "A1",
        "vendor": "Acme",  # not declared: one wrong prediction
        # address missing: both of its leaves missed
        "tags": ["urgent", "urgent"],  # duplicated: one extra prediction
        # one line right, one with a wrong amount, one invented
        "lines": [{"desc": "ink", "amount": 6}, {"desc": "pen", "amount": 2}, {"desc": "cap"}],
    }
    counts = leaves.compare(gold, pred, INVOICE, NORM)
    assert counts["vendor"] == [0, 0, 1]
    assert counts["address.city"] == [0, 1, 0] and counts["address.zip"] == [0, 1, 0]
    assert counts["tags[]"] == [1, 1, 2]
    # pen<->pen (2 leaves), ink<->ink (desc only); cap unmatched: desc predicted, amount null
    assert counts["lines[].desc"] == [2, 2, 3]
    assert counts["lines[].amount"] == [1, 2, 2]
    tp = sum(c[0] for c in counts.values())
    gold_n = sum(c[1] for c in counts.values())
    pred_n = sum(c[2] for c in counts.values())
    assert (tp, gold_n, pred_n) == (5, 8, 9)


def test_ordered_lists_compare_by_position():
    s = spec(type="object", fields=[{"name": "steps", "type": "list", "items": "string",
                                     "ordered": True}])  # fmt: skip
    counts = leaves.compare({"steps": ["a", "b", "c"]}, {"steps": ["b", "a", "c"]}, s, NORM)
    assert counts["steps[]"] == [1, 3, 3]
    loose = spec(type="object", fields=[{"name": "steps", "type": "list", "items": "string"}])
    counts = leaves.compare({"steps": ["a", "b", "c"]}, {"steps": ["b", "a", "c"]}, loose, NORM)
    assert counts["steps[]"] == [3, 3, 3]


def test_a_wrong_typed_value_misses_its_leaves_and_counts_one_wrong_prediction():
    counts = leaves.compare({"address": {"city": "Oslo", "zip": "1"}, "number": "A"},
                            {"address": "Oslo 1", "number": "A"}, INVOICE, NORM)  # fmt: skip
    assert counts["address.city"] == [0, 1, 0] and counts["address"] == [0, 0, 1]


def test_best_matching_is_optimal_against_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n, m = rng.randint(1, 5), rng.randint(1, 5)
        score = [[rng.randint(0, 4) for _ in range(m)] for _ in range(n)]
        pairs = leaves.best_matching(score)
        assert len({i for i, _ in pairs}) == len(pairs) == len({j for _, j in pairs})
        got = sum(score[i][j] for i, j in pairs)
        best = 0
        for cols in itertools.permutations(range(m), min(n, m)):
            rows = range(min(n, m)) if n <= m else None
            if rows is None:  # more rows than columns: choose which rows
                for chosen in itertools.permutations(range(n), m):
                    best = max(
                        best, sum(score[r][c] for r, c in zip(chosen, range(m), strict=True))
                    )
                break
            best = max(best, sum(score[r][c] for r, c in zip(rows, cols, strict=True)))
        assert got == best, (score, pairs)


SLOTS = TaskSpec(
    kind="extraction",
    fields=[{"name": "intent"}, {"name": "slots", "type": "map", "values": "string"}],
)


def test_slot_filling_metrics_leaf_f1_per_slot_path_and_per_intent():
    gold = [
        {"intent": "book", "slots": {"city": "Oslo", "day": "mon"}},
        {"intent": "book", "slots": {"city": "Rome"}},
        {"intent": "weather", "slots": {"city": "Oslo"}},
    ]
    outputs = [
        '{"intent": "book", "slots": {"city": "oslo", "day": "tue"}}',
        '{"intent": "book", "slots": {"city": "Rome", "time": "9"}}',
        "no json here",
    ]
    m = extraction_metrics(gold, outputs, SLOTS, NORM, categories=[g["intent"] for g in gold])
    # leaves: intent x3, slots.city x3, slots.day x1 = 7 gold; predicted: 2 intents, city x2,
    # day, time = 6; correct: 2 intents + 2 cities = 4
    assert m["leaf_precision"] == pytest.approx(4 / 6)
    assert m["leaf_recall"] == pytest.approx(4 / 7)
    assert m["leaf_f1"] == pytest.approx(2 * (4 / 6) * (4 / 7) / (4 / 6 + 4 / 7))
    assert m["per_field"]["slots.city"]["recall"] == pytest.approx(2 / 3)
    assert m["per_field"]["slots.day"]["precision"] == 0.0
    assert m["per_field"]["slots.time"]["predicted"] == 1  # a declared map path: reported
    assert m["per_field"]["slots"]["accuracy"] == pytest.approx(0.0)  # whole map: never equal
    # the slots' own leaves (#35 item 4): city x3 + day = 4 gold, city x2 + day + time = 4
    # predicted, 2 cities right; the headline leaf_f1 mixes in the intents
    slots = m["per_field"]["slots"]
    assert (slots["leaf_gold"], slots["leaf_predicted"]) == (4, 4)
    assert slots["leaf_precision"] == slots["leaf_recall"] == slots["leaf_f1"] == pytest.approx(0.5)
    assert "leaf_f1" not in m["per_field"]["intent"]  # a scalar field: its f1 is the leaf's
    assert set(m["per_category"]) == {"book", "weather"}
    assert m["per_category"]["weather"]["json_valid_rate"] == 0.0
    assert m["per_category"]["book"]["leaf_f1"] == pytest.approx(2 * 4 / (5 + 6))
    assert m["exact_match"] == 0.0 and m["json_valid_rate"] == pytest.approx(2 / 3)


def test_flat_fields_leaf_f1_equals_field_f1():
    task = TaskSpec(kind="extraction", fields=[{"name": "a"}, {"name": "b", "required": False},
                                               {"name": "c", "type": "list"}])  # fmt: skip
    gold = [{"a": "x", "b": None, "c": [1, 2]}, {"a": "y", "b": "z", "c": []}]
    out = ['{"a": "x", "b": "q", "c": [2, 1]}', '{"a": "n"}']
    m = extraction_metrics(gold, out, task, NORM)
    for k in ("precision", "recall", "f1"):
        assert m[f"leaf_{k}"] == pytest.approx(m[f"field_{k}"])
    assert set(m["per_field"]) == {"a", "b", "c"}


def test_grounding_counts_invented_values():
    task = TaskSpec(
        kind="extraction",
        grounded=True,
        fields=[{"name": "city"}, {"name": "people", "type": "list", "items": "string"}],
    )
    gold = [{"city": "Oslo", "people": ["Ann"]}]
    out = ['{"city": "oslo", "people": ["Ann", "Bob"]}']
    m = extraction_metrics(gold, out, task, NORM, texts=["Ann flies to  OSLO"])
    assert m["ungrounded_value_rate"] == pytest.approx(1 / 3)  # Bob is not in the text
    assert m["per_category"]["required_only"]["ungrounded_value_rate"] == pytest.approx(1 / 3)
    flat = extraction_metrics(gold, out, task.model_copy(update={"grounded": False}), NORM)
    assert "ungrounded_value_rate" not in flat


def test_classification_totals_equal_classification_metrics():
    rng = random.Random(1)
    labels = ["a", "b", "c"]
    gold = [rng.choice(labels) for _ in range(50)]
    pred = [rng.choice([*labels, None, "zzz"]) for _ in range(50)]
    full = classification_metrics(gold, pred, labels)
    totals: dict = {}
    for g, p in zip(gold, pred, strict=True):
        for k, v in classification_counts(g, p, labels).items():
            totals[k] = totals.get(k, 0) + v
    got = classification_totals(totals, labels)
    full.pop("confusion")
    assert got.pop("per_category") == full.pop("per_category")
    assert got == pytest.approx(full)


def test_schema_shapes_become_value_specs():
    s = leaves.from_schema(
        {
            "type": "object",
            "properties": {
                "intent": {"type": "string"},
                "slots": {"type": "object", "additionalProperties": {"type": "string"}},
                "items": {"type": "array", "items": {"type": "object",
                                                     "properties": {"n": {"type": "integer"}}}},
            },
            "required": ["intent"],
        }
    )  # fmt: skip
    assert s.leaf_paths() == ["intent", "slots.*", "items[].n"]
    assert [f.required for f in s.fields] == [True, False, False]


@pytest.mark.parametrize(
    ("fields", "where", "what"),
    [
        ([{"name": "a"}, {"name": "b"}, {"name": "c", "type": "list",
          "items": {"type": "object", "fields": [{"name": "x", "type": "tuple"}]}}],
         "task.fields[2].items.fields[0].type", "string"),
        ([{"name": "o", "type": "object"}], "task.fields[0]", "needs `fields`"),
        ([{"name": "s", "values": "string"}], "task.fields[0]", "belongs to type map"),
        ([{"name": "o", "type": "object", "fields": [{"name": "x"}, {"name": "x"}]}],
         "task.fields[0]", "unique"),
    ],
)  # fmt: skip
def test_bad_nesting_is_named_by_its_path(tmp_path, fields, where, what):
    import yaml

    from lorapilot.spec import load_spec_file

    path = tmp_path / "pilot.yaml"
    spec_d = {
        "name": "x",
        "hypothesis": "h",
        "task": {"kind": "extraction", "fields": fields},
        "data": {"file": "d.jsonl"},
    }
    path.write_text(yaml.safe_dump(spec_d))
    with pytest.raises(UsageError) as e:
        load_spec_file(path)
    assert where in str(e.value) and what in str(e.value)


def test_a_scalar_or_list_value_is_a_multiset_under_its_own_path():
    """`values: string | list` (#35 item 7): a slot named twice holds a list; one value is a
    list of one; compared as multisets, at the slot's path (no `[]`)."""
    slots = spec(type="map", values="string | list")
    assert slots.values.type == "string" and slots.values.or_list
    gold = {"city": ["Oslo", "Bergen"], "day": "mon"}
    got = leaves.compare(gold, {"city": "oslo", "day": ["Mon"]}, slots, NORM)
    assert got == {"city": [1, 2, 1], "day": [1, 1, 1]}
    twice = leaves.compare(gold, {"city": ["Bergen", "Bergen", "Oslo"]}, slots, NORM)
    assert twice == {"city": [2, 2, 3], "day": [0, 1, 0]}
    assert slots.leaf_paths("slots") == ["slots.*"]
