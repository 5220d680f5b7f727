"""Evaluation metrics (pure, no I/O): classification, extraction/format, paired bootstrap.

Every function takes outputs already produced and returns plain dicts of floats and lists,
so a run record stores them as JSON as they are and a guard finds any of them by a dotted
name (`get_metric`). Rates over zero examples are 0.0, never NaN: NaN is not JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from lorapilot.data.targets import category_of, is_text_target, target_validator
from lorapilot.spec import EvalNormalize, TaskSpec

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

    n = len(gold)
    correct = sum(matrix[i][i] for i in range(k))
    n_invalid = sum(row[k] for row in matrix)
    per_category: dict[str, dict] = {}
    f1s = []
    for i, label in enumerate(labels):
        tp = matrix[i][i]
        support = sum(matrix[i])
        predicted = sum(row[i] for row in matrix)
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
    if n_invalid:
        confusion = {"labels": [*labels, INVALID], "matrix": matrix}
    else:
        confusion = {"labels": list(labels), "matrix": [row[:k] for row in matrix[:k]]}
    return {
        "n": n,
        "accuracy": _div(correct, n),
        "macro_f1": _div(sum(f1s), len(f1s)),
        "invalid_rate": _div(n_invalid, n),
        "per_category": per_category,
        "confusion": confusion,
    }


# --------------------------------------------------------------------------- parsing, values


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# strict JSON: Python's default decoder accepts NaN/Infinity, which no other parser would
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_first_json(text: str) -> tuple[Any | None, str | None]:
    """The first JSON object in a model's output -> (object, None) or (None, error).

    Models wrap answers in prose and code fences; decoding at each `{` in turn finds the
    object wherever it starts, and the decoder itself handles nested braces and braces
    inside strings. A `{` that starts no valid object (prose, a broken object) is skipped.
    """
    if not text or not text.strip():
        return None, "empty output"
    start = text.find("{")
    if start < 0:
        return None, "no JSON object in the output"
    first_error = None
    while start >= 0:
        try:
            obj, _ = _DECODER.raw_decode(text, start)
            return obj, None
        except (ValueError, RecursionError) as e:
            if first_error is None:
                message = (
                    e.msg if isinstance(e, json.JSONDecodeError) else str(e) or "too deeply nested"
                )
                first_error = f"invalid JSON at character {start}: {message}"
        start = text.find("{", start + 1)
    return None, first_error


def normalize_value(v: Any, norm: EvalNormalize) -> Any:
    """A value in the form compared for equality, as the spec's eval.normalize asks.

    Strings: strip and collapse whitespace (norm.whitespace), casefold (norm.case); lists:
    items normalised, then sorted (norm.list_order); objects: values normalised. A float
    with an integer value becomes an int, so 1.0 equals 1; numeric strings stay strings
    ("1" is not 1), and booleans stay booleans (True is not 1).
    """
    if isinstance(v, str):
        if norm.whitespace:
            v = " ".join(v.split())
        return v.casefold() if norm.case else v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, list | tuple):
        items = [normalize_value(x, norm) for x in v]
        if norm.list_order:
            items.sort(key=_canonical)
        return items
    if isinstance(v, dict):
        return {k: normalize_value(x, norm) for k, x in v.items()}
    return v


def _canonical(v: Any) -> str:
    # JSON text tells True from 1 (Python's == does not) and orders mixed-type lists.
    return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)


def values_equal(a: Any, b: Any, norm: EvalNormalize) -> bool:
    """Equality after normalize_value on both sides (None equals only None)."""
    return _canonical(normalize_value(a, norm)) == _canonical(normalize_value(b, norm))


# --------------------------------------------------------------------------- extraction, format


def _field_names(task: TaskSpec, gold: Sequence[dict]) -> tuple[list[str], set[str]]:
    """(field names in order, required names): task.fields, else the json_schema's properties."""
    if task.fields:
        return [f.name for f in task.fields], {f.name for f in task.fields if f.required}
    schema = task.json_schema or {}
    required = set(schema.get("required") or [])
    props = schema.get("properties")
    if isinstance(props, dict) and props:
        return list(props), required
    return sorted({k for g in gold for k in g}), required


def _content_scores(
    golds: Sequence[dict], preds: Sequence[dict | None], names: list[str], norm: EvalNormalize
) -> tuple[dict, list[bool]]:
    """Field-level scores of parsed outputs against gold objects -> (metrics, exact per example)."""
    n = len(golds)
    exact = [p is not None for p in preds]  # no object parsed is never an exact match
    per_field: dict[str, dict] = {}
    tp_all = pred_all = gold_all = 0
    for name in names:
        n_correct = tp = n_pred = n_gold = 0
        for i, (g, p) in enumerate(zip(golds, preds, strict=True)):
            gv = g.get(name)
            pv = p.get(name) if p is not None else None
            same = values_equal(gv, pv, norm)
            n_correct += same
            exact[i] = exact[i] and same
            n_pred += pv is not None
            n_gold += gv is not None
            tp += same and gv is not None
        precision, recall = _div(tp, n_pred), _div(tp, n_gold)
        per_field[name] = {
            "accuracy": _div(n_correct, n),
            "precision": precision,
            "recall": recall,
            "f1": _f1(precision, recall),
            "support": n_gold,
            "predicted": n_pred,
        }
        tp_all, pred_all, gold_all = tp_all + tp, pred_all + n_pred, gold_all + n_gold
    precision, recall = _div(tp_all, pred_all), _div(tp_all, gold_all)
    metrics = {
        "exact_match": _div(sum(exact), n),
        "field_accuracy": _div(sum(f["accuracy"] for f in per_field.values()), len(per_field)),
        "field_precision": precision,
        "field_recall": recall,
        "field_f1": _f1(precision, recall),
        "per_field": per_field,
    }
    return metrics, exact


