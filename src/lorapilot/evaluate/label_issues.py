"""Training examples whose label the data itself contradicts: confident learning on the
frozen base's features, a by-product of every linear probe the baseline fits.

A few wrong labels in a training split cost a pilot more than a few points: the adapter
learns them, and the validation score (labelled by the same hands) hides it. Before renting a
GPU, the examples worth a second look can be found with what the baseline already computed.
The procedure is confident learning (Northcutt, Jiang and Chuang, JAIR 2021): out-of-fold
probabilities from the same logistic regression (`linear_probe.py`, K stratified folds, each
example scored by a probe that never saw it); per label j a threshold t_j, the mean
probability of j over the examples labelled j (how confident the probe is about that label
where the data says it); an example labelled i is *suspect* when some other label j reaches
its own threshold (p_j >= t_j) and is, among the labels that do, the likeliest, and more
likely than i. The per-label thresholds keep a label the probe is generally unsure of from
being flagged everywhere. Suspects are ranked by the probability left on their own label
(lowest first).

They are candidates to review, not errors: a weak feature space disagrees with right labels
too (the probe's own validation score says how weak). Nothing is dropped or changed; the
baseline run lists them (`label_issues`, `label_issues.jsonl`) and the report shows the
commonest disagreements. Pure: arrays in, dicts out.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from lorapilot.evaluate.linear_probe import fit_linear_probe
from lorapilot.evaluate.metrics import softmax_rows

FOLDS = 5
SEED = 0
L2 = 1e-2
"""Ten times the baseline probe's penalty: a probe free to carve a region around a few
mislabelled examples makes their right-labelled neighbours look mislabelled (tested)."""
SHOWN = 20  # suspects in the record (all of them go to label_issues.jsonl)
WEAK = 0.8
"""Out-of-fold accuracy under which the record says most suspects may be labelled right: on
400 clothing photos (accuracy 0.76) the six suspects looked at were all labelled right; on
BANKING77 (0.86) the features' label read better for some (docs/data.md)."""
METHOD = (
    "confident learning (Northcutt et al. 2021) on out-of-fold probabilities of the linear "
    "probe ({folds} stratified folds, seed {seed}, L2 {l2:g}): an example is suspect when "
    "another label reaches its own per-label threshold (the mean probability of that label "
    "over the examples labelled with it) and is likelier than the example's own label"
)


