"""Evaluating an image classifier (base + adapter + head) on a split, and the image
evaluation protocol.

The protocol is what changes predictions and can be shared by every run of a pilot: the
labels, the transform pipeline, the precision, the data version and the base. The classifier
itself (the baseline's linear probe, an adapter's trained head) is *what* is evaluated, not
how, so the baseline and every adapter carry the same protocol hash and are comparable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lorapilot.base.precision import resolve
from lorapilot.evaluate.metrics import classification_metrics
from lorapilot.evaluate.runner import EvalResult
from lorapilot.fsutil import sha256_json
from lorapilot.modality.image_examples import ImageExamples
from lorapilot.modality.image_transforms import ImagePipeline
from lorapilot.records.progress import Phase
from lorapilot.spec import PilotSpec
from lorapilot.train.meter import PeakMemory

EVAL_BATCH = 64


def image_protocol(spec: PilotSpec, pipe: ImagePipeline, data_version: str, base_sha: Any) -> dict:
    proto = {
        "task": spec.task.kind,
        "mode": "classify",
        "decoding": "argmax over the head's logits",
        "transforms": pipe.to_dict(),
        "precision": resolve(spec.eval.precision),
        "labels": list(spec.task.labels or []),
        "data_version": data_version,
        "base_sha256": base_sha,
    }
    proto["eval_protocol"] = "ep-" + sha256_json(proto)[:16]
    return proto


def logits_of(model: Any, data: ImageExamples, precision: str, tick=None) -> np.ndarray:
    """(n, labels) float64 logits of every image of `data`, in order, in batches."""
    import torch

    from lorapilot.base.precision import autocast

    device = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for start in range(0, len(data), EVAL_BATCH):
            idx = list(range(start, min(start + EVAL_BATCH, len(data))))
            x = data.pixels(idx).to(device)
            with autocast(device.type, precision):
                out.append(model(x).float().double().cpu().numpy())
            if tick:
                tick(len(idx))
    return np.concatenate(out) if out else np.zeros((0, len(data.labels)))


def scored(data: ImageExamples, logits: np.ndarray) -> tuple[list[dict], dict]:
    """(predictions.jsonl rows, classification metrics with `n`) from per-image logits."""
    preds, rows = prediction_rows(data, logits)
    # images to predict may come without a label: the metrics are over the labelled ones
    known = [i for i, r in enumerate(data.records) if r.label is not None]
    metrics = classification_metrics(
        [data.records[i].label for i in known], [preds[i] for i in known], data.labels
    )
    metrics["n"] = len(known)
    return rows, metrics


def prediction_rows(data: ImageExamples, logits: np.ndarray) -> tuple[list[str], list[dict]]:
    """(predicted labels, predictions.jsonl rows) from per-image logits."""
    labels = data.labels
    preds = [labels[i] for i in logits.argmax(axis=1)]
    rows = [
        {
            "id": r.id,
            "category": r.category,
            "image": r.text,
            "parsed": preds[i],
            "gold": r.label,
            "correct": None if r.label is None else preds[i] == r.label,
            "scores": {lab: round(float(s), 6) for lab, s in zip(labels, logits[i], strict=True)},
            "all_labels_scored": True,
        }
        for i, r in enumerate(data.records)
    ]
    return preds, rows


def evaluate_images(
    model: Any,
    data: ImageExamples,
    protocol: dict,
    *,
    progress: bool = True,
    label: str = "eval",
    log: Callable[[str], None] | None = None,
) -> EvalResult:
    """Predict every image (eval mode, no augments) and compute the classification metrics."""
    model.eval()
    t0 = time.perf_counter()
    meter = PeakMemory(next(model.parameters()).device)
    with meter, Phase(label, len(data), bar=progress, log=log if progress else None) as phase:
        logits = logits_of(model, data, protocol["precision"], lambda n: phase.advance(n=n))
    seconds = time.perf_counter() - t0
    rows, metrics = scored(data, logits)
    device = str(next(model.parameters()).device)
    return EvalResult(
        metrics, rows, seconds, len(data) / max(seconds, 1e-9), protocol, device,
        meter.total, meter.peak,
    )  # fmt: skip
