"""Mixed precision, one definition for training and evaluation.

`auto` (the default) picks the fastest precision this machine runs natively: bf16 on a GPU
that has it (fp16 on one that does not), bf16 on a CPU with AMX or AVX512-BF16, fp32 on any
other CPU, where bf16 is emulated and 10-100x slower than fp32. The spec keeps `auto` (its
hash does not depend on the machine); every record that depends on it (the eval protocol,
the train record, the base identity) holds the resolved value.
"""

from __future__ import annotations

import contextlib

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