def stratified_folds(y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """(n,) fold index of each example: every label's examples dealt round-robin over the
    folds in a seeded order, so each fold holds about 1/folds of every label."""
    rng = np.random.default_rng(seed)
    fold = np.zeros(len(y), dtype=np.int64)
    offset = 0
    for label in np.unique(y):
        idx = np.flatnonzero(y == label)
        idx = idx[rng.permutation(len(idx))]
        fold[idx] = (np.arange(len(idx)) + offset) % folds
        offset += len(idx)  # the next label starts where this one ended: folds stay even
    return fold


def out_of_fold_probabilities(
    features: np.ndarray, y: np.ndarray, n_classes: int, folds: int = FOLDS, seed: int = SEED
) -> np.ndarray:
    """(n, n_classes) probabilities, each row from a probe fitted on the other folds."""
    fold = stratified_folds(y, folds, seed)
    probs = np.zeros((len(y), n_classes), dtype=np.float64)
    for k in range(folds):
        held = fold == k
        if not held.any():
            continue
        probe = fit_linear_probe(features[~held], y[~held], n_classes, L2)
        probs[held] = softmax_rows(probe.logits(features[held]))
    return probs


def confident_suspects(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-> ((n,) the label each example is confidently of, -1 where none reaches its
    threshold; (classes,) the per-label thresholds). A label no example carries has an
    infinite threshold (no example is confidently of it)."""
    n_classes = probs.shape[1]
    thresholds = np.full(n_classes, np.inf)
    for j in range(n_classes):
        mine = y == j
        if mine.any():
            thresholds[j] = probs[mine, j].mean()
    above = probs >= thresholds[None, :]
    masked = np.where(above, probs, -1.0)
    confident = masked.argmax(axis=1)
    confident[~above.any(axis=1)] = -1
    return confident, thresholds


def label_issues(
    features: np.ndarray,
    labels: Sequence[str],
    gold: Sequence[str],
    examples: Sequence[dict[str, Any]],
    folds: int = FOLDS,
    seed: int = SEED,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Suspect labels of a training split: `features` (n, d), `gold` its labels (each in
    `labels`), `examples` one dict per row (id, source, text) carried into each suspect ->
    (the summary for the run record, every suspect ranked for label_issues.jsonl)."""
    index = {lab: i for i, lab in enumerate(labels)}
    y = np.array([index[g] for g in gold], dtype=np.int64)
    counts = np.bincount(y, minlength=len(labels))
    summary: dict[str, Any] = {
        "method": METHOD.format(folds=folds, seed=seed, l2=L2),
        "folds": folds,
        "seed": seed,
        "n": len(y),
    }
    if len(y) < 2 * folds or (counts > 0).sum() < 2:
        return {**summary, "skipped": "too few training examples or labels to hold folds out"}, []
    t0 = time.perf_counter()
    probs = out_of_fold_probabilities(features, y, len(labels), folds, seed)
    confident, thresholds = confident_suspects(probs, y)
    rows = np.arange(len(y))
    own = probs[rows, y]
    flagged = [
        i
        for i in range(len(y))
        if confident[i] >= 0
        and confident[i] != y[i]
        and probs[i, confident[i]] > own[i]
        and counts[y[i]] > 1  # a label's only example: held out, its probe never saw the label
    ]
    flagged.sort(key=lambda i: (own[i], i))
    suspects = [
        {
            **examples[i],
            "label": labels[y[i]],
            "suggested": labels[confident[i]],
            "p_label": round(float(own[i]), 4),
            "p_suggested": round(float(probs[i, confident[i]]), 4),
        }
        for i in flagged
    ]
    pairs = Counter((s["label"], s["suggested"]) for s in suspects)
    flagged_per = Counter(s["label"] for s in suspects)
    per_label = {
        lab: {"examples": int(counts[j]), "suspects": flagged_per[lab]}
        for j, lab in enumerate(labels)
        if counts[j]
    }
    agree = float((probs.argmax(axis=1) == y).mean())
    summary.update(
        n_suspects=len(suspects),
        rate=round(len(suspects) / len(y), 4),
        out_of_fold_accuracy=round(agree, 4),
        thresholds={
            lab: round(float(t), 4)
            for lab, t in zip(labels, thresholds, strict=True)
            if np.isfinite(t)
        },  # fmt: skip
        per_label=per_label,
        pairs=[
            {"label": a, "suggested": b, "count": n}
            for (a, b), n in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        ][:SHOWN],
        suspects=suspects[:SHOWN],
        seconds=round(time.perf_counter() - t0, 2),  # the folds' fits: what the review cost
    )
    if agree < WEAK:
        summary["note"] = (
            f"the probe is right about only {agree:.0%} of the training examples out of fold: "
            "a probe this weak disagrees with many right labels, so most suspects may be "
            "labelled right"
        )
    return summary, suspects


SUSPECT_ROWS = "_label_issue_rows"  # the extras key the evaluation session writes to a file
TEXT_SHOWN = 300  # characters of an example's input kept with a suspect


def suspect_labels(features: np.ndarray, labels: Sequence[str], train: Sequence[Any]) -> dict:
    """The extras a baseline probe adds: {label_issues: summary, SUSPECT_ROWS: every
    suspect} for the training records (`Record`s, in `features`' order)."""
    shown = [{"id": r.id, "source": r.source, "text": r.text[:TEXT_SHOWN]} for r in train]
    summary, rows = label_issues(features, labels, [r.label for r in train], shown)
    return {"label_issues": summary, SUSPECT_ROWS: rows}
