"""Quantized bases (spec key `model.quantization`): bitsandbytes 4-bit (NF4/FP4, QLoRA) and
8-bit (LLM.int8), quantized at load time from the base's safetensors.

An adapter trained on a quantized base learned against the *dequantized 4-bit weights*, not
the original ones, so the base it is bound to is (weights sha256, quantization config,
bitsandbytes version): `identity` is that record, kept in the run and the adapter manifest,
and `verify` refuses a reload that differs in any part of it. The arithmetic of the weight
bytes is here too (pure), for the memory model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lorapilot.spec.requirements import bitsandbytes_version

if TYPE_CHECKING:
    from lorapilot.spec import QuantizationSpec

BLOCK_SIZE_4BIT = 64  # bitsandbytes' default 4-bit block: one absmax scale per 64 weights
NESTED_BLOCK_SIZE = 256  # double quantization: one fp32 scale per 256 absmax values


def compute_dtype(q: QuantizationSpec) -> str:
    """The 4-bit compute dtype on this machine (`auto` resolved as train.precision)."""
    from lorapilot.base.precision import resolve

    return resolve(q.compute_dtype or "auto")


def bnb_config(q: QuantizationSpec):
    """transformers' BitsAndBytesConfig for the spec."""
    import torch
    from transformers import BitsAndBytesConfig

    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.type,
        bnb_4bit_use_double_quant=bool(q.double_quant),
        bnb_4bit_compute_dtype=dtype[compute_dtype(q)],
    )


def describe(q: QuantizationSpec | None) -> dict[str, Any] | None:
    """The quantization as recorded: the spec's values resolved, plus the block size."""
    if q is None:
        return None
    out = q.model_dump(mode="json")
    if q.bits == 4:
        out["compute_dtype"] = compute_dtype(q)
        out["block_size"] = BLOCK_SIZE_4BIT
    return out


def identity(
    weights_sha256: str, q: QuantizationSpec | None, dtype: str | None = None
) -> dict[str, Any]:
    """The exact base an adapter is bound to: original weights, quantization, bitsandbytes;
    with `dtype`, the one its frozen weights were held in (`precision.base_dtype`).

    The dtype is recorded, not compared by `identity_differences`: a base held in bf16 under
    bf16 autocast computes what the fp32 base computes, and an evaluation casts the whole
    model to its protocol's precision, which the eval protocol pins."""
    out = {
        "weights_sha256": weights_sha256,
        "quantization": describe(q),
        "bitsandbytes": bitsandbytes_version() if q is not None else None,
    }
    if dtype is not None:
        out["dtype"] = dtype
    return out


def identity_differences(trained: dict, now: dict) -> list[str]:
    """What differs between two base identities, one phrase per part (empty: the same)."""
    out = []
    for key, what in (
        ("weights_sha256", "base weights sha256"),
        ("quantization", "quantization"),
        ("bitsandbytes", "bitsandbytes version"),
    ):
        if trained.get(key) != now.get(key):
            out.append(f"{what}: trained with {trained.get(key)}, now {now.get(key)}")
    return out


def require_trained_base(manifest: dict, q: QuantizationSpec | None) -> dict | None:
    """An export's test that the base is the one the adapter was trained on (as verify's:
    weights, quantization, bitsandbytes), raising CheckFailed naming what differs -> the
    quantization it was trained on (None: not quantized)."""
    from lorapilot.errors import CheckFailed

    trained = manifest.get("base_identity") or identity(manifest["base"]["sha256"], None)
    differs = identity_differences(trained, identity(manifest["base"]["sha256"], q))
    if differs:
        raise CheckFailed(
            "the base is not the one the adapter was trained on: " + "; ".join(differs)
            + "; export with the spec it was trained with"
        )  # fmt: skip
    return trained.get("quantization")


def is_quantized(model) -> bool:
    """A base (or PEFT model over one) loaded through bitsandbytes that still holds its
    quantized layers: transformers' `dequantize()` leaves `is_loaded_in_4bit` set on the
    plain model it returns, which must then be evaluated (and cast) as any other."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    flagged = bool(
        getattr(base, "is_quantized", False)
        or getattr(base, "is_loaded_in_4bit", False)
        or getattr(base, "is_loaded_in_8bit", False)
    )
    return flagged and any(type(m).__name__ in _BNB_LAYERS for m in base.modules())


_BNB_LAYERS = ("Linear4bit", "Linear8bitLt")  # bitsandbytes' (and peft's wrappers of them)


def keep_one_cpu_path(model) -> None:
    """Turn off bitsandbytes' CPU inference repacking of 4-bit weights.

    On a CPU with AVX512-BF16, a `Linear4bit` in eval mode under no_grad repacks its weight
    in place for a faster inference kernel (`_convert_weight_packed_for_cpu`), and keeps it
    repacked. A training step after that (the loop validates at step 0, the smoke evaluates)
    runs `gemv_4bit`, which has no autograd kernel: the base layers pass no input gradient and
    most LoRA tensors get zero gradients, silently (measured on the default model in NF4:
    lora_B of the first layer, 1.66 -> 0.0 after one eval forward). It also fails outright on
    layers narrower than a quantization block (shape errors). Training and evaluation
    therefore take the one path that is exact for both, as on every other CPU and on GPUs."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        if getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False


def quant_state(model) -> dict[str, Any]:
    """name -> tensor of every quantization-state entry (4-bit absmax, quant maps, nested
    scales; 8-bit SCB) and quantized weight, as the state dict carries them."""
    import torch

    out = {}
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.dtype in (torch.uint8, torch.int8) or any(
            part in name for part in (".absmax", ".quant_map", ".nested_", ".SCB", "quant_state")
        ):
            out[name] = value
    return out


def weight_bytes_per_param(q: QuantizationSpec) -> float:
    """Bytes a quantized linear weight takes per parameter, its quantization state included.

    4-bit: half a byte, plus one absmax per 64-weight block: fp32 (4 bytes), or with double
    quantization 1 byte plus one fp32 scale per 256 absmax values. 8-bit: one byte (the
    per-row fp32 scale is negligible: 4 bytes per row of thousands).
    """
    if q.bits == 8:
        return 1.0
    if q.double_quant:
        scales = 1 / BLOCK_SIZE_4BIT + 4 / (BLOCK_SIZE_4BIT * NESTED_BLOCK_SIZE)
    else:
        scales = 4 / BLOCK_SIZE_4BIT
    return 0.5 + scales


def dequantized_bytes(q: QuantizationSpec) -> int:
    """Bytes of the dtype a quantized matmul dequantizes its weight to."""
    if q.bits == 8:
        return 2
    return {"bf16": 2, "fp16": 2, "fp32": 4}[compute_dtype(q)]
