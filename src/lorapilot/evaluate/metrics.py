"""Evaluation metrics (pure, no I/O): classification (one label or several), metric
lookup, paired bootstrap.

Extraction and format metrics are in `structured`, value parsing in `values`.

Every function takes outputs already produced and returns plain dicts of floats and lists,
so a run record stores them as JSON as they are and a guard finds any of them by a dotted
name (`get_metric`). Rates over zero examples are 0.0, never NaN: NaN is not JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

INVALID = "invalid"


def _div(a: float, b: float) -> float:
    return a / b if b else 0.0


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


# --------------------------------------------------------------------------- classification


def classification_metrics(
    gold: Sequence[str], pred: Sequence[str | None], labels: list[str]
) -> dict:
    """Accuracy, macro-F1, invalid rate, per-category scores and the confusion matrix.

    A prediction that is None or not one of `labels` is `invalid`: wrong for every label,
    never a true positive. A label never predicted has precision 0 (sklearn's
    zero_division=0). macro_f1 averages F1 over the labels that occur in gold or in the
    predictions: a label absent from both says nothing about the model, and counting it as
    0 would punish a small validation split for a category it happens not to hold.

    `confusion.matrix[i][j]` counts gold `labels[i]` predicted as `labels[j]`; when any
    prediction is invalid the labels gain a last `invalid` column (and an all-zero row, so
    the matrix stays square).
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted({g for g in gold if g not in index})
    if unknown:
        raise ValueError(f"gold labels not in the task's labels: {unknown[:5]}")
    k = len(labels)
    matrix = [[0] * (k + 1) for _ in range(k + 1)]
    for g, p in zip(gold, pred, strict=True):
        matrix[index[g]][index.get(p, k) if isinstance(p, str) else k] += 1

    # the matrix's sums are the counts classification_totals turns into the metrics
    totals: dict = {
        "n": len(gold),
        "correct": sum(matrix[i][i] for i in range(k)),
        "invalid": sum(row[k] for row in matrix),
    }
    for i, label in enumerate(labels):
        totals[("tp", label)] = matrix[i][i]
        totals[("gold", label)] = sum(matrix[i])
        totals[("pred", label)] = sum(row[i] for row in matrix)
    if totals["invalid"]:
        confusion = {"labels": [*labels, INVALID], "matrix": matrix}
    else:
        confusion = {"labels": list(labels), "matrix": [row[:k] for row in matrix[:k]]}
    return {**classification_totals(totals, labels), "confusion": confusion}


def classification_counts(gold: str, pred: str | None, labels: list[str]) -> dict:
    """One example's counts; `classification_totals` of their sum gives the scalar and
    per-category metrics of classification_metrics (what a bootstrap resamples)."""
    valid = isinstance(pred, str) and pred in labels
    c: dict = {"n": 1, "correct": pred == gold, "invalid": not valid}
    c[("gold", gold)] = 1
    if valid:
        c[("pred", pred)] = 1
        if pred == gold:
            c[("tp", gold)] = 1
    return c


def classification_totals(totals: dict, labels: list[str]) -> dict:
    """classification_metrics' numbers (no confusion matrix) from summed counts."""
    n = totals.get("n", 0)
    per_category: dict[str, dict] = {}
    f1s = []
    for label in labels:
        tp, support, predicted = (totals.get((k, label), 0) for k in ("tp", "gold", "pred"))
        precision, recall = _div(tp, predicted), _div(tp, support)
        f1 = _f1(precision, recall)
        per_category[label] = {
            "precision": precision,
            "recall": recall,
            "f1": f1,
            "support": support,
            "predicted": predicted,
        }
        if support or predicted:
            f1s.append(f1)
    return {
        "n": n,
        "accuracy": _div(totals.get("correct", 0), n),
        "macro_f1": _div(sum(f1s), len(f1s)),
        "invalid_rate": _div(totals.get("invalid", 0), n),
        "per_category": per_category,
    }


