"""The decision rule, flips, comparability and the paired bootstrap per task."""

from __future__ import annotations

import pytest

from lorapilot.decision.rule import (
    bootstrap_for,
    bootstrap_metrics,
    comparable,
    decide,
    flips,
    one_change_check,
    protocol_differences,
)
from lorapilot.evaluate.metrics import paired_bootstrap
from lorapilot.spec import EvalNormalize, GuardSpec, SuccessSpec, TaskSpec, variant_label

SUCCESS = SuccessSpec(metric="macro_f1", min_gain=0.10)
GUARDS = [GuardSpec(metric="per_category.f1", max_drop=0.05)]


def metrics(macro: float, billing: float = 0.8, shipping: float = 0.8, support: int = 20) -> dict:
    return {
        "macro_f1": macro,
        "accuracy": macro,
        "per_category": {
            "billing": {"f1": billing, "support": support},
            "shipping": {"f1": shipping, "support": support},
        },
    }


def ci(low: float, high: float, delta: float | None = None) -> dict:
    delta = (low + high) / 2 if delta is None else delta
    return {"delta": delta, "ci_low": low, "ci_high": high, "n_boot": 1000, "ci": 0.95}


# --------------------------------------------------------------------------- decide


def test_go_needs_success_a_ci_above_zero_and_passing_guards():
    out = decide(SUCCESS, GUARDS, 5, metrics(0.12), metrics(0.43), bootstrap=ci(0.22, 0.40))
    assert out["decision"] == "GO"
    assert out["reasons"][0] == (
        "macro_f1 gained +0.310 (0.120 -> 0.430), needs +0.100; 95% CI of the gain [+0.220, +0.400]"
    )
    assert out["success"]["status"] == "pass"
    assert [g["status"] for g in out["guards"]] == ["pass", "pass"]
    assert out["bootstrap"]["ci_low"] == 0.22


def test_no_go_when_a_guard_fails_even_with_a_big_gain():
    cand = metrics(0.60, billing=0.70)  # billing f1 drops 0.10 > max_drop 0.05
    out = decide(SUCCESS, GUARDS, 5, metrics(0.12), cand, bootstrap=ci(0.30, 0.55))
    assert out["decision"] == "NO-GO"
    failed = [r for r in out["reasons"] if r.startswith("guard failed")]
    assert len(failed) == 1
    assert "per_category.billing.f1" in failed[0] and "0.8000 -> 0.7000" in failed[0]


def test_no_go_when_success_is_clearly_missed():
    out = decide(SUCCESS, GUARDS, 5, metrics(0.50), metrics(0.52), bootstrap=ci(-0.01, 0.06))
    assert out["decision"] == "NO-GO"
    assert "macro_f1 gained +0.020 (0.500 -> 0.520), needs +0.100" in out["reasons"][0]
    assert any("+0.060" in r and "below the required gain +0.100" in r for r in out["reasons"])


def test_inconclusive_when_the_gain_is_within_noise():
    out = decide(SUCCESS, GUARDS, 5, metrics(0.40), metrics(0.55), bootstrap=ci(-0.02, 0.31))
    assert out["decision"] == "INCONCLUSIVE"
    assert out["success"]["status"] == "pass"
    assert any("within noise" in r and "-0.020" in r for r in out["reasons"])


def test_inconclusive_when_a_miss_may_be_noise():
    out = decide(SUCCESS, GUARDS, 5, metrics(0.40), metrics(0.45), bootstrap=ci(-0.05, 0.15))
    assert out["decision"] == "INCONCLUSIVE"
    assert any("may be noise" in r and "+0.150" in r for r in out["reasons"])


def test_inconclusive_when_a_guarded_category_has_too_few_examples():
    out = decide(SUCCESS, GUARDS, 5, metrics(0.12, support=3), metrics(0.43, support=3),
                 bootstrap=ci(0.22, 0.40))  # fmt: skip
    assert out["decision"] == "INCONCLUSIVE"
    thin = [r for r in out["reasons"] if r.startswith("insufficient data")]
    assert len(thin) == 2 and "support 3 examples < min_support 5" in thin[0]
    assert out["reasons"][-1] == "guards: 0 pass, 2 with insufficient data (min_support 5)"


