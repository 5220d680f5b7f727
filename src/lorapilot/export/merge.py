"""A LoRA adapter merged into its base's weights and written as a plain transformers folder,
one tensor at a time, in float32 or 16 bits: PEFT's `merge_and_unload` after a float32 load
holds the whole model in float32 and saves it so (32 GB of memory and of files for an 8B
bf16 base, twice what the base takes); here the largest tensor is what is held."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lorapilot.base.models import SAFETENSORS_FLOATS
from lorapilot.errors import UsageError
from lorapilot.export import gguf_files as gf
from lorapilot.export import weights as wt
from lorapilot.export.weights import Weights

INDEX = "model.safetensors.index.json"
COPIED = ("generation_config.json",)
"""Files of the base folder the merged folder carries as they are (the tokenizer is saved by
the caller, the config is rewritten with the merged dtype)."""
_SAFETENSORS_DTYPE = {name: code for code, name in SAFETENSORS_FLOATS.items()}
_NUMPY_DTYPE = {
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
    np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}  # fmt: skip


def merged_weights(
    folder: Path, adapter_w: dict, adapter_cfg: dict, base: Weights | None = None
) -> Weights:
    """Base weights (`base`: a quantized base's, dequantized) plus every LoRA update
    B @ A * scale, in float32 (what PEFT's merge adds), each tensor merged when it is read."""
    base = wt.of_folder(folder) if base is None else base
    pairs = gf.lora_pairs(adapter_w, str(folder))
    scales = {m: gf.module_scale(m, ab["A"].shape[0], adapter_cfg) for m, ab in pairs.items()}
    missing = sorted(m + ".weight" for m in pairs if m + ".weight" not in base)
    if missing:
        raise UsageError(f"{folder}: the adapter's modules have no base weight: {missing[:5]}")

    def merge(key: str, read) -> np.ndarray:
        module = key.removesuffix(".weight")
        if key.endswith(".weight") and module in pairs:
            ab = pairs[module]
            return read().astype(np.float32) + (ab["B"] @ ab["A"]) * np.float32(scales[module])
        return read()

    return base.replaced(merge)


def only_lora(adapter_w: dict) -> bool:
    """Whether an adapter holds LoRA A/B pairs only (whole trained modules, `modules_to_save`,
    are merged by PEFT in memory instead)."""
    return all(gf.LORA_KEY.match(k) for k in adapter_w)


def write_safetensors(
    path: Path, names: list[str], weights: Weights, dtype: str, tick: Callable[[], None]
) -> int:
    """A safetensors file of `names`, floating tensors in `dtype` (others as stored), written
    tensor by tensor: the header first (every shape is known), then each tensor read, cast
    and written before the next is read. -> bytes of tensor data."""
    import torch

    torch_dtype = getattr(torch, dtype)
    width = torch.finfo(torch_dtype).bits // 8
    header: dict = {"__metadata__": {"format": "pt"}}
    others: dict[str, np.ndarray] = {}  # integer buffers (rare, small): read up front
    offset = 0
    for name in names:
        n = int(np.prod(weights.shape(name), dtype=np.int64))
        if weights.is_float(name):
            kind, size = _SAFETENSORS_DTYPE[dtype], n * width
        else:
            others[name] = np.ascontiguousarray(weights[name])
            kind, size = _NUMPY_DTYPE[others[name].dtype], others[name].nbytes
        header[name] = {"dtype": kind, "shape": list(weights.shape(name)),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in names:
            if name in others:
                f.write(others.pop(name).tobytes())
            else:
                a = np.ascontiguousarray(weights[name], dtype=np.float32)
                t = torch.from_numpy(a).to(torch_dtype).reshape(-1)
                f.write(t.view(torch.uint8).numpy().tobytes())
            tick()
    return offset


def write_model_folder(
    src: Path, dest: Path, weights: Weights, dtype: str, tick: Callable[[], None]
) -> int:
    """`weights` as a transformers folder in `dest`, in `dtype`, sharded as `src` is (its
    files and index), with `src`'s config (its dtype set) and generation config. -> bytes."""
    index_path = src / INDEX
    if index_path.is_file():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        shards: dict[str, list[str]] = {}
        for name, file in index["weight_map"].items():
            shards.setdefault(file, []).append(name)
    else:
        files = sorted(p.name for p in src.glob("*.safetensors"))
        if len(files) != 1:
            raise UsageError(f"{src}: {len(files)} safetensors files and no {INDEX}")
        shards, index = {files[0]: list(weights)}, None
    total = 0
    for file, names in shards.items():
        total += write_safetensors(dest / file, names, weights, dtype, tick)
    if index is not None:
        index = {**index, "metadata": {**(index.get("metadata") or {}), "total_size": total}}
        (dest / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    config["dtype"] = dtype  # transformers 5's key; 4's `torch_dtype` too where it was
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    for name in COPIED:
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    return total