def extraction_metrics(
    gold: Sequence[dict], raw_outputs: Sequence[str], task: TaskSpec, norm: EvalNormalize
) -> dict:
    """Validity rates and field-level content scores of generated JSON objects.

    A field absent from the output counts as null; null gold and null prediction agree.
    field_precision/recall/f1 are micro over all fields: a non-null predicted value is a
    prediction, a non-null gold value a positive, a true positive a non-null prediction equal
    to the gold value. exact_match needs a parsed object with every field correct. Scores per
    category (`category_of`: which optional fields the gold fills) show rare target shapes.
    """
    if len(gold) != len(raw_outputs):
        raise ValueError(f"{len(gold)} targets but {len(raw_outputs)} outputs")
    for i, g in enumerate(gold):
        if not isinstance(g, dict):
            raise ValueError(f"target {i} is not a JSON object")
    names, required = _field_names(task, gold)
    check = target_validator(task)
    parsed: list[dict | None] = []
    errors: list[str | None] = []
    schema_ok: list[bool] = []
    required_ok: list[bool] = []
    for text in raw_outputs:
        obj, error = parse_first_json(text)
        if not isinstance(obj, dict):
            obj = None
        parsed.append(obj)
        errors.append(error)
        schema_ok.append(obj is not None and not check(obj))
        required_ok.append(obj is not None and all(obj.get(r) is not None for r in required))

    n = len(gold)
    content, exact = _content_scores(gold, parsed, names, norm)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(gold):
        groups.setdefault(category_of(None, g, task), []).append(i)
    per_category = {}
    for cat, idx in sorted(groups.items()):
        sub, _ = _content_scores([gold[i] for i in idx], [parsed[i] for i in idx], names, norm)
        per_category[cat] = {
            "support": len(idx),
            "json_valid_rate": _div(sum(parsed[i] is not None for i in idx), len(idx)),
            **{k: sub[k] for k in ("exact_match", "field_accuracy", "field_f1")},
        }
    return {
        "n": n,
        "json_valid_rate": _div(sum(p is not None for p in parsed), n),
        "schema_valid_rate": _div(sum(schema_ok), n),
        "required_fields_rate": _div(sum(required_ok), n),
        **content,
        "per_category": per_category,
        "parsed": parsed,
        "parse_errors": errors,
        "correct": exact,
    }


def format_metrics(
    outputs: Sequence[str],
    task: TaskSpec,
    targets: Sequence[Any] | None = None,
    norm: EvalNormalize | None = None,
) -> dict:
    """How often outputs follow the required format, plus content scores when targets exist.

    A regex-only task: the stripped output must fullmatch task.regex; with string targets,
    exact_match compares normalised strings. Otherwise the first JSON object in the output
    must satisfy the target schema (task.json_schema, else task.fields), and with object
    targets the extraction_metrics keys are added. `correct` per example is the exact match
    when targets are given, else format validity: what a paired bootstrap should compare.
    """
    norm = norm or EvalNormalize()
    n = len(outputs)
    if targets is not None and len(targets) != n:
        raise ValueError(f"{len(targets)} targets but {n} outputs")
    if is_text_target(task):
        pattern = re.compile(task.regex or "")
        valid = [bool(pattern.fullmatch(o.strip())) for o in outputs]
        out: dict[str, Any] = {"n": n, "format_valid_rate": _div(sum(valid), n), "valid": valid}
        if targets is None:
            return {**out, "correct": valid}
        correct = [values_equal(o.strip(), t, norm) for o, t in zip(outputs, targets, strict=True)]
        return {**out, "exact_match": _div(sum(correct), n), "correct": correct}

    check = target_validator(task)
    parsed = [parse_first_json(o)[0] for o in outputs]
    valid = [isinstance(p, dict) and not check(p) for p in parsed]
    out = {
        "n": n,
        "json_valid_rate": _div(sum(isinstance(p, dict) for p in parsed), n),
        "format_valid_rate": _div(sum(valid), n),
        "valid": valid,
        "parsed": parsed,
    }
    if targets is None:
        return {**out, "correct": valid}
    content = extraction_metrics(list(targets), outputs, task, norm)
    return {**content, **out, "correct": content["correct"]}


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