def test_a_failing_guard_beats_insufficient_data():
    base = metrics(0.12, support=20)
    cand = metrics(0.43, billing=0.5)
    cand["per_category"]["shipping"]["support"] = 2
    out = decide(SUCCESS, GUARDS, 5, base, cand, bootstrap=ci(0.22, 0.40))
    assert out["decision"] == "NO-GO"


def test_inconclusive_without_a_bootstrap_or_a_readable_metric():
    out = decide(SUCCESS, [], 5, metrics(0.12), metrics(0.43), bootstrap=None)
    assert out["decision"] == "INCONCLUSIVE"
    assert out["reasons"][0].endswith("no bootstrap CI")
    missing = decide(SuccessSpec(metric="field_f1", min_gain=0.1), [], 5, metrics(0.1),
                     metrics(0.2), bootstrap=ci(-0.5, -0.4))  # fmt: skip
    assert missing["decision"] == "INCONCLUSIVE"
    assert "cannot check" in missing["reasons"][0]


def test_go_without_guards_and_a_proxy_ci_is_named():
    boot = {**ci(0.05, 0.30), "stat": "exact_match", "metric": "field_f1", "proxy": True}
    success = SuccessSpec(metric="field_f1", min_gain=0.1)
    out = decide(success, [], 5, {"field_f1": 0.5}, {"field_f1": 0.7}, bootstrap=boot)
    assert out["decision"] == "GO"
    assert (
        "95% CI of the exact_match gain (a proxy for field_f1) [+0.050, +0.300]"
        in out["reasons"][0]
    )
    assert out["reasons"][-1].endswith("no guards set")


# --------------------------------------------------------------------------- flips, comparable


def rows(correct: dict) -> list[dict]:
    return [{"id": k, "correct": v, "gold": "a"} for k, v in correct.items()]


def test_flips_by_id():
    base = rows({"a": False, "b": True, "c": False, "d": True, "only_base": False})
    cand = rows({"d": False, "c": True, "b": True, "a": False, "only_cand": True})
    out = flips(base, cand)
    examples = out.pop("examples")
    assert out == {
        "fixed": ["c"],
        "broken": ["d"],
        "n_common": 4,
        "only_base": 1,
        "only_candidate": 1,
    }
    assert examples == {
        "fixed": [{"id": "c", "text": None, "gold": "a", "baseline": None, "adapted": None}],
        "broken": [{"id": "d", "text": None, "gold": "a", "baseline": None, "adapted": None}],
    }


def test_flip_examples_carry_the_text_and_both_predictions_first_five():
    base = [{"id": f"x{i}", "text": "word " * 100, "gold": "refund", "parsed": "shipping",
             "correct": False} for i in range(7)]  # fmt: skip
    cand = [dict(r, parsed="refund", correct=True) for r in base]
    ex = flips(base, cand)["examples"]
    assert len(ex["fixed"]) == 5 and ex["broken"] == []
    first = ex["fixed"][0]
    assert (first["id"], first["gold"], first["baseline"], first["adapted"]) == (
        "x0", "refund", "shipping", "refund"
    )  # fmt: skip
    assert len(first["text"]) == 300 and first["text"].endswith("...")


def test_flips_refuses_rows_without_ids_or_with_repeats():
    with pytest.raises(ValueError, match="no 'id'"):
        flips([{"correct": True}], [])
    with pytest.raises(ValueError, match="repeat"):
        flips(rows({"a": True}), rows({"a": True}) * 2)


def test_comparable():
    assert comparable("ep-1", "dv-1", "ep-1", "dv-1") == (True, None)
    ok, why = comparable("ep-1", "dv-1", "ep-2", "dv-1")
    assert not ok and "evaluation protocols differ (ep-1 vs ep-2)" == why
    ok, why = comparable("ep-1", "dv-1", "ep-2", "dv-9")
    assert not ok and "protocols differ" in why and "data versions differ (dv-1 vs dv-9)" in why
    ok, why = comparable("ep-1", None, "ep-1", "dv-1")
    assert not ok and "data version not recorded for one run" == why


def test_incomparable_protocols_name_the_keys_that_differ():
    a = {"mode": "score", "batch_size": 32, "precision": "bf16", "eval_protocol": "ep-1"}
    b = {
        "mode": "score",
        "batch_size": 8,
        "precision": "bf16",
        "shared_prefix_cache": True,
        "eval_protocol": "ep-2",
    }
    ok, why = comparable("ep-1", "dv-1", "ep-2", "dv-1", a, b)
    assert not ok
    assert (
        why
        == "evaluation protocols differ (ep-1 vs ep-2): batch_size (32 vs 8), shared_prefix_cache "
        "(missing vs true)"
    )
    many = {f"k{i}": i for i in range(9)}
    assert (
        protocol_differences(many, {})[-1] == "3 more" and len(protocol_differences(many, {})) == 7
    )
    assert protocol_differences({"labels": ["x" * 60]}, {}) == [
        'labels (["' + "x" * 35 + "... vs missing)"
    ]