# --------------------------------------------------------------------------- multi-label


def parse_label_set(output: str, labels: list[str]) -> tuple[list[str] | None, list[str]]:
    """(the labels a generated answer names, in task.labels order, or None when it names
    none; the comma-separated parts that are not labels). Parts compare stripped and
    casefolded, as a single label's answer does; a label named twice counts once."""
    lookup = {lab.casefold(): lab for lab in labels}
    found: set[str] = set()
    unknown: list[str] = []
    for part in output.split(","):
        part = part.strip()
        if not part:
            continue
        label = lookup.get(part.casefold())
        if label is None:
            unknown.append(part)
        else:
            found.add(label)
    named = [lab for lab in labels if lab in found]
    return named or None, unknown


def label_set_invalid(named: Sequence[str] | None, unknown: Sequence[str] | None) -> bool:
    """A multi-label answer that named no label, or a part that is not one."""
    return named is None or bool(unknown)


def multi_label_counts(
    gold: Sequence[str], pred: Sequence[str] | None, labels: list[str], invalid: bool = False
) -> dict:
    """One example's counts, summed into `multi_label_totals`: every label is a yes/no
    decision (tp, gold, predicted per label); `correct` when the sets are equal; `invalid`
    when the answer named no label or something that is not one (its labels still count)."""
    g, p = set(gold), set(pred or ())
    c: dict = {"n": 1, "correct": g == p, "invalid": bool(invalid or pred is None)}
    for label in labels:
        if label in g:
            c[("gold", label)] = 1
        if label in p:
            c[("pred", label)] = 1
            if label in g:
                c[("tp", label)] = 1
    return c


def multi_label_totals(totals: dict, labels: list[str]) -> dict:
    """Exact-set accuracy, macro-F1 over the labels (as classification_totals: labels
    absent from gold and predictions left out), micro-F1 over every (example, label)
    decision, invalid rate and per-label scores, from summed `multi_label_counts`."""
    out = classification_totals(totals, labels)
    tp, gold, pred = (
        sum(totals.get((k, lab), 0) for lab in labels) for k in ("tp", "gold", "pred")
    )
    n = totals.get("n", 0)
    out["micro_f1"] = _f1(_div(tp, pred), _div(tp, gold))
    out["labels_per_example"] = _div(gold, n)
    out["predicted_per_example"] = _div(pred, n)
    return out


def multi_label_metrics(
    gold: Sequence[Sequence[str]],
    pred: Sequence[Sequence[str] | None],
    labels: list[str],
    invalid: Sequence[bool] | None = None,
) -> dict:
    """multi_label_totals over examples: `gold` and `pred` label lists per example."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold label sets but {len(pred)} predictions")
    unknown = sorted({g for gs in gold for g in gs} - set(labels))
    if unknown:
        raise ValueError(f"gold labels not in the task's labels: {unknown[:5]}")
    flags = invalid if invalid is not None else [False] * len(gold)
    totals: dict = {}
    for g, p, bad in zip(gold, pred, flags, strict=True):
        for k, v in multi_label_counts(g, p, labels, bad).items():
            totals[k] = totals.get(k, 0) + v
    return multi_label_totals(totals, labels)


# --------------------------------------------------------------------------- calibration

CONTENT_FREE = ("N/A", "", "[MASK]")
"""The content-free inputs of contextual calibration (Zhao et al. 2021): what the model
answers when the input says nothing is its bias among the labels."""


def calibration_offsets(content_free_scores: np.ndarray) -> np.ndarray:
    """Per-label offsets that divide out the model's preference without an input: each
    content-free input's label scores (log-probabilities, [n_inputs, n_labels]) normalised over
    the labels, the probabilities averaged, and -log of the average. The calibrated
    prediction is argmax(score + offset), the label whose probability gained most over its
    content-free one."""
    s = np.asarray(content_free_scores, dtype=np.float64)
    if s.ndim != 2 or not s.size or not np.isfinite(s).all():
        raise ValueError("content-free scores must be a finite [n_inputs, n_labels] array")
    return -np.log(softmax_rows(s).mean(axis=0))


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Each row of [n, k] scores (logits, log-probabilities) normalised to probabilities."""
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- lookup


