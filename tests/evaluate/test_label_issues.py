"""Suspect training labels by confident learning on probe features: flipped labels found,
right ones left alone, the per-label thresholds, the folds and the edge cases."""

from __future__ import annotations

import numpy as np
import pytest

from lorapilot.evaluate.label_issues import (
    confident_suspects,
    label_issues,
    stratified_folds,
)

LABELS = ["billing", "refund", "shipping"]


def _clusters(n_per: int = 40, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """Three well-separated clusters in 8 dimensions, one per label."""
    rng = np.random.default_rng(seed)
    centres = np.eye(3, 8) * 6.0
    x = np.concatenate([c + rng.normal(size=(n_per, 8)) for c in centres])
    return x, [lab for lab in LABELS for _ in range(n_per)]


def test_flipped_labels_are_the_suspects_and_right_ones_are_left_alone():
    x, gold = _clusters()
    flipped = {3: "refund", 45: "shipping", 90: "billing", 100: "billing"}
    for i, lab in flipped.items():
        gold[i] = lab
    examples = [{"id": f"t{i}", "source": f"train.jsonl:{i + 1}", "text": f"x{i}"}
                for i in range(len(gold))]  # fmt: skip
    summary, suspects = label_issues(x, LABELS, gold, examples)
    assert {s["id"] for s in suspects} == {f"t{i}" for i in flipped}
    by_id = {s["id"]: s for s in suspects}
    assert by_id["t3"]["label"] == "refund" and by_id["t3"]["suggested"] == "billing"
    assert by_id["t45"]["suggested"] == "refund" and by_id["t90"]["suggested"] == "shipping"
    assert all(s["p_suggested"] > s["p_label"] for s in suspects)
    assert [s["p_label"] for s in suspects] == sorted(s["p_label"] for s in suspects)
    assert summary["n_suspects"] == 4 and summary["rate"] == round(4 / 120, 4)
    assert summary["per_label"]["billing"] == {"examples": 41, "suspects": 2}  # 40 - 1 + 2
    assert {"label": "billing", "suggested": "shipping", "count": 2} in summary["pairs"]
    assert summary["folds"] == 5 and "confident learning" in summary["method"]
    assert 0.9 < summary["out_of_fold_accuracy"] <= 116 / 120  # the flips never agree
    assert "note" not in summary and summary["seconds"] >= 0
    # deterministic: the same folds and fits give the same suspects
    assert label_issues(x, LABELS, gold, examples)[1] == suspects


def test_the_thresholds_are_per_label_so_an_unsure_label_is_not_flagged_everywhere():
    # label b is one the probe is unsure of (p 0.4 where right); a at 0.9
    probs = np.array([[0.9, 0.1], [0.85, 0.15], [0.6, 0.4], [0.55, 0.45], [0.5, 0.5]])
    y = np.array([0, 0, 1, 1, 1])
    confident, thresholds = confident_suspects(probs, y)
    assert thresholds.tolist() == pytest.approx([0.875, 0.45])
    # a global 0.5 cut would call rows 2-4 "a"; per label, rows 3 and 4 are confidently b
    assert confident.tolist() == [0, -1, -1, 1, 1]


def test_folds_are_stratified_and_seeded():
    y = np.array([0] * 10 + [1] * 5)
    fold = stratified_folds(y, 5, seed=0)
    assert sorted(np.bincount(fold[y == 0], minlength=5).tolist()) == [2, 2, 2, 2, 2]
    assert sorted(np.bincount(fold[y == 1], minlength=5).tolist()) == [1, 1, 1, 1, 1]
    assert (stratified_folds(y, 5, seed=0) == fold).all()
    assert not (stratified_folds(y, 5, seed=1) == fold).all()


def test_a_labels_only_example_is_never_flagged_and_tiny_sets_are_skipped():
    x, gold = _clusters(n_per=10)
    gold[0] = "refund"  # a flip, found
    x = np.concatenate([x, x[25:26]])  # one example of a fourth label, in refund's cluster
    gold.append("other")
    examples = [{"id": str(i)} for i in range(len(gold))]
    summary, suspects = label_issues(x, [*LABELS, "other"], gold, examples)
    assert [s["id"] for s in suspects] == ["0"]
    assert "other" not in {s["label"] for s in suspects}
    # overlapping clusters: a weak probe, and the record says what that means
    noise = np.random.default_rng(1).normal(size=(60, 4))
    ids = [{"id": i} for i in range(60)]
    noisy, _ = label_issues(noise, LABELS, [LABELS[i % 3] for i in range(60)], ids)
    assert noisy["out_of_fold_accuracy"] < 0.8 and "most suspects may be" in noisy["note"]
    few, none = label_issues(x[:6], LABELS, gold[:6], examples[:6])
    assert none == [] and "too few" in few["skipped"]
