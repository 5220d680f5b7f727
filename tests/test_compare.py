"""The decision rule, flips, comparability and the paired bootstrap per task."""

from __future__ import annotations

import pytest

from lorapilot.compare import (
    bootstrap_for,
    comparable,
    decide,
    flips,
    one_change_check,
    protocol_differences,
)
from lorapilot.evaluate.metrics import paired_bootstrap
from lorapilot.spec import GuardSpec, SuccessSpec, variant_label

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
    assert len(thin) == 2 and "support 3 < min_support 5" in thin[0]
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
    assert out == {
        "fixed": ["c"],
        "broken": ["d"],
        "n_common": 4,
        "only_base": 1,
        "only_candidate": 1,
    }


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


def test_bootstrap_accuracy_and_proxies():
    gold = ["billing", "shipping"] * 10
    base = cls_rows(gold, ["billing"] * 20)
    cand = cls_rows(gold, gold)
    acc = bootstrap_for("classification", "accuracy", base, cand, LABELS, n_boot=200)
    expected = paired_bootstrap(
        [r["correct"] for r in base], [r["correct"] for r in cand], n_boot=200
    )
    assert acc["stat"] == "accuracy" and acc["proxy"] is False
    assert {k: acc[k] for k in expected} == expected
    ext = bootstrap_for("extraction", "field_f1", base, cand, None, n_boot=200)
    assert ext["stat"] == "exact_match" and ext["proxy"] is True
    assert "proxy for field_f1" in ext["note"]
    assert ext["delta"] == pytest.approx(0.5)


def test_bootstrap_none_without_common_examples_and_refuses_other_gold():
    assert bootstrap_for("extraction", "field_f1", cls_rows(["a"], ["a"], ["x"]),
                         cls_rows(["a"], ["a"], ["y"]), None) is None  # fmt: skip
    with pytest.raises(ValueError, match="different gold"):
        bootstrap_for("classification", "accuracy", cls_rows(["billing"], ["billing"]),
                      cls_rows(["shipping"], ["billing"]), LABELS)  # fmt: skip
    with pytest.raises(ValueError, match="labels"):
        bootstrap_for("classification", "macro_f1", cls_rows(["billing"], ["billing"]),
                      cls_rows(["billing"], ["billing"]), None)  # fmt: skip