def _lookup(node: Any, rest: str) -> Any:
    if not isinstance(node, dict):
        raise KeyError(rest)
    if rest in node:
        return node[rest]
    parts = rest.split(".")
    for i in range(len(parts) - 1, 0, -1):  # longest key first: a label may hold a dot
        head = ".".join(parts[:i])
        if head in node:
            try:
                return _lookup(node[head], ".".join(parts[i:]))
            except KeyError:
                continue
    raise KeyError(rest)


def get_metric(metrics: dict, name: str) -> Any:
    """A metric by dotted name, e.g. `macro_f1` or `per_category.billing.f1`.

    Keys may themselves hold dots (a label `v1.2`); the longest matching key is tried first.
    Raises KeyError naming the metric when it is not there.
    """
    try:
        return _lookup(metrics, name)
    except KeyError:
        raise KeyError(f"no metric {name!r}") from None


def metric_value(metrics: dict | None, name: str) -> float | None:
    """get_metric as a number, None when the metric is absent or not a number."""
    if not metrics:
        return None
    try:
        v = get_metric(metrics, name)
    except KeyError:
        return None
    return float(v) if isinstance(v, (int, float)) else None


# --------------------------------------------------------------------------- paired bootstrap

# Index cells drawn per chunk: bounds memory (~32 MB) whatever n_boot x n is.
_CHUNK_CELLS = 1 << 22


