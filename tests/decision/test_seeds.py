"""Seed replicates (`selection.seeds`): the selection over each variant's seeds, the noise
summary and its limitations, by hand; the replicate pilots' seeds and spec identity."""

from __future__ import annotations

import pytest

from lorapilot.decision.plan import replicate_of, select, selection_rule
from lorapilot.decision.seeds import seed_noise, seed_warnings
from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot


def _row(id_, name, k, value, wall=10.0, status="completed", seed=None):
    return {"id": id_, "kind": "train", "name": name, "replicate": k, "seed": seed or k,
            "status": status, "wall_s": wall, "comparable": True,
            "metrics": {"macro_f1": value}, "reason": None}  # fmt: skip


def _value(metrics, metric):
    return (metrics or {}).get(metric)


def test_a_variant_is_chosen_by_its_mean_and_carried_by_its_median_seed():
    rows = [
        _row("a0", "base", 0, 0.50), _row("a1", "base", 1, 0.90), _row("a2", "base", 2, 0.52),
        _row("b0", "r8", 0, 0.70), _row("b1", "r8", 1, 0.64), _row("b2", "r8", 2, 0.66),
    ]  # fmt: skip
    # base has the single best run (0.90) but the lower mean (0.640 vs 0.667)
    winner, table = select(rows, ["base", "r8"], "macro_f1", _value, seeds=3)
    assert winner["id"] == "b2"  # r8's median seed: 0.64 < 0.66 < 0.70
    base, r8 = table
    assert r8["selected"] and not base["selected"]
    assert r8["run_id"] == "b2" and base["run_id"] == "a2"  # each variant's median seed
    assert r8["value"] == pytest.approx(2.0 / 3) and r8["mean"] == r8["value"]
    assert r8["sd"] == pytest.approx(0.030550504633)  # sample sd of 0.70, 0.64, 0.66
    assert (r8["low"], r8["high"], r8["seeds_done"]) == (0.64, 0.70, 3)
    assert [s["run_id"] for s in r8["seeds"]] == ["b0", "b1", "b2"]
    assert r8["seconds"] == 30.0  # the variant's cost is all its seeds'
    # one seed: exactly the single-run rule (the run itself, no seed keys)
    one = select([_row("x", "base", 0, 0.5)], ["base"], "macro_f1", _value)
    assert one[0]["id"] == "x" and "seeds" not in one[1][0]
    assert "mean validation value" in selection_rule(3) and "median seed" in selection_rule(3)
    assert selection_rule(1) != selection_rule(3)


def test_an_even_count_takes_the_lower_middle_and_ties_go_to_the_earlier_run():
    rows = [_row("a0", "base", 0, 0.6), _row("a1", "base", 1, 0.4),
            _row("a2", "base", 2, 0.5), _row("a3", "base", 3, 0.5)]  # fmt: skip
    winner, _ = select(rows, ["base"], "macro_f1", _value, seeds=4)
    assert winner["id"] == "a2"  # sorted 0.4, 0.5 (a2), 0.5 (a3), 0.6: lower middle, earlier


def test_a_variant_competes_only_with_every_seed_completed():
    rows = [
        _row("a0", "base", 0, 0.50), _row("a1", "base", 1, 0.50),
        _row("b0", "r8", 0, 0.90), _row("b1", "r8", 1, None, status="failed"),
        _row("c0", "lr", 0, 0.95),  # its second seed never ran
        _row("z9", "base", 5, 0.99),  # a replicate past selection.seeds: not counted
    ]  # fmt: skip
    winner, table = select(rows, ["base", "r8", "lr"], "macro_f1", _value, seeds=2)
    assert winner["id"] == "a0"
    base, r8, lr = table
    assert base["tries"] == 2 and base["value"] == 0.5
    assert r8["status"] == "failed" and r8["seeds_done"] == 1  # its latest attempt failed
    assert lr["status"] == "incomplete" and "1 of 2 seeds" in lr["reason"]
    assert [s["status"] for s in lr["seeds"]] == ["completed", "not run"]
    assert lr["value"] == 0.95  # the mean of what completed, shown; not eligible