def test_protocols_that_differ_only_in_the_train_seed_evaluate_the_same_way():
    a = {"mode": "score", "seed": 0, "eval_protocol": "ep-1"}
    assert comparable("ep-1", "dv-1", "ep-2", "dv-1", a, {**a, "seed": 3}) == (True, None)
    ok, why = comparable("ep-1", "dv-1", "ep-2", "dv-1", a, {**a, "seed": 3, "mode": "generate"})
    assert not ok and why.endswith("mode (score vs generate), seed (0 vs 3)")
    assert not comparable("ep-1", "dv-1", "ep-2", "dv-1")[0]  # without the protocols: no


def test_one_change_check_is_the_spec_rule():
    assert one_change_check is variant_label
    assert one_change_check({"train.lr": [1, 2]}) == "one_change"


# --------------------------------------------------------------------------- bootstrap_for

LABELS = ["billing", "shipping", "other"]


def cls_rows(gold: list[str], pred: list[str | None], ids: list[str] | None = None) -> list[dict]:
    ids = ids or [f"e{i}" for i in range(len(gold))]
    return [
        {"id": i, "gold": g, "parsed": p, "correct": p == g}
        for i, g, p in zip(ids, gold, pred, strict=True)
    ]


def test_bootstrap_macro_f1_pairs_rows_by_id():
    gold = ["billing", "shipping", "other"] * 10
    base = cls_rows(gold, ["billing"] * 30)
    cand = cls_rows(gold, gold[:-3] + ["other"] * 3)
    shuffled = list(reversed(cand))
    out = bootstrap_for("classification", "macro_f1", base, shuffled, LABELS, n_boot=200)
    again = bootstrap_for("classification", "macro_f1", base, cand, LABELS, n_boot=200)
    assert out == again  # pairing is by id, not by position
    assert out["stat"] == "macro_f1" and out["proxy"] is False and out["note"] is None
    assert out["n"] == 30 and out["delta"] > 0.5 and out["ci_low"] > 0


def test_bootstrap_accuracy_is_the_mean_of_correct():
    gold = ["billing", "shipping"] * 10
    base = cls_rows(gold, ["billing"] * 20)
    cand = cls_rows(gold, gold)
    acc = bootstrap_for("classification", "accuracy", base, cand, LABELS, n_boot=200)
    expected = paired_bootstrap(
        [r["correct"] for r in base], [r["correct"] for r in cand], n_boot=200
    )
    assert acc["stat"] == "accuracy" and acc["proxy"] is False
    assert {k: acc[k] for k in expected} == pytest.approx(expected)


def test_bootstrap_per_category_metric_is_resampled_as_itself():
    gold = ["billing", "shipping", "other"] * 10
    base = cls_rows(gold, ["billing"] * 30)
    cand = cls_rows(gold, ["billing", "shipping", "shipping"] * 10)
    out = bootstrap_for("classification", "per_category.shipping.f1", base, cand, LABELS)
    # base never predicts shipping (f1 0); cand: precision 10/20, recall 10/10 -> f1 2/3
    assert out["delta"] == pytest.approx(2 / 3) and out["proxy"] is False
    assert bootstrap_for("classification", "per_category.nope.f1", base, cand, LABELS) is None


def _ext_rows(golds: list[dict], outputs: list[str]) -> list[dict]:
    return [
        {"id": f"e{i}", "gold": g, "raw_output": o, "text": "", "category": "all"}
        for i, (g, o) in enumerate(zip(golds, outputs, strict=True))
    ]


