"""The experiment plan's pure parts: step shapes, the selection rule, variant names."""

from __future__ import annotations

from lorapilot.decision.plan import select, step_shape, variant_name
from lorapilot.spec import spec_from_dict

BASE = {
    "name": "t",
    "hypothesis": "h",
    "task": {"kind": "classification", "labels": ["a", "b"]},
    "data": {"file": "d.jsonl"},
}


def _shape(**sections) -> str:
    raw = {**BASE, **sections}
    return step_shape(spec_from_dict(raw).model_dump(mode="json"))


def test_step_shape_ignores_what_does_not_size_a_step():
    base = _shape()
    # learning rate, duration, seed, alpha, dropout, limits: same step, one probe
    assert _shape(train={"lr": 1e-3, "epochs": 5, "seed": 3}) == base
    assert _shape(adapter={"alpha": 8, "dropout": 0.1}, limits={"memory_gb": 4}) == base
    assert _shape(variants=[{"name": "r8", "set": {"adapter.r": 8}}]) == base
    # rank, targets, micro-batch, checkpointing, precision, quantization: another probe
    for other in (
        {"adapter": {"r": 8}},
        {"adapter": {"target_modules": ["q_proj"]}},
        {"train": {"micro_batch": 4}},
        {"train": {"grad_checkpointing": True}},
        {"train": {"precision": "fp32"}},
        {"model": {"quantization": {"bits": 4}}},
    ):
        assert _shape(**other) != base, other


def _row(id_, name, value, wall, status="completed", comparable=True):
    return {"id": id_, "kind": "train", "name": name, "status": status, "wall_s": wall,
            "comparable": comparable, "metrics": {"macro_f1": value}, "reason": None}  # fmt: skip


def _value(metrics, metric):
    return (metrics or {}).get(metric)


def test_select_picks_the_best_plan_variant_ties_to_the_cheaper_run():
    plan = ["base", "r8", "lr"]
    rows = [
        _row("t1", "base", 0.70, 100),
        _row("t2", "r8", 0.80, 90),
        _row("t3", "lr", 0.80, 50),  # ties with r8 on the metric, cheaper
        _row("t4", None, 0.99, 10),  # ad hoc (train --set): never chosen
        _row("t5", "bogus", 0.99, 10),  # not in the plan
    ]
    winner, table = select(rows, plan, "macro_f1", _value)
    assert winner["id"] == "t3"
    assert [(v["name"], v["run_id"], v["selected"]) for v in table] == [
        ("base", "t1", False), ("r8", "t2", False), ("lr", "t3", True),
    ]  # fmt: skip
    assert all(v["tries"] == 1 for v in table)


def test_select_uses_each_variants_latest_completed_run_and_keeps_failures():
    plan = ["base", "r8"]
    rows = [
        _row("t1", "base", 0.90, 100),
        _row("t2", "base", 0.60, 100),  # the base retrained later: its latest run counts
        _row("t3", "r8", None, 5, status="failed"),
        _row("t4", "r8", 0.95, 100, comparable=False),  # another protocol: not eligible
    ]
    rows[2]["reason"] = "RuntimeError: out of memory"
    winner, table = select(rows, plan, "macro_f1", _value)
    assert winner["id"] == "t2"
    assert table[0]["tries"] == 2 and table[0]["run_id"] == "t2"
    assert table[1]["status"] == "completed" and table[1]["run_id"] == "t4"  # latest attempt
    assert select([rows[2]], plan, "macro_f1", _value)[1][1]["reason"].startswith("Runtime")
    assert select([], plan, "macro_f1", _value) == (
        None,
        [{"name": n, "run_id": None, "status": "not run", "value": None, "seconds": None,
          "selected": False, "tries": 0, "reason": None} for n in plan],
    )  # fmt: skip


def test_variant_name_of_records_old_and_new():
    assert variant_name({"name": "r8", "diff": {"adapter.r": [16, 8]}}) == "r8"
    assert variant_name({"name": None, "diff": {"adapter.r": [16, 8]}}) is None
    assert variant_name({"label": "base", "diff": {}}) == "base"  # before plans existed
    assert variant_name(None) == "base"
    assert variant_name({"label": "one_change", "diff": {"train.lr": [1, 2]}}) is None


def _interrupted_train(pilot_dir, pilot, variant):
    """A train run record as a killed process leaves it (status interrupted)."""
    from lorapilot.records import registry

    run_id, run_dir = registry.new_run_dir(pilot_dir, "train")
    rec = registry.RunRecord(
        id=run_id, kind="train", status="interrupted", started_at=registry.now_iso(), pid=1,
        host="h", pilot=str(pilot_dir), spec_hash=pilot.spec.spec_hash(),
        config=pilot.spec.model_dump(mode="json"),
        variant=variant,
    )  # fmt: skip
    registry.write_record(run_dir, rec)
    return run_id


def test_a_run_id_alone_gives_back_its_variant_and_a_changed_spec_is_refused_by_key(tmp_path):
    import pytest
    import yaml

    from lorapilot.decision.plan import pilot_of_run
    from lorapilot.errors import UsageError
    from lorapilot.spec import load_pilot
    from lorapilot.steps.train import run_train

    raw = {**BASE, "variants": [{"name": "r8", "set": {"adapter.r": 8}}]}
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(raw))
    r8 = load_pilot(tmp_path, variant="r8")
    rid = _interrupted_train(tmp_path, r8, {"name": "r8", "label": "one_change",
                                           "diff": r8.diff})  # fmt: skip
    again = pilot_of_run(tmp_path, rid)
    assert again.variant == "r8" and again.spec.spec_hash() == r8.spec.spec_hash()
    ad_hoc = load_pilot(tmp_path, ["train.lr=0.001"])
    rid2 = _interrupted_train(tmp_path, ad_hoc, {"name": None, "label": "one_change",
                                                 "diff": ad_hoc.diff})  # fmt: skip
    assert pilot_of_run(tmp_path, rid2).spec.spec_hash() == ad_hoc.spec.spec_hash()
    # a seed replicate (selection.seeds) comes back as that replicate, base's too
    raw["selection"] = {"seeds": 2}
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(raw))
    for name in ("r8", "base"):
        rep = load_pilot(tmp_path, variant=name, replicate=1)
        rid3 = _interrupted_train(tmp_path, rep, {"name": name, "replicate": 1,
                                                  "diff": rep.diff})  # fmt: skip
        back = pilot_of_run(tmp_path, rid3)
        assert (back.variant, back.replicate, back.spec.train.seed) == (name, 1, 1)
        assert back.spec.spec_hash() == rep.spec.spec_hash()
    # resuming with other values than the run started with: refused, naming the keys
    with pytest.raises(UsageError, match=r"differs from the one the run started with \(adapter\.r"):
        run_train(load_pilot(tmp_path, ["adapter.r=4"]), resume=rid)
