"""The image baseline in a run record: the frozen base's features with a linear probe fitted
on the training split (the comparison an adapter must beat), and, for reference, the same
features through a random head (what "before training" means for a new head).

Writes, like the text baseline: `predictions.jsonl` (one row per validation image: gold,
prediction, the probe's per-label scores), `metrics.json` (the classification metrics and
their confusion matrix) and `protocol.json` (the transform pipeline, the feature extractor,
the probe's settings and its hash).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lorapilot.data.images import load_record_image
from lorapilot.data.rows import Record
from lorapilot.errors import UsageError
from lorapilot.evaluate.linear_probe import L2, MAX_ITER, fit_linear_probe
from lorapilot.evaluate.metrics import classification_metrics
from lorapilot.evaluate.records import write_predictions
from lorapilot.fsutil import atomic_write_json, sha256_json
from lorapilot.modality.image_transforms import ImagePipeline
from lorapilot.progress import Phase
from lorapilot.spec import Pilot

FEATURE_BATCH = 64
RANDOM_HEAD_SEED = 0


def load_image_base(pilot: Pilot) -> tuple[Any, Any]:
    """(resolved, frozen model in eval mode) of an image pilot's base."""
    from lorapilot.image_models import load_image_default
    from lorapilot.models import IMAGE_DEFAULT, resolve_base

    m = pilot.spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    if resolved.id != IMAGE_DEFAULT:
        raise UsageError(
            f"{pilot.spec_path}: model.base {m.base!r}: only the default image base "
            f"({IMAGE_DEFAULT}) is supported so far"
        )
    model = load_image_default(resolved.path)
    for p in model.parameters():
        p.requires_grad_(False)
    return resolved, model


def image_batch(pilot: Pilot, pipe: ImagePipeline, records: list[Record]) -> np.ndarray:
    """The model inputs of `records`, (n, channels, size, size) float32."""
    assert pilot.spec.task.image is not None
    limit = pilot.spec.task.image.max_pixels
    return np.stack([pipe(load_record_image(pilot.dir, r, limit)) for r in records])


def features(
    model: Any,
    pilot: Pilot,
    pipe: ImagePipeline,
    records: list[Record],
    tick: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Pooled features (n, d) of the frozen backbone, in batches."""
    import torch

    out = []
    with torch.inference_mode():
        for i in range(0, len(records), FEATURE_BATCH):
            chunk = records[i : i + FEATURE_BATCH]
            x = torch.from_numpy(image_batch(pilot, pipe, chunk))
            f = model.extract_features(x).mean(dim=(2, 3))
            out.append(f.double().numpy())
            if tick:
                tick(len(chunk))
    return np.concatenate(out)


def evaluate_image_baseline(
    pilot: Pilot,
    run: Any,
    prepared: Any,
    pipe: ImagePipeline,
    *,
    limit: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Fit the probe on train, predict val, write the files into `run`; -> the result."""
    import torch

    spec = pilot.spec
    labels = list(spec.task.labels or [])
    index = {lab: i for i, lab in enumerate(labels)}
    train = prepared.splits["train"]
    val = prepared.splits["val"][:limit] if limit else prepared.splits["val"]
    if not train or not val:
        raise UsageError("the image baseline needs images in the train and val splits")
    resolved, model = load_image_base(pilot)
    t0 = time.perf_counter()
    with Phase("baseline: features", len(train) + len(val), bar=progress, log=log) as bar:
        f_train = features(model, pilot, pipe, train, lambda n: bar.advance(n=n))
        f_val = features(model, pilot, pipe, val, lambda n: bar.advance(n=n))
    probe = fit_linear_probe(f_train, np.array([index[r.label] for r in train]), len(labels))
    logits = probe.logits(f_val)
    preds = [labels[i] for i in logits.argmax(axis=1)]
    gold = [r.label for r in val]
    metrics = classification_metrics(gold, preds, labels)
    metrics["n"] = len(val)
    torch.manual_seed(RANDOM_HEAD_SEED)
    head = torch.nn.Linear(f_val.shape[1], len(labels)).double()
    with torch.no_grad():
        random_preds = [labels[i] for i in head(torch.from_numpy(f_val)).argmax(1).tolist()]
    random_head = classification_metrics(gold, random_preds, labels)
    seconds = time.perf_counter() - t0
    protocol: dict[str, Any] = {
        "kind": "linear_probe",
        "transforms": pipe.to_dict(),
        "features": "mean-pooled final feature map (frozen base, eval mode)",
        "probe": {"l2": L2, "optimizer": "lbfgs", "max_iter": MAX_ITER, "standardised": True},
        "fitted_on": {"split": "train", "n": len(train)},
        "data_version": prepared.version,
        "base_sha256": resolved.weights_sha256,
    }
    if limit is not None:
        protocol["limit"] = limit
    protocol["eval_protocol"] = sha256_json(protocol)[:16]
    rows = [
        {
            "id": r.id,
            "category": r.category,
            "image": r.text,
            "parsed": preds[i],
            "gold": r.label,
            "correct": preds[i] == r.label,
            "scores": {lab: round(float(s), 6) for lab, s in zip(labels, logits[i], strict=True)},
            "all_labels_scored": True,
        }
        for i, r in enumerate(val)
    ]
    write_predictions(run.dir / "predictions.jsonl", rows)
    atomic_write_json(run.dir / "metrics.json", metrics)
    atomic_write_json(run.dir / "protocol.json", protocol)
    return {
        "split": "val",
        "n": len(val),
        "metrics": metrics,
        "random_head_metrics": {
            k: random_head[k] for k in ("accuracy", "macro_f1", "invalid_rate") if k in random_head
        },
        "probe": {"iterations": probe.iterations, "train_loss": round(probe.train_loss, 6)},
        "eval_protocol": protocol["eval_protocol"],
        "protocol": protocol,
        "data_version": prepared.version,
        "base": resolved.record(),
        "adapter": None,
        "seconds": round(seconds, 3),
        "examples_per_s": round((len(train) + len(val)) / max(seconds, 1e-9), 3),
        "device": "cpu",
        "predictions": str(run.dir / "predictions.jsonl"),
    }
