"""Images as a training set (`train.examples.TrainingSet`): each image decoded, checked and
put through the recorded transform pipeline when its batch is collated, and the
cross-entropy of the classifier's logits as the loss (one term per image).

Augments (`task.image.augment`) are drawn only for the training set, from a generator seeded
by torch's RNG at each batch: the loop's seed fixes them and a checkpoint (which keeps the
RNG state) resumes them exactly.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lorapilot.data.images import load_record_image
from lorapilot.data.rows import Record
from lorapilot.modality.image_transforms import ImagePipeline
from lorapilot.spec import TrainSpec
from lorapilot.train.batches import Batch

_POOL: ThreadPoolExecutor | None = None


def decode_workers() -> int:
    """Threads that decode a batch: the cores this process may use, shared with the other
    ranks on the machine (torchrun's LOCAL_WORLD_SIZE), at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(8, (cores or 1) // ranks))


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(decode_workers(), thread_name_prefix="lorapilot-decode")
    return _POOL


class ImageExamples:
    unit = "images"

    def __init__(
        self,
        pilot_dir: Path,
        records: Sequence[Record],
        pipeline: ImagePipeline,
        labels: Sequence[str],
        max_pixels: int,
        *,
        augment: bool = False,
    ):
        self.pilot_dir, self.records, self.pipeline = Path(pilot_dir), list(records), pipeline
        self.labels, self.max_pixels = list(labels), max_pixels
        self.augment = augment and bool(pipeline.augment)
        index = {lab: i for i, lab in enumerate(self.labels)}
        # -1: an image to predict without a label (never in a training set)
        self.label_ids = [-1 if r.label is None else index[r.label] for r in self.records]
        self.categories = [r.category for r in self.records]
        self.lengths = [1] * len(self.records)  # every image is the same size after transforms
        self.targets = [1] * len(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def pixels(self, indices: Sequence[int]) -> torch.Tensor:
        """(n, channels, size, size) float32 model inputs, augmented on the training set.

        The batch's images are decoded and transformed on `decode_workers()` threads (Pillow
        and numpy release the GIL): one thread decoding a batch of phone photos starves a GPU.
        Each image's augments come from its own generator, seeded by one draw of torch's RNG
        per batch and the image's place in it, so the result does not depend on the threads.
        """
        seed = int(torch.randint(0, 2**62, ())) if self.augment else None

        def one(place: int, i: int) -> np.ndarray:
            rng = np.random.default_rng([seed, place]) if seed is not None else None
            img = load_record_image(self.pilot_dir, self.records[i], self.max_pixels)
            return self.pipeline(img, rng)

        if len(indices) <= 1 or decode_workers() <= 1:
            arrays = [one(p, i) for p, i in enumerate(indices)]
        else:
            arrays = list(_pool().map(one, range(len(indices)), indices))
        return torch.from_numpy(np.stack(arrays))

    def collate(self, indices: Sequence[int]) -> Batch:
        labels = torch.tensor([self.label_ids[i] for i in indices], dtype=torch.long)
        return {"pixel_values": self.pixels(indices), "labels": labels}

    def loss_sum(self, model, batch: Batch):
        logits = model(batch["pixel_values"])
        labels = batch["labels"]
        return F.cross_entropy(logits.float(), labels, reduction="sum"), labels.new_tensor(
            labels.numel()
        )

    def loss_fn(self, cfg: TrainSpec):
        return self.loss_sum, ("unshared", "images have no prompt prefix to share")

    @torch.no_grad()
    def reproduces(self, model, batch: Batch, min_p: float = 0.0) -> torch.Tensor:
        logits = model(batch["pixel_values"])
        hit = logits.argmax(-1) == batch["labels"]
        p = logits.float().softmax(-1).gather(-1, batch["labels"][:, None]).squeeze(-1)
        return hit & (p >= min_p)

    def data_hash(self) -> str:
        h = hashlib.sha256()
        h.update(repr(sorted(self.pipeline.to_dict().items())).encode())
        for r, y in zip(self.records, self.label_ids, strict=True):
            sha = r.image.sha256 if r.image is not None else r.text
            h.update(f"{r.id}|{sha}|{y}|{int(self.augment)}\n".encode())
        return h.hexdigest()
