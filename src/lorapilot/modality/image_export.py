"""An image pilot's merged export: LoRA folded into the classifier's weights, the trained head
in place of the base's, saved as a folder that loads without PEFT or lorapilot.

* the EfficientNet default: `model.safetensors` whose keys are the package's own
  (`EfficientNet.from_name("efficientnet-lite0", num_classes=N).load_state_dict(...)`, strict),
  and a `config.json` that lorapilot also reads as a base;
* a transformers model: `save_pretrained`, so `AutoModelForImageClassification` loads it with
  the pilot's labels as `id2label`.

Both get a `preprocessor_config.json` written from the exact pipeline the adapter was trained
and evaluated with (`lorapilot_transforms` holds all of it, the transformers keys what they
can express), so the export is used with the transforms it was measured with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.nn as nn

from lorapilot.fsutil import atomic_write_json
from lorapilot.modality.image_model import ImageClassifier, find_head
from lorapilot.modality.image_transforms import ImagePipeline

_RESAMPLE_CODE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


def processor_config_of(pipe: ImagePipeline, base: dict | None = None) -> dict[str, Any]:
    """preprocessor_config.json for `pipe`: the base's keys (processor type), overwritten by
    the pipeline's size, resize, crop, normalisation and resampling; the whole pipeline under
    `lorapilot_transforms` (mode, `pad`, augments are not transformers keys)."""
    s = pipe.size
    size = {"shortest_edge": s} if pipe.resize == "shorter_side" else {"height": s, "width": s}
    return {
        **(base or {}),
        "do_resize": True,
        "size": size,
        "do_center_crop": pipe.crop == "center",
        "crop_size": {"height": s, "width": s},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(pipe.mean),
        "image_std": list(pipe.std),
        "resample": _RESAMPLE_CODE.get(pipe.resample, 2),
        "lorapilot_transforms": pipe.to_dict(),
    }


def merged_classifier(adapted: Any) -> ImageClassifier:
    """The PEFT model's LoRA folded into the weights it wraps and the trained head (a
    `modules_to_save` copy) put in place of the base's: a plain `ImageClassifier`."""
    merged = adapted.merge_and_unload()
    assert isinstance(merged, ImageClassifier)
    return merged.eval()


def save_classifier(
    model: ImageClassifier, folder: Path, labels: list[str], pipe: ImagePipeline, base: Path
) -> None:
    """Write `model` into `folder` (see the module docstring)."""
    import json

    from safetensors.torch import save_file

    from lorapilot.base.image_models import image_config

    if model.kind == "efficientnet":
        state = {k: v.detach().contiguous() for k, v in model.net.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))
        atomic_write_json(
            folder / "config.json",
            {
                **image_config(),
                "num_labels": len(labels),
                "image_size": pipe.size,
                **_label_maps(labels),
            },  # fmt: skip
        )
    else:
        # its config already maps the pilot's labels (set when the new head was made)
        model.net.save_pretrained(folder, safe_serialization=True)
    proc_path = base / "preprocessor_config.json"
    proc = json.loads(proc_path.read_text(encoding="utf-8")) if proc_path.is_file() else None
    atomic_write_json(folder / "preprocessor_config.json", processor_config_of(pipe, proc))


def load_exported(folder: Path, kind: str, num_labels: int) -> ImageClassifier:
    """A saved export as an `ImageClassifier`, read from its files alone (what a user gets);
    its head found as the pilot's was, by name and width."""
    if kind == "efficientnet":
        from lorapilot.base.image_models import load_image_default

        net: nn.Module = load_image_default(folder)
    else:
        from transformers import AutoModelForImageClassification

        net = AutoModelForImageClassification.from_pretrained(
            str(folder), use_safetensors=True, local_files_only=True
        )
    return ImageClassifier(net, find_head(net, num_labels), kind).eval()


def _label_maps(labels: list[str]) -> dict[str, dict]:
    return {
        "id2label": {str(i): lab for i, lab in enumerate(labels)},
        "label2id": {lab: i for i, lab in enumerate(labels)},
    }
