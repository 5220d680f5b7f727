"""`Trainee`: what a train run gets from its modality (see `lorapilot.modality`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lorapilot.data.audit import smoke_sample
from lorapilot.data.dataset import PreparedData
from lorapilot.spec import SmokeSpec


@dataclass
class Trainee:
    """What a train run needs from its modality: the base with the adapter attached, the data
    as training sets (`train.examples`), how to evaluate a model on records of a split with
    the pilot's protocol, and the hashes beyond the base that pin the adapter's inputs."""

    resolved: Any  # models.ResolvedModel
    model: Any
    adapter_info: dict
    prepared: PreparedData
    train_records: list  # the records behind train_set (the smoke evaluates them)
    train_set: Any  # train.examples.TrainingSet
    val_set: Any
    # (model, records, label=, progress=, log=, plain=) -> (EvalResult, protocol); plain:
    # the model's own ranking of labels, without calibration (the smoke's memorisation check)
    evaluate: Callable[..., tuple[Any, dict]]
    manifest_hashes: dict  # text: tokenizer and chat template; images: the transforms
    # files the adapter folder carries beside its weights (name -> text), pinned by its
    # manifest: a text pilot's own chat template (model.chat_template), which whoever serves
    # the adapter must prompt it with
    adapter_texts: dict[str, str] = field(default_factory=dict)


@dataclass
class Loaded:
    """A model to evaluate, as `eval` and `verify` load it: the base (with a saved adapter
    attached when one is given), the data, and the pilot's evaluation of records."""

    resolved: Any
    model: Any
    prepared: PreparedData
    # (model, records, label=, progress=, log=) -> (EvalResult, protocol)
    evaluate: Callable[..., tuple[Any, dict]]
    # (records, protocol, label=, progress=, log=) -> (EvalResult, extras) of the baseline on
    # these rows: text the unadapted model (an attached adapter switched off); images the
    # linear probe fitted on the training split (extras: its settings, the random head)
    evaluate_base: Callable[..., tuple[Any, dict]]
    problems: list[str]  # pins in the manifest that the loaded inputs do not match
    protocol: dict  # the pilot's evaluation protocol for this base and data version


def training_records(
    prepared: PreparedData, smoke_per_category: int | None, seed: int, smoke: SmokeSpec | None
):
    """(train, val) records of a train run; for the smoke, both are the same few training
    examples per category, at least `smoke.min_examples` and at most `smoke.max_examples`
    (what it memorises is what it is checked on)."""
    if smoke_per_category is None:
        return prepared.splits["train"], prepared.splits["val"]
    smoke = smoke or SmokeSpec()
    few = smoke_sample(
        prepared.splits["train"], smoke_per_category, smoke.min_examples, smoke.max_examples, seed
    )
    return few, few
