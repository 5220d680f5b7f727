"""The smoke sized to the task: how many examples (per category, topped up, capped) and how many
steps (`auto`); and the decision's smoke gate."""

from __future__ import annotations

from lorapilot.data.audit import smoke_sample
from lorapilot.data.rows import Record
from lorapilot.decision.rule import gate
from lorapilot.spec import SmokeSpec


def recs(n_categories: int, per: int) -> list[Record]:
    return [
        Record(
            id=f"c{c}-{i}",
            text=f"text {c} {i}",
            label=f"l{c}",
            target=None,
            source=f"d.jsonl:{c}",
            split="train",
            category=f"l{c}",
        )  # fmt: skip
        for c in range(n_categories)
        for i in range(per)
    ]


def test_few_categories_are_topped_up_to_the_minimum():
    one = smoke_sample(recs(1, 30), per_category=1, min_n=8, max_n=64, seed=0)
    assert len(one) == 8 and len({r.id for r in one}) == 8  # CoNLL: one default category
    assert len(smoke_sample(recs(1, 5), 1, 8, 64)) == 5  # no more than there are


def test_many_labels_are_sampled_down_to_the_maximum_and_seeded():
    many = smoke_sample(recs(77, 3), per_category=1, min_n=8, max_n=64, seed=0)
    assert len(many) == 64 and len({r.category for r in many}) == 64
    assert [r.id for r in many] == [r.id for r in smoke_sample(recs(77, 3), 1, 8, 64, seed=0)]
    assert len(smoke_sample(recs(60, 3), 1, 8, 64)) == 60  # every one of 60 labels


def test_auto_steps_grow_with_the_examples_within_bounds():
    assert SmokeSpec().steps_for(8) == 40  # 20 passes of one step: the floor
    assert SmokeSpec().steps_for(60) == 80  # 4 steps a pass x 20
    assert SmokeSpec().steps_for(10_000) == 300
    assert SmokeSpec(max_steps=12).steps_for(60) == 12
    # what the budget plans for: 77 labels x 1 capped at 64, 6 labels topped up to 8
    assert SmokeSpec().examples_for(77, 616) == 64 and SmokeSpec().examples_for(6, 516) == 8


GO = {"decision": "GO", "reasons": ["gain ok"]}
VERIFY = {"id": "v", "status": "completed", "ok": True}
TEST = {"id": "t", "gain": {"metric": "macro_f1", "gain": 0.5, "baseline": 0.1, "adapted": 0.6,
                            "bootstrap": {"ci_low": 0.4, "ci_high": 0.6, "ci": 0.95}}}  # fmt: skip


def test_no_go_without_a_passing_smoke_of_this_spec():
    ok = gate(GO, VERIFY, TEST, {"id": "s1", "status": "completed", "ok": True, "error": None})
    assert ok["decision"] == "GO" and ok["gates"]["smoke"] == "ok"
    none = gate(GO, VERIFY, TEST, None)
    assert none["decision"] == "INCONCLUSIVE" and none["gates"]["smoke"] == "not run"
    assert any("no smoke test of this spec" in r for r in none["reasons"])
    failed = gate(GO, VERIFY, TEST, {"id": "s2", "status": "failed", "ok": False,
                                     "error": "smoke: could not overfit"})  # fmt: skip
    assert failed["decision"] == "INCONCLUSIVE" and failed["gates"]["smoke"] == "failed"
    assert any("s2" in r and "could not overfit" in r for r in failed["reasons"])
    nogo = gate({**GO, "decision": "NO-GO"}, VERIFY, TEST, None)
    assert nogo["decision"] == "NO-GO"