def test_bootstrap_of_leaf_f1_is_not_the_exact_match_proxy():
    """Where the two disagree: the candidate gets more slots right but never the whole answer
    (exact match 0 -> 0, no gain), while leaf F1 rises from 0.25 to 0.75."""
    task = TaskSpec(
        kind="extraction",
        fields=[{"name": "intent"}, {"name": "slots", "type": "map", "values": "string"}],
    )
    golds = [{"intent": "book", "slots": {"city": "oslo", "day": "mon", "n": "2"}}] * 20
    base = _ext_rows(golds, ['{"intent": "x", "slots": {"city": "oslo"}}'] * 20)
    cand = _ext_rows(
        golds, ['{"intent": "x", "slots": {"city": "oslo", "day": "mon", "n": "2"}}'] * 20
    )
    leaf = bootstrap_for("extraction", "leaf_f1", base, cand, None, task=task, n_boot=200)
    exact = bootstrap_for("extraction", "exact_match", base, cand, None, task=task, n_boot=200)
    # base: 1 tp of 2 predicted leaves, 4 gold -> P 1/2, R 1/4, F1 1/3;
    # cand: 3 tp of 4 predicted, 4 gold -> F1 3/4
    assert leaf["delta"] == pytest.approx(3 / 4 - 1 / 3) and leaf["ci_low"] > 0.3
    assert exact["delta"] == 0 and exact["ci_high"] == 0
    assert leaf["stat"] == "leaf_f1" and leaf["proxy"] is False
    with pytest.raises(ValueError, match="need the task"):
        bootstrap_for("extraction", "leaf_f1", base, cand, None)


def test_bootstrap_none_without_common_examples_and_refuses_other_gold():
    assert bootstrap_for("classification", "accuracy", cls_rows(["a"], ["a"], ["x"]),
                         cls_rows(["a"], ["a"], ["y"]), LABELS) is None  # fmt: skip
    with pytest.raises(ValueError, match="different gold"):
        bootstrap_for("classification", "accuracy", cls_rows(["billing"], ["billing"]),
                      cls_rows(["shipping"], ["billing"]), LABELS)  # fmt: skip
    with pytest.raises(ValueError, match="labels"):
        bootstrap_for("classification", "macro_f1", cls_rows(["billing"], ["billing"]),
                      cls_rows(["billing"], ["billing"]), None)  # fmt: skip


# --------------------------------------------------------------------------- gates


def _go():
    return {"decision": "GO", "reasons": ["macro_f1 gains +0.500"]}


SMOKE = {"id": "smoke-1", "status": "completed", "ok": True, "error": None}


def test_no_go_without_verify_and_final_test():
    from lorapilot.decision.rule import gate

    ok_verify = {"id": "verify-1", "status": "completed", "ok": True}
    gain = {"metric": "macro_f1", "baseline": 0.2, "adapted": 0.7, "gain": 0.5,
            "bootstrap": {"ci_low": 0.3, "ci_high": 0.6, "ci": 0.95}}  # fmt: skip
    test = {"id": "eval-1", "metrics": {}, "gain": gain}
    assert gate(_go(), ok_verify, test, SMOKE)["decision"] == "GO"
    no_verify = gate(_go(), None, test, SMOKE)
    assert no_verify["decision"] == "INCONCLUSIVE"
    assert "lorapilot verify" in no_verify["reasons"][-1]
    assert no_verify["gates"] == {
        "smoke": "ok",
        "verify": "not run",
        "final_test": "done",
        "test_confirms": True,
    }
    no_test = gate(_go(), ok_verify, None, SMOKE)
    assert (
        no_test["decision"] == "INCONCLUSIVE" and "--split test --final" in no_test["reasons"][-1]
    )
    failed = {"id": "verify-2", "status": "failed", "ok": False, "problems": ["3 differ"]}
    bad = gate(_go(), failed, test)
    assert bad["decision"] == "NO-GO" and "verify failed (verify-2)" in bad["reasons"][-1]
    nogo = {"decision": "NO-GO", "reasons": ["guard failed"]}
    assert gate(nogo, None, None)["decision"] == "NO-GO"  # a NO-GO needs no gate to stand
    assert gate(_go(), None, None)["reasons"][0] == "macro_f1 gains +0.500"  # kept, not replaced


