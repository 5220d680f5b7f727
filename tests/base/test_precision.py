"""`auto` precision: the fastest precision the device runs natively, never an emulated one."""

import contextlib

import torch

import lorapilot.base.precision as precision
from lorapilot.base.precision import autocast, resolve


def test_explicit_precisions_are_kept_whatever_the_machine(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    for p in ("fp32", "bf16", "fp16"):
        assert resolve(p, "cpu") == p and resolve(p, "cuda") == p


def test_auto_on_a_cpu_follows_its_bf16_support(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    assert resolve("auto", "cpu") == "bf16"
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    assert resolve("auto", "cpu") == "fp32"
    # without a GPU the default device is the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve("auto") == "fp32"


def test_auto_on_a_gpu_is_bf16_where_it_has_it_else_fp16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve("auto") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve("auto", "cuda") == "fp16"


def test_autocast_auto_is_no_autocast_on_a_cpu_without_fast_bf16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    assert isinstance(autocast("cpu", "auto"), contextlib.nullcontext)
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    with autocast("cpu", "auto"):
        y = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert y.dtype == torch.bfloat16
