"""Batches for training: collation with a loss mask, and length-grouped micro-batches in an
order that a checkpoint can resume exactly."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import torch

from lorapilot.data.format import IGNORE_INDEX, Encoded

MEGA_CHUNK = 50  # micro-batches per length-sorted chunk (the usual group_by_length size)


Batch = dict[str, torch.Tensor]


def collate(examples: Sequence[Encoded], pad_id: int, multiple: int = 1) -> Batch:
    """Right-pad to the longest example, rounded up to a multiple of `multiple` tokens (so
    that batch shapes repeat: `train.pad_to_multiple_of`); padding gets attention 0 and
    label -100, so it changes no real position's result and carries no loss.

    Padding is marked by position, not by `pad_id`: the pad token is often the
    end-of-turn token, which is also a real, trained label at the end of each answer.
    """
    longest = max(len(e.input_ids) for e in examples)
    width = -(-longest // multiple) * multiple
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        labels[row, :n] = torch.tensor(e.labels, dtype=torch.long)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def count_target_tokens(batch: Batch) -> int:
    """Terms that carry loss. Token labels (rows x positions): label != -100 after the causal
    shift (position 0 never does). Class labels (one per row): every labelled row."""
    labels = batch["labels"]
    if labels.ndim == 1:
        return int((labels != IGNORE_INDEX).sum())
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def batch_units(batch: Batch) -> tuple[int, int]:
    """(real, padded) units of a batch, what a step's `tokens` and padding efficiency count:
    tokens of a padded text batch; rows of a batch without padding (images)."""
    mask = batch.get("attention_mask")
    if mask is None:
        rows = int(batch["labels"].shape[0])
        return rows, rows
    return int(mask.sum()), mask.numel()


def batch_width(batch: Batch) -> int:
    """Sequence width of a text batch (0 for a batch without token positions)."""
    ids = batch.get("input_ids")
    return int(ids.shape[-1]) if ids is not None else 0


def example_target_tokens(e: Encoded) -> int:
    return sum(1 for t in e.labels[1:] if t != IGNORE_INDEX)


CATEGORY_SAMPLING_POWER = {"natural": 0.0, "sqrt": 0.5, "balanced": 1.0}


def category_weights(categories: Sequence[str], mode: str) -> list[float] | None:
    """Per example, how likely an epoch's draws take it (`train.category_sampling`): 1 /
    count(category) ** p, p = 1 for balanced (every category drawn equally often), 0.5 for
    sqrt; None for natural (every example once an epoch, no draws)."""
    power = CATEGORY_SAMPLING_POWER[mode]
    if not power:
        return None
    count = Counter(categories)
    return [count[c] ** -power for c in categories]


def sampling_summary(categories: Sequence[str], weights: Sequence[float] | None) -> dict:
    """What an epoch of draws gives each category: {category: {examples, draws_per_epoch
    (expected), per_example}}, commonest first; the run record shows it so no category's
    over- or under-sampling is silent."""
    count = Counter(categories)
    n = len(categories)
    if weights is None:
        return {c: {"examples": k, "draws_per_epoch": k, "per_example": 1.0}
                for c, k in count.most_common()}  # fmt: skip
    total = sum(weights)
    mass: Counter = Counter()
    for c, w in zip(categories, weights, strict=True):
        mass[c] += w
    return {
        c: {
            "examples": k,
            "draws_per_epoch": round(n * mass[c] / total, 1),
            "per_example": round(n * mass[c] / total / k, 3),
        }
        for c, k in count.most_common()
    }


def length_grouped_batches(
    lengths: Sequence[int],
    micro_batch: int,
    seed: int,
    epoch: int,
    weights: Sequence[float] | None = None,
) -> list[list[int]]:
    """Indices grouped into micro-batches of similar length, in a per-(seed, epoch) order.

    Shuffle, cut into mega-chunks of 50 micro-batches, sort each chunk by length (so a
    micro-batch pads little), then shuffle the order of the micro-batches (so training does
    not see short examples, then long ones). The batch holding the longest example goes
    first, so an out-of-memory shows at step 1 rather than hours in. The same
    (seed, epoch) always gives the same list, which is what makes resuming exact.

    `weights` (train.category_sampling): the epoch is as many draws with replacement, each
    example drawn with probability proportional to its weight, instead of each example once.
    """
    rng = random.Random(f"lorapilot-batches-{seed}-{epoch}")  # str seeds hash stably
    if weights is None:
        order = list(range(len(lengths)))
        rng.shuffle(order)
    else:
        order = rng.choices(range(len(lengths)), weights=weights, k=len(lengths))
    mega = micro_batch * MEGA_CHUNK
    batches: list[list[int]] = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start : start + mega], key=lambda i: -lengths[i])
        batches.extend(chunk[j : j + micro_batch] for j in range(0, len(chunk), micro_batch))
    rng.shuffle(batches)
    if batches:
        longest = max(range(len(batches)), key=lambda b: max(lengths[i] for i in batches[b]))
        batches.insert(0, batches.pop(longest))
    return batches


def padding_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Real tokens / padded tokens (1.0 = no padding at all)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return real / padded if padded else 1.0


class MicroBatchStream:
    """Micro-batches epoch after epoch. Its position (epoch, index) is all a checkpoint
    needs: each epoch's batch list is rebuilt from (seed, epoch)."""

    def __init__(
        self,
        lengths: Sequence[int],
        micro_batch: int,
        seed: int,
        weights: Sequence[float] | None = None,
    ):
        self.lengths, self.micro_batch, self.seed = lengths, micro_batch, seed
        self.weights = weights
        self.epoch, self.index = 0, 0
        self._batches = self._epoch(0)

    def _epoch(self, epoch: int) -> list[list[int]]:
        return length_grouped_batches(
            self.lengths, self.micro_batch, self.seed, epoch, self.weights
        )

    def next(self) -> list[int]:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = self._epoch(self.epoch)
        self.index += 1
        return self._batches[self.index - 1]

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.index / len(self._batches)

    def seek(self, epoch: int, index: int) -> None:
        self.epoch, self.index = epoch, index
        self._batches = self._epoch(epoch)