def test_go_needs_the_final_test_to_confirm_the_validation_gain():
    """The test gain's CI must lie above 0: a test gain within noise, or a final test with no
    base evaluated on it, is INCONCLUSIVE with the test numbers in the reasons."""
    from lorapilot.decision.rule import gate

    ok_verify = {"id": "verify-1", "status": "completed", "ok": True}
    noisy = {"metric": "macro_f1", "baseline": 0.50, "adapted": 0.52, "gain": 0.02,
             "bootstrap": {"ci_low": -0.04, "ci_high": 0.08, "ci": 0.95}}  # fmt: skip
    out = gate(_go(), ok_verify, {"id": "eval-1", "gain": noisy}, SMOKE)
    assert out["decision"] == "INCONCLUSIVE" and out["gates"]["test_confirms"] is False
    assert any("+0.020 over the base on test" in r and "includes 0" in r for r in out["reasons"])
    assert "does not confirm" in out["reasons"][-1]
    old = gate(_go(), ok_verify, {"id": "eval-1", "gain": None}, SMOKE)
    assert old["decision"] == "INCONCLUSIVE"
    assert any("no test gain" in r for r in old["reasons"])
    clear = {**noisy, "gain": 0.3, "adapted": 0.8,
             "bootstrap": {"ci_low": 0.1, "ci_high": 0.5, "ci": 0.95}}  # fmt: skip
    assert gate(_go(), ok_verify, {"id": "eval-1", "gain": clear}, SMOKE)["decision"] == "GO"


