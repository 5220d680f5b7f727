"""Mixed precision, one definition for training and evaluation.

`auto` (the default) picks the fastest precision this machine runs natively: bf16 on a GPU
that has it (fp16 on one that does not), bf16 on a CPU with AMX or AVX512-BF16, fp32 on any
other CPU, where bf16 is emulated and 10-100x slower than fp32. The spec keeps `auto` (its
hash does not depend on the machine); every record that depends on it (the eval protocol,
the train record, the base identity) holds the resolved value.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from lorapilot.records.environment import cpu_has_fast_bf16


def default_device_type() -> str:
    """The device a step computes on: the GPU when there is one (CUDA or ROCm), else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve(precision: str, device_type: str | None = None) -> str:
    """`auto` -> bf16, fp16 or fp32 for the device; an explicit precision is kept."""
    if precision != "auto":
        return precision
    device_type = device_type or default_device_type()
    if device_type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device_type == "cpu":
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    return "fp32"


def autocast(device_type: str, precision: str):
    """bf16/fp16 autocast, or nothing for fp32. Also on CPUs, where AMX makes bf16 matmul
    several times faster than fp32."""
    precision = resolve(precision, device_type)
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


# --------------------------------------------------------------------------- the base's dtype

TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def base_dtype(spec: Any, use: str, device_type: str | None = None, method: str | None = None):
    """`model.dtype` resolved for what the base is loaded for (an explicit dtype is kept).

    `auto`:
    - "train": the dtype the trainer holds the frozen decoder linears in (`hold_frozen`):
      the training compute dtype when it is 16-bit and evaluation computes in the same one;
      fp32 for full fine-tuning (the weights are the trainable master weights), a quantized
      base (peft's k-bit preparation upcasts what is not quantized) or fp32 compute. When
      evaluation computes in another dtype, linears rounded for training would be evaluated
      rounded, and a fresh-process reload would not reproduce it: fp32 then too.
    - "eval": the evaluation's dtype, for the whole model (evaluation casts it there anyway;
      loading it there skips a full-precision copy); fp32 for a quantized base, as trained.
    - "exact": fp32, for a merge and the references it is checked against.
    """
    if use not in ("train", "eval", "exact"):
        raise ValueError(f"use must be train, eval or exact, got {use!r}")
    evaluated = resolve(spec.eval.precision, device_type)
    trained = resolve(spec.train.precision, device_type) if use == "train" else evaluated
    return held_dtype(
        spec.model.dtype, use, trained=trained, evaluated=evaluated,
        quantized=spec.model.quantization is not None,
        full=(method or spec.adapter.method) == "full",
    )  # fmt: skip


def held_dtype(
    model_dtype: str, use: str, *, trained: str, evaluated: str, quantized: bool, full: bool
) -> str:
    """`base_dtype`'s rule on resolved precisions (pure: the pre-rental estimate applies it
    to a GPU class it does not have)."""
    if model_dtype != "auto":
        return model_dtype
    if use == "exact" or quantized:
        return "float32"
    if use == "eval":
        return TORCH_DTYPE_NAMES[evaluated]
    if full or trained == "fp32" or trained != evaluated:
        return "float32"
    return TORCH_DTYPE_NAMES[trained]


def hold_frozen(model: Any, dtype: str) -> dict[str, Any]:
    """Hold the frozen linear weights of a model about to be trained in `dtype`, every other
    parameter in fp32; what was done, for the run record.

    Under autocast in the same dtype this computes exactly what the fp32 base computes:
    autocast casts each fp32 linear weight to `dtype` in every forward (and autograd keeps
    that copy for backward); a weight held in `dtype` is the same rounded value, cast once.
    What autocast does not cast stays fp32, or the computation would change: the input
    embeddings (their output starts the fp32 residual stream, and a tied LM head is the same
    tensor), the norms (they scale fp32 activations), and every trainable tensor (LoRA
    matrices, `modules_to_save` copies: fp32 master weights, fp32 gradients and optimizer
    state). A linear whose weight is an embedding's is left with the embedding."""
    target = getattr(torch, dtype)
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    counts = {"held": 0, "fp32": 0}
    seen: set[int] = set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen or not p.is_floating_point():
                continue
            seen.add(id(p))
            frozen_linear = (
                isinstance(module, torch.nn.Linear)
                and not p.requires_grad
                and id(p) not in embeddings
            )
            want = target if frozen_linear else torch.float32
            if p.dtype != want:
                p.data = p.data.to(want)
            counts["held" if frozen_linear else "fp32"] += p.numel()
    return {
        "dtype": dtype,
        "params_in_dtype": counts["held"],
        "params_in_fp32": counts["fp32"],
        "kept_in_fp32": "embeddings, norms, trainable tensors",
    }


def hold_for_training(model: Any, spec: Any, method: str | None = None) -> dict[str, Any]:
    """After the adapter is attached to a base loaded with `load_base(use="train")`: hold its
    frozen linears as `base_dtype(spec, "train")` says. Returns the run record's part:
    `base_dtype`, and `frozen_held` (`hold_frozen`'s counts) when anything was held."""
    dtype = base_dtype(spec, "train", method=method)
    out: dict[str, Any] = {"base_dtype": dtype}
    if spec.model.dtype == "auto" and dtype != "float32":
        out["frozen_held"] = hold_frozen(model, dtype)
    return out
