"""What the training loop trains on, whatever the modality: a `TrainingSet`.

The loop, the probe, the update audit and validation only ever ask a training set for its
size, each example's length (for length-grouped batches) and number of loss-carrying
targets (tokens, or one per image), a collated batch of some indices, the loss of a batch
and a hash of the data (checked on resume). Text and images differ only behind these.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from lorapilot.data.format import Encoded
from lorapilot.spec import TrainSpec
from lorapilot.train.batches import Batch, collate, example_target_tokens

LossFn = Callable[[Any, Batch], tuple[torch.Tensor, torch.Tensor]]


class TrainingSet(Protocol):
    unit: str  # what `tokens` counts in the step records: "tokens" | "images"
    # per example, its category (Record.category): what train.category_sampling balances;
    # None where the set was built without records (a list of encoded examples)
    categories: Sequence[str] | None
    lengths: Sequence[int]  # per example, what length-grouped batching sorts by
    targets: Sequence[int]  # per example, the terms its loss adds to a step's mean

    def __len__(self) -> int: ...

    def collate(self, indices: Sequence[int]) -> Batch:
        """The batch of these examples, on the CPU."""
        ...

    def loss_sum(self, model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(float32 sum of the batch's loss terms, their count): the plain loss, which
        `loss_fn` returns where no shorter path applies (the loop trains and validates
        with what `loss_fn` gives)."""
        ...

    def loss_fn(self, cfg: TrainSpec) -> tuple[LossFn, tuple[str, str]]:
        """The loss a training step takes (one process, DDP or FSDP alike), and (path, why)
        for the record."""
        ...

    def reproduces(self, model: Any, batch: Batch, min_p: float = 0.0) -> torch.Tensor:
        """Per row: does the model, as evaluation runs it, already give the target, with
        probability `min_p` or more? (The smoke stops training once every example it
        memorises is reproduced with a margin.)"""
        ...

    def data_hash(self) -> str: ...


class TextExamples:
    """Tokenised examples (prompt + answer, loss mask) and the causal-LM loss."""

    unit = "tokens"
    pad_multiple = 1  # batches are right-padded to a multiple of this many tokens

    def __init__(
        self, examples: Sequence[Encoded], pad_id: int, categories: Sequence[str] | None = None
    ):
        self.examples, self.pad_id = list(examples), pad_id
        self.categories = list(categories) if categories is not None else None
        self.lengths = [e.n_tokens for e in self.examples]
        self.targets = [example_target_tokens(e) for e in self.examples]

    def __len__(self) -> int:
        return len(self.examples)

    def collate(self, indices: Sequence[int]) -> Batch:
        return collate([self.examples[i] for i in indices], self.pad_id, self.pad_multiple)

    def loss_sum(self, model, batch: Batch):
        from lorapilot.train.loss import causal_lm_loss_sum

        return causal_lm_loss_sum(model, batch)

    def loss_fn(self, cfg: TrainSpec):
        from lorapilot.train.loss import loss_fn_for

        return loss_fn_for(cfg)

    def reproduces(self, model, batch: Batch, min_p: float = 0.0) -> torch.Tensor:
        from lorapilot.train.loss import greedy_reproduces

        return greedy_reproduces(model, batch, min_p)

    def data_hash(self) -> str:
        h = hashlib.sha256()
        for e in self.examples:
            h.update(np.asarray(e.input_ids, dtype=np.int64).tobytes())
            h.update(np.asarray(e.labels, dtype=np.int64).tobytes())
            h.update(b"|")
        return h.hexdigest()


def padded_to(data: TrainingSet, multiple: int) -> TrainingSet:
    """`data` whose batches are right-padded to a multiple of `multiple` tokens (a copy,
    sharing the examples); a set without token positions (images), or multiple 1, as is."""
    if multiple <= 1 or not isinstance(data, TextExamples):
        return data
    out = copy.copy(data)
    out.pad_multiple = multiple
    return out


def as_training_set(examples: Any, pad_id: int | None) -> TrainingSet:
    """A training set as is; a list of `Encoded` (what text callers hold) wrapped."""
    if hasattr(examples, "collate") and hasattr(examples, "loss_sum"):
        return examples
    if pad_id is None:
        raise ValueError("tokenised examples need a pad_id")
    return TextExamples(examples, pad_id)