def test_report_decision_waits_for_verify_then_the_final_test(tmp_path):
    """A pilot whose train run clearly beats the baseline: INCONCLUSIVE naming verify until
    a verify run of the chosen adapter completes, then naming the test, then GO once a
    passing smoke of this spec is on the record (a failed one keeps it INCONCLUSIVE)."""
    import json
    import shutil

    from conftest import EXAMPLES

    from lorapilot.records import registry
    from lorapilot.report.collect import collect
    from lorapilot.spec import load_pilot

    pilot_dir = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot_dir,
                    ignore=shutil.ignore_patterns("runs", "report", "deliverable"))  # fmt: skip
    pilot = load_pilot(pilot_dir)
    labels = pilot.spec.task.labels
    gold = [labels[i % len(labels)] for i in range(60)]
    protocol = {"mode": "score", "eval_protocol": "ep-1"}

    def record(kind, predicted, parent=None, **extra):
        with registry.open_run(pilot_dir, kind, parent=parent, config={"name": "t"}) as run:
            rows = [
                {"id": f"e{i}", "gold": g, "parsed": p, "correct": g == p, "category": g}
                for i, (g, p) in enumerate(zip(gold, predicted, strict=True))
            ]
            (run.dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            per = {c: {"f1": 1.0 if kind != "baseline" else 0.0, "support": 10} for c in labels}
            f1 = 1.0 if kind != "baseline" else 0.0
            accuracy = sum(r["correct"] for r in rows) / len(rows)
            metrics = {"accuracy": accuracy, "macro_f1": f1, "per_category": per}
            run.update(split="val", metrics=metrics, eval_protocol="ep-1", protocol=protocol,
                       **extra)  # fmt: skip
            run.record.data_version = "dv"
        return run.id

    record("baseline", [labels[(i + 1) % len(labels)] for i in range(60)])
    train_id = record("train", gold, adapter_path=str(tmp_path / "adapter"))
    first = collect(pilot)["decision"]
    assert first["decision"] == "INCONCLUSIVE" and "lorapilot verify" in first["reasons"][-1]
    assert first["chosen_by"].startswith("the plan's variant")
    with registry.open_run(pilot_dir, "verify", parent=train_id, config={"name": "t"}) as run:
        run.update(ok=True, metrics_match=True, n_mismatched_predictions=0)
    second = collect(pilot)["decision"]
    assert second["decision"] == "INCONCLUSIVE" and "--split test --final" in second["reasons"][-1]
    record("eval", gold, parent=train_id)
    with registry.open_run(pilot_dir, "eval", parent=train_id, config={"name": "t"}) as run:
        rows = [{"id": f"e{i}", "gold": g, "parsed": g, "correct": True, "category": g}
                for i, g in enumerate(gold)]  # fmt: skip
        (run.dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        run.update(split="test", metrics={"macro_f1": 1.0}, n=60)
    third = collect(pilot)["decision"]  # the base was not evaluated on test: no test gain
    assert third["decision"] == "INCONCLUSIVE" and third["gates"]["test_confirms"] is False
    with registry.open_run(pilot_dir, "eval", parent=train_id, config={"name": "t"}) as run:
        (run.dir / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        wrong = [{**r, "parsed": labels[(i + 1) % len(labels)], "correct": False}
                 for i, r in enumerate(rows)]  # fmt: skip
        (run.dir / "baseline_predictions.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in wrong)
        )
        run.update(split="test", metrics={"macro_f1": 1.0}, n=60,
                   baseline_metrics={"macro_f1": 0.0})  # fmt: skip
    no_smoke = collect(pilot)["decision"]
    assert no_smoke["decision"] == "INCONCLUSIVE" and no_smoke["gates"]["smoke"] == "not run"
    assert any("no smoke test of this spec" in r for r in no_smoke["reasons"])

    def smoke(ok: bool) -> str:
        with registry.open_run(pilot_dir, "smoke", spec_hash=pilot.spec.spec_hash(),
                               config={"name": "t"}) as run:  # fmt: skip
            run.update(ok=ok)
            if not ok:
                run.fail_check("smoke: the pipeline could not overfit 8 examples in 30 steps")
        return run.id

    failed_id = smoke(False)
    after_failed = collect(pilot)["decision"]
    assert after_failed["decision"] == "INCONCLUSIVE" and after_failed["gates"]["smoke"] == "failed"
    assert any(failed_id in r and "could not overfit" in r for r in after_failed["reasons"])
    smoke(True)
    final = collect(pilot)
    assert final["decision"]["decision"] == "GO", final["decision"]["reasons"]
    assert final["test"]["gain"]["gain"] == 1.0 and final["test"]["gain"]["bootstrap"]["ci_low"] > 0


def test_a_guard_missed_within_noise_is_inconclusive_not_no_go():
    cand = metrics(0.60, billing=0.70)  # billing f1 drops 0.10 > max_drop 0.05 ...
    noise = {"per_category.billing.f1": {"ci_low": -0.3, "ci_high": 0.05}}  # ... or not at all
    out = decide(SUCCESS, GUARDS, 5, metrics(0.12), cand, bootstrap=ci(0.30, 0.55),
                 guard_intervals=noise)  # fmt: skip
    assert out["decision"] == "INCONCLUSIVE"
    (line,) = [r for r in out["reasons"] if r.startswith("guard missed within noise")]
    assert "drop 0.1000 > max_drop 0.05" in line and "[-0.3000, +0.0500]" in line
    assert out["reasons"][-1] == (
        "guards: 1 pass, 1 missed within noise, 0 with insufficient data (min_support 5)"
    )
    beyond = {"per_category.billing.f1": {"ci_low": -0.3, "ci_high": -0.06}}
    out = decide(SUCCESS, GUARDS, 5, metrics(0.12), cand, bootstrap=ci(0.30, 0.55),
                 guard_intervals=beyond)  # fmt: skip
    assert out["decision"] == "NO-GO"


def test_bootstrap_metrics_resamples_every_guard_metric_once_with_the_candidates_ci():
    gold = ["billing", "shipping", "other"] * 10
    base = cls_rows(gold, ["billing"] * 30)
    cand = cls_rows(gold, ["billing", "shipping", "shipping"] * 10)
    names = ["accuracy", "per_category.shipping.f1", "per_category.nope.f1"]
    many = bootstrap_metrics("classification", names, base, cand, LABELS)
    assert set(many) == {"accuracy", "per_category.shipping.f1"}  # what the rows do not give
    for name, summary in many.items():  # the same resamples as one metric at a time
        one = bootstrap_for("classification", name, base, cand, LABELS)
        assert (summary["ci_low"], summary["ci_high"]) == (one["ci_low"], one["ci_high"])
    acc = many["accuracy"]  # cand: billing 10 + shipping 10 right of 30
    assert acc["value"] == pytest.approx(2 / 3)
    assert acc["value_low"] < 2 / 3 < acc["value_high"] and acc["value_high"] <= 1


def test_format_answer_match_bootstraps_from_the_rows():
    task = TaskSpec(kind="format", regex=r"(?s).*\n#### (?P<answer>-?[0-9][0-9,]*(\.[0-9]+)?)")
    gold = "2+2 = 4\n#### 4"
    base = [{"id": str(i), "gold": gold, "raw_output": "I think 4"} for i in range(30)]
    cand = [{"id": str(i), "gold": gold, "raw_output": "2+2 = 4\n#### 4"} for i in range(30)]
    cand[0]["raw_output"] = "2+2 = 5\n#### 5"
    norm = EvalNormalize()
    b = bootstrap_for("format", "answer_match", base, cand, None, task=task, norm=norm, n_boot=200)
    assert b["delta"] == pytest.approx(29 / 30) and b["ci_low"] > 0.8