def _seeded_table(r8_values, base_values, deltas):
    rows = [_row(f"b{k}", "r8", k, v, seed=10 + k) for k, v in enumerate(r8_values)]
    rows += [_row(f"a{k}", "base", k, v) for k, v in enumerate(base_values)]
    _, table = select(rows, ["base", "r8"], "macro_f1", _value, seeds=len(r8_values))
    for s, d in zip(table[1]["seeds"], deltas, strict=True):
        s["delta"] = d
    return table


def test_the_noise_says_when_the_choice_and_the_gain_are_inside_the_seeds_spread():
    clear = seed_noise(_seeded_table([0.70, 0.72, 0.71], [0.50, 0.55, 0.52],
                                     [0.20, 0.22, 0.21]), min_gain=0.05)  # fmt: skip
    assert clear["variant"] == "r8" and clear["runner_up"] == "base"
    assert clear["separated"] is True and clear["short_of_criterion"] == []
    assert clear["margin"] == pytest.approx(0.71 - 0.52333333)
    assert seed_warnings(clear, "macro_f1", "macro_f1") == []

    close = seed_noise(_seeded_table([0.70, 0.60, 0.66], [0.61, 0.64, 0.62],
                                     [0.10, 0.02, 0.06]), min_gain=0.05)  # fmt: skip
    assert close["separated"] is False and close["representative"] == "b2"
    assert close["short_of_criterion"] == [
        {"replicate": 1, "seed": 11, "run_id": "b1", "delta": 0.02}
    ]
    within, short = seed_warnings(close, "macro_f1", "macro_f1")
    assert "choice of r8 over base is within the noise between seeds" in within
    assert "r8 0.600-0.700, base 0.610-0.640" in within
    assert short.startswith("1 of 3 seeds of r8 fall short") and "seed 11 +0.020" in short
    assert seed_noise([{"name": "base", "selected": False}], 0.05) is None


SPEC = {
    "name": "t",
    "hypothesis": "h",
    "task": {"kind": "classification", "labels": ["a", "b"]},
    "data": {"file": "d.jsonl"},
    "train": {"seed": 7},
    "variants": [{"name": "r4", "set": {"adapter.r": 4}}],
}


def test_replicate_pilots_train_the_same_recipe_with_the_next_seeds(tmp_path):
    from conftest import write_pilot

    from lorapilot.decision.plan import replicate_pilots, variant_pilots

    seeded = write_pilot(tmp_path / "s", {**SPEC, "selection": {"seeds": 3}})
    plain = write_pilot(tmp_path / "p", SPEC)
    base, r4 = variant_pilots(seeded)
    reps = replicate_pilots(r4)
    assert [(p.variant, p.replicate, p.spec.train.seed, p.spec.adapter.r) for p in reps] == [
        ("r4", 0, 7, 4), ("r4", 1, 8, 4), ("r4", 2, 9, 4)
    ]  # fmt: skip
    assert reps[1].diff == r4.diff  # the seed is the replicate, not a change of the recipe
    # selection.seeds itself is not in the spec hash: adding seeds keeps every result
    assert base.spec.spec_hash() == load_pilot(plain).spec.spec_hash()
    assert reps[1].spec.spec_hash() != r4.spec.spec_hash()
    assert [p.replicate for p in replicate_pilots(variant_pilots(plain)[0])] == [0]
    with pytest.raises(UsageError, match="selection.seeds: 3"):
        load_pilot(seeded, variant="r4", replicate=3)
    with pytest.raises(UsageError, match="with --variant"):
        load_pilot(seeded, ["adapter.r=2"], replicate=1)
    assert replicate_of({"name": "r4", "replicate": 2}) == 2 and replicate_of(None) == 0
