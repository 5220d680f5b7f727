"""The image baseline in a run record: the frozen base's features with a linear probe fitted
on the training split (the comparison an adapter must beat), and, for reference, the same
features through a random head (what "before training" means for a new head).

Writes, like the text baseline: `predictions.jsonl` (one row per validation image: gold,
prediction, the probe's per-label scores), `metrics.json` (the classification metrics and
their confusion matrix) and `protocol.json` (the image evaluation protocol every run of the
pilot shares; the probe's settings are in the run record under `probe`). The final test of
an adapter refits the same probe to score the base on the test rows (`probe_predictions`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.data.rows import Record
from lorapilot.errors import UsageError
from lorapilot.evaluate.feature_cache import cache_path, cached, keep
from lorapilot.evaluate.image_predict import scored
from lorapilot.evaluate.label_issues import suspect_labels
from lorapilot.evaluate.linear_probe import L2, MAX_ITER, fit_linear_probe
from lorapilot.evaluate.metrics import classification_metrics
from lorapilot.evaluate.runner import EvalResult
from lorapilot.modality.image_examples import ImageExamples
from lorapilot.modality.image_transforms import ImagePipeline
from lorapilot.records.progress import Phase
from lorapilot.spec import Pilot

FEATURE_BATCH = 64
RANDOM_HEAD_SEED = 0


def features(
    model: Any, data: ImageExamples, tick: Callable[[int], None] | None = None
) -> np.ndarray:
    """What the classifier's head sees (n, d) for every image of `data`, in batches: the
    frozen base's pooled features, the input a linear probe fits."""
    import torch

    from lorapilot.modality.image_model import head_features

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.head_module()
    # an attached adapter switched off: the frozen base's features, its own head untouched
    off = model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()
    out = []
    with torch.inference_mode(), off:
        for i in range(0, len(data), FEATURE_BATCH):
            idx = list(range(i, min(i + FEATURE_BATCH, len(data))))
            out.append(head_features(model, head, data.pixels(idx)).double().numpy())
            if tick:
                tick(len(idx))
    return np.concatenate(out)


def _feature_cache(pilot: Pilot, model: Any, train: ImageExamples, protocol: dict, limit) -> Path:
    """Where the training split's features are kept between the baseline and the final
    test (both fit the probe on them; extracting them is most of an image baseline's time):
    named by everything they depend on, the evaluation protocol (base weights, transforms,
    data version, labels), the pixel limit, the images' ids and the dtype and device they
    were computed in."""
    first = next(model.parameters())
    return cache_path(
        pilot.dir,
        {
            "eval_protocol": protocol.get("eval_protocol"),
            "max_pixels": limit,
            "ids": [r.id for r in train.records],
            "dtype": str(first.dtype),
            "device": first.device.type,
        },
    )


def probe_predictions(
    model: Any,
    pilot: Pilot,
    prepared: Any,
    pipe: ImagePipeline,
    split_records: list[Record],
    protocol: dict,
    *,
    progress: bool = True,
    label: str = "baseline",
    log: Callable[[str], None] | None = None,
    issues: bool = False,
) -> tuple[EvalResult, dict]:
    """The linear probe (fitted on the training split's features of the frozen base: `model`,
    any adapter switched off) on `split_records` -> (its evaluation, {probe,
    random_head_metrics}); `issues`: also the training images whose label the features
    contradict (`label_issues.py`)."""
    import torch

    spec = pilot.spec
    labels = list(spec.task.labels or [])
    limit = spec.task.image.max_pixels if spec.task.image else 0
    train = ImageExamples(pilot.dir, prepared.splits["train"], pipe, labels, limit)
    data = ImageExamples(pilot.dir, split_records, pipe, labels, limit)
    if not len(train) or not len(data):
        raise UsageError("the image baseline needs images in the train split and the one evaluated")
    model.eval()
    t0 = time.perf_counter()
    cache = _feature_cache(pilot, model, train, protocol, limit)
    f_train = cached(cache, len(train))
    reused = f_train is not None
    todo = len(data) + (0 if f_train is not None else len(train))
    with Phase(f"{label}: features", todo, bar=progress, log=log) as bar:
        if f_train is None:
            f_train = features(model, train, lambda n: bar.advance(n=n))
            keep(cache, f_train)
        f_eval = features(model, data, lambda n: bar.advance(n=n))
    probe = fit_linear_probe(f_train, np.array(train.label_ids), len(labels))
    rows, metrics = scored(data, probe.logits(f_eval))
    gold = [r.label for r in data.records]
    torch.manual_seed(RANDOM_HEAD_SEED)
    head = torch.nn.Linear(f_eval.shape[1], len(labels)).double()
    with torch.no_grad():
        random_preds = [labels[i] for i in head(torch.from_numpy(f_eval)).argmax(1).tolist()]
    random_head = classification_metrics(gold, random_preds, labels)
    seconds = time.perf_counter() - t0
    extras = {
        "probe": {
            "l2": L2,
            "optimizer": "lbfgs",
            "max_iter": MAX_ITER,
            "standardised": True,
            "features": "the head's input (pooled features of the frozen base, eval mode)",
            "iterations": probe.iterations,
            "train_loss": round(probe.train_loss, 6),
            "fitted_on": {"split": "train", "n": len(train)},
            "train_features": str(cache.relative_to(pilot.dir)),
            "train_features_reused": reused,
        },
        "random_head_metrics": {
            k: random_head[k] for k in ("accuracy", "macro_f1", "invalid_rate") if k in random_head
        },
    }
    if issues:
        extras.update(suspect_labels(f_train, labels, train.records))
    n_all = len(train) + len(data)
    result = EvalResult(metrics, rows, seconds, n_all / max(seconds, 1e-9), protocol, "cpu")
    return result, extras
