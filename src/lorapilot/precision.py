"""Mixed precision, one definition for training and evaluation."""

from __future__ import annotations

import contextlib

import torch


def autocast(device_type: str, precision: str):
    """bf16/fp16 autocast, or nothing for fp32. Also on CPUs, where AMX makes bf16 matmul
    several times faster than fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)
