"""The image classifier a pilot trains: a base (the EfficientNet-Lite0 default or any local
folder that `AutoModelForImageClassification` loads) with a new head for the pilot's labels.

Three things every image pilot relies on are decided here, once:

* **The head** is found by name (`_fc`, `classifier`, `head`, `fc`) and is always in PEFT's
  `modules_to_save`: a head that is not saved is re-initialised at random on reload and
  gives chance accuracy after export (peft#2171). `verify` checks the saved adapter for it.
* **BatchNorm statistics are frozen**: the running mean/variance are buffers that a train-mode
  forward overwrites, on micro-batches of a few images; `ImageClassifier.train()` keeps every
  norm layer in eval mode, so LoRA adapts the convolutions against the statistics the base
  was trained with, and frozen means frozen (the update audit checks parameters, and no
  buffer moves either).
* **LoRA targets** when the spec says `all-linear`: the 1x1 convolutions of the default
  (`_expand_conv`, `_project_conv`, `_conv_head`: pointwise, ~95% of its multiply-adds), and
  for other models every nn.Linear but the head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from lorapilot.base.models import IMAGE_DEFAULT, ResolvedModel, resolve_base
from lorapilot.errors import UsageError
from lorapilot.spec import Pilot

HEAD_NAMES = ("_fc", "classifier", "head", "fc")
MIN_EFFICIENTNET_SIZE = 32
EFFICIENTNET_TARGETS = ["_expand_conv", "_project_conv", "_conv_head"]


class ImageClassifier(nn.Module):
    """`net` (images -> logits) with its norm layers kept in eval mode in training too."""

    def __init__(self, net: nn.Module, head: str, kind: str):
        super().__init__()
        self.net, self.head_name, self.kind = net, head, kind

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.net(pixel_values)
        return out if isinstance(out, torch.Tensor) else out.logits

    def train(self, mode: bool = True) -> ImageClassifier:
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase):
                m.eval()
        return self

    @property
    def head_path(self) -> str:
        """The head's module path in this wrapper (what modules_to_save names)."""
        return f"net.{self.head_name}"

    def head_module(self) -> nn.Module:
        return self.net.get_submodule(self.head_name)

    def save_pretrained(self, folder: Path, state_dict: dict | None = None, **_: Any) -> None:
        """A full fine-tune's weights, as the training loop saves a model: model.safetensors
        (this wrapper's keys, `net.*`) and a config naming the kind and head."""
        from safetensors.torch import save_file

        from lorapilot.fsutil import atomic_write_json

        state = self.state_dict() if state_dict is None else state_dict
        Path(folder).mkdir(parents=True, exist_ok=True)  # as transformers' save_pretrained does
        save_file({k: v.detach().contiguous() for k, v in state.items()},
                  str(Path(folder) / "model.safetensors"))  # fmt: skip
        atomic_write_json(
            Path(folder) / "config.json",
            {"lorapilot_full_finetune": self.kind, "head": self.head_path},
        )


def find_head(net: nn.Module, num_labels: int) -> str:
    for name in HEAD_NAMES:
        m = getattr(net, name, None)
        if isinstance(m, nn.Linear) and m.out_features == num_labels:
            return name
    raise UsageError(
        f"the image model {type(net).__name__} has no classification head named one of "
        f"{', '.join(HEAD_NAMES)} with {num_labels} outputs"
    )


def resolve_image_base(pilot: Pilot) -> ResolvedModel:
    m = pilot.spec.model
    return resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)


def load_image_classifier(
    pilot: Pilot, resolved: ResolvedModel | None = None, *, seed: int | None = None
) -> tuple[ResolvedModel, ImageClassifier]:
    """(resolved base, classifier in eval mode with a new head for the pilot's labels).

    The new head is initialised from `seed` (default train.seed) without touching the global
    RNG, so the same spec always starts from the same head."""
    resolved = resolved or resolve_image_base(pilot)
    labels = list(pilot.spec.task.labels or [])
    seed = pilot.spec.train.seed if seed is None else seed
    config = _read_config(resolved.path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if resolved.id == IMAGE_DEFAULT or config.get("lorapilot_image_model"):
            from lorapilot.base.image_models import load_image_default

            net, kind = load_image_default(resolved.path, num_labels=len(labels)), "efficientnet"
        else:
            net, kind = _load_transformers(pilot, resolved.path, labels), "transformers"
    size = (pilot.spec.task.image.size if pilot.spec.task.image else None) or 0
    if kind == "efficientnet" and 0 < size < MIN_EFFICIENTNET_SIZE:
        raise UsageError(
            f"{pilot.spec_path}: task.image.size: {size} is too small for {IMAGE_DEFAULT}: its "
            f"five stride-2 stages need at least {MIN_EFFICIENTNET_SIZE} pixels a side"
        )
    model = ImageClassifier(net, find_head(net, len(labels)), kind)
    for p in model.parameters():
        p.requires_grad_(False)
    return resolved, model.eval()


def _read_config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path / 'config.json'}: not a readable model config: {e}") from None


def _load_transformers(pilot: Pilot, path: Path, labels: list[str]) -> nn.Module:
    """An AutoModelForImageClassification folder, its head replaced by one for `labels`."""
    from transformers import AutoModelForImageClassification

    from lorapilot.base.models import quiet_transformers

    quiet_transformers()
    m = pilot.spec.model
    try:
        return AutoModelForImageClassification.from_pretrained(
            str(path),
            num_labels=len(labels),
            id2label=dict(enumerate(labels)),
            label2id={lab: i for i, lab in enumerate(labels)},
            ignore_mismatched_sizes=True,  # the pilot's head replaces the pretrained one
            use_safetensors=not m.allow_pickle,
            trust_remote_code=m.trust_remote_code,
            local_files_only=True,
        )
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(
            f"model.base {m.base!r}: {path} is not loadable as an image classifier "
            f"(AutoModelForImageClassification): {e}"
        ) from None


def lora_targets(model: ImageClassifier, spec_targets: Any) -> list[str]:
    """The module names LoRA wraps: the spec's list, or for `all-linear` the model's default."""
    if spec_targets != "all-linear":
        return list(spec_targets)
    if model.kind == "efficientnet":
        return list(EFFICIENTNET_TARGETS)
    head = model.head_path
    names = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name != head
        }
    )
    if not names:
        raise UsageError(
            "adapter.target_modules: all-linear: the image model has no linear layer besides "
            "its head; name the modules to adapt"
        )
    return names


def head_features(model: nn.Module, head: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """What the head sees (its input) for these images: the features a linear probe fits."""
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        model(pixel_values)
    finally:
        hook.remove()
    return seen[0].flatten(1)