def _resamples(n: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """Resampled example indices, (rows, n) per chunk; the same for the same (n, n_boot, seed)."""
    if n <= 0:
        raise ValueError("a bootstrap needs at least one example")
    if n_boot <= 0:
        raise ValueError("n_boot must be positive")
    rng = np.random.default_rng(seed)
    rows = max(1, _CHUNK_CELLS // n)
    for start in range(0, n_boot, rows):
        yield rng.integers(0, n, size=(min(rows, n_boot - start), n))


def _weights(idx: np.ndarray, n: int) -> np.ndarray:
    """How often each example is drawn in each resample, (rows, n): sums become matmuls."""
    rows = idx.shape[0]
    flat = (idx + np.arange(rows)[:, None] * n).ravel()
    return np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def _summary(delta: float, boots: np.ndarray, ci: float) -> dict:
    tail = (1 - ci) / 2
    low, high = np.quantile(boots, [tail, 1 - tail])
    return {
        "delta": float(delta),
        "ci_low": float(low),
        "ci_high": float(high),
        "p_le_zero": float(np.mean(boots <= 0)),
        "n_boot": int(boots.size),
        "ci": ci,
    }


def paired_bootstrap(
    base_correct: Sequence[float],
    cand_correct: Sequence[float],
    n_boot: int = 2000,
    seed: int = 0,
    stat: Literal["mean"] = "mean",
    ci: float = 0.95,
) -> dict:
    """Candidate minus baseline of a per-example score (e.g. correct 0/1), with a paired CI.

    Both models are scored on the same resampled examples, so the variance of which examples
    happen to be hard cancels out. -> {delta, ci_low, ci_high, p_le_zero (share of resamples
    with no gain), n_boot, ci}; deterministic for a seed.
    """
    if stat != "mean":
        raise ValueError(f"unknown stat {stat!r}; supported: 'mean'")
    base = np.asarray(base_correct, dtype=np.float64)
    cand = np.asarray(cand_correct, dtype=np.float64)
    if base.shape != cand.shape or base.ndim != 1:
        raise ValueError(
            f"paired scores must be two lists of one length, got {base.shape} and {cand.shape}"
        )
    diff = cand - base
    n = diff.size
    boots = np.concatenate([diff[idx].mean(axis=1) for idx in _resamples(n, n_boot, seed)])
    return _summary(diff.mean() if n else 0.0, boots, ci)


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise: a list of lists must not become 2-D
        out[i] = v
    return out


def paired_bootstrap_metric(
    fn: Callable[[list, list], float],
    base_preds: Sequence[Any],
    cand_preds: Sequence[Any],
    golds: Sequence[Any],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict:
    """paired_bootstrap for a corpus-level metric: fn(golds, preds) on each resample.

    For metrics that are not a mean over examples, e.g.
    `lambda g, p: classification_metrics(g, p, labels)["macro_f1"]`. Same resamples as
    paired_bootstrap_macro_f1 for the same seed.
    """
    n = len(golds)
    if not len(base_preds) == len(cand_preds) == n:
        raise ValueError("golds, base_preds and cand_preds must have one length")
    g_arr, b_arr, c_arr = _object_array(golds), _object_array(base_preds), _object_array(cand_preds)
    boots = []
    for idx in _resamples(n, n_boot, seed):
        for row in idx:
            g = g_arr[row].tolist()
            boots.append(fn(g, c_arr[row].tolist()) - fn(g, b_arr[row].tolist()))
    delta = fn(list(golds), list(cand_preds)) - fn(list(golds), list(base_preds))
    return _summary(delta, np.asarray(boots, dtype=np.float64), ci)


def _macro_f1_counts(tp: np.ndarray, support: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """macro_f1 as classification_metrics defines it, over the last axis of count arrays."""
    zeros = np.zeros(tp.shape)
    precision = np.divide(tp, predicted, out=zeros.copy(), where=predicted > 0)
    recall = np.divide(tp, support, out=zeros.copy(), where=support > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=zeros.copy(), where=denom > 0)
    present = (support > 0) | (predicted > 0)
    n_present = present.sum(-1)
    total = (f1 * present).sum(-1)
    return np.divide(total, n_present, out=np.zeros(total.shape), where=n_present > 0)


def paired_bootstrap_macro_f1(
    golds: Sequence[str],
    base_preds: Sequence[str | None],
    cand_preds: Sequence[str | None],
    labels: list[str],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict:
    """paired_bootstrap_metric for classification macro-F1, vectorised (counts by matmul).

    Gives the same numbers as the generic version with classification_metrics, much faster.
    """
    n = len(golds)
    if not len(base_preds) == len(cand_preds) == n:
        raise ValueError("golds, base_preds and cand_preds must have one length")
    index = {label: i for i, label in enumerate(labels)}
    k = len(labels)
    eye = np.eye(k + 1)[:, :k]  # code k (invalid) is a row of zeros: no label's prediction
    unknown = sorted({x for x in golds if x not in index})
    if unknown:
        raise ValueError(f"gold labels not in the task's labels: {unknown[:5]}")
    g = np.array([index[x] for x in golds], dtype=np.int64)
    gold_hot = eye[g]

    def counts(preds: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
        codes = [index.get(x, k) if isinstance(x, str) else k for x in preds]
        pred_hot = eye[np.array(codes, dtype=np.int64)]
        return pred_hot, gold_hot * pred_hot

    base_hot, base_hit = counts(base_preds)
    cand_hot, cand_hit = counts(cand_preds)
    full = np.ones((1, n))
    boots = []
    for w in [full] + [_weights(idx, n) for idx in _resamples(n, n_boot, seed)]:
        support = w @ gold_hot
        diff = _macro_f1_counts(w @ cand_hit, support, w @ cand_hot) - _macro_f1_counts(
            w @ base_hit, support, w @ base_hot
        )
        boots.append(diff)
    delta = float(boots[0][0])
    return _summary(delta, np.concatenate(boots[1:]), ci)


def paired_bootstrap_counts(
    base_counts: Sequence[dict],
    cand_counts: Sequence[dict],
    value: Callable[[dict], float],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict:
    """paired_bootstrap for any metric computed from per-example counts that add up:
    `value(summed counts)` on each resample (counts weighted by how often an example is
    drawn, a matmul), so micro F1, rates and per-group scores are resampled as themselves.
    Same resamples as paired_bootstrap for the same (n, n_boot, seed)."""
    many = paired_bootstrap_counts_many(
        base_counts, cand_counts, lambda t: {"v": value(t)}, ["v"], n_boot, seed, ci
    )
    return many["v"]


def paired_bootstrap_counts_many(
    base_counts: Sequence[dict],
    cand_counts: Sequence[dict],
    values: Callable[[dict], dict[str, float]],
    names: Sequence[str],
    n_boot: int = 1000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict[str, dict]:
    """paired_bootstrap_counts for several metrics on the same resamples, each computed once
    per resample (`values(summed counts)` -> {name: value}): a guard over 77 categories costs
    one pass, not 77. -> {name: the summary, plus `value`, `value_low`, `value_high`: the
    candidate's own value and CI, what an absolute rule (`min`, `max`) is judged on}."""
    n = len(base_counts)
    if len(cand_counts) != n:
        raise ValueError("base_counts and cand_counts must have one length")
    keys = sorted({k for c in [*base_counts, *cand_counts] for k in c}, key=repr)

    def matrix(counts: Sequence[dict]) -> np.ndarray:
        return np.array([[float(c.get(k, 0)) for k in keys] for c in counts], dtype=np.float64)

    b_mat, c_mat = matrix(base_counts), matrix(cand_counts)

    def vals(row: np.ndarray) -> list[float]:
        got = values(dict(zip(keys, row.tolist(), strict=True)))
        return [float(got[name]) for name in names]

    base_full, cand_full = vals(b_mat.sum(axis=0)), vals(c_mat.sum(axis=0))
    deltas, cands = [], []
    for idx in _resamples(n, n_boot, seed):
        w = _weights(idx, n)
        for b_row, c_row in zip(w @ b_mat, w @ c_mat, strict=True):
            b, c = vals(b_row), vals(c_row)
            deltas.append([x - y for x, y in zip(c, b, strict=True)])
            cands.append(c)
    d_arr, c_arr = np.asarray(deltas, dtype=np.float64), np.asarray(cands, dtype=np.float64)
    tail = (1 - ci) / 2
    out = {}
    for j, name in enumerate(names):
        summary = _summary(cand_full[j] - base_full[j], d_arr[:, j], ci)
        low, high = np.quantile(c_arr[:, j], [tail, 1 - tail])
        out[name] = {
            **summary,
            "value": cand_full[j],
            "value_low": float(low),
            "value_high": float(high),
        }
    return out


def per_group(metrics: Any) -> tuple[str, dict]:
    """("per_field", its dict) for extraction metrics, else ("per_category", its dict)."""
    if not isinstance(metrics, dict):
        return "per_category", {}
    if isinstance(metrics.get("per_field"), dict):
        return "per_field", metrics["per_field"]
    per = metrics.get("per_category")
    return "per_category", per if isinstance(per, dict) else {}


def most_confused(matrix: list[list[int]], labels: list[str], top: int = 15) -> list[dict]:
    """The off-diagonal cells of a confusion matrix (rows gold, columns predicted), largest
    first: what a 77 x 77 heatmap hides. `share` is the cell over its gold label's support."""
    cells = []
    for i, row in enumerate(matrix):
        support = sum(row)
        for j, n in enumerate(row):
            if i != j and n > 0:
                cells.append(
                    {
                        "gold": labels[i],
                        "predicted": labels[j],
                        "count": n,
                        "share": n / support if support else 0.0,
                    }
                )
    cells.sort(key=lambda c: (-c["count"], c["gold"], c["predicted"]))
    return cells[:top]
