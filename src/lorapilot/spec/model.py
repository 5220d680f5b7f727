"""The base model and its quantization (bitsandbytes 4-bit or 8-bit, loaded quantized)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from lorapilot.spec.common import DEFAULT_BASE, _Strict


class QuantizationSpec(_Strict):
    """A base quantized at load time by bitsandbytes (QLoRA: 4-bit NF4 with LoRA on top)."""

    bits: Literal[4, 8] = Field(description="4 (NF4/FP4, QLoRA) or 8 (LLM.int8).")
    type: Literal["nf4", "fp4"] | None = Field(
        None, description="4-bit data type (default nf4); not used with 8 bits."
    )
    double_quant: bool | None = Field(
        None,
        description="4-bit: quantize the block scales too (~0.4 bit/param saved; default true).",
    )
    compute_dtype: Literal["auto", "bf16", "fp16", "fp32"] | None = Field(
        None,
        description="4-bit: dtype the weights are dequantized to for each matmul (default auto, "
        "resolved as train.precision). "
        "8-bit computes in fp16 (bitsandbytes' LLM.int8).",
    )

    @model_validator(mode="after")
    def _by_bits(self) -> QuantizationSpec:
        if self.bits == 8:
            for key in ("type", "double_quant", "compute_dtype"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} applies to 4-bit quantization only (bits is 8)")
            return self
        for key, default in (("type", "nf4"), ("double_quant", True), ("compute_dtype", "auto")):
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)
        return self


class ModelSpec(_Strict):
    """The base model the adapter is trained on, and how it is loaded."""

    base: str = Field(
        DEFAULT_BASE,
        description="`smollm2-135m-instruct` (fetched by `lorapilot model fetch`), a local HF "
        "folder, or a hub id resolved offline from the local HF cache. Image pilots: default "
        "`efficientnet-lite0` (`lorapilot model fetch --image`).",
    )
    revision: str | None = Field(None, description="Hub revision (commit) for a hub id.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Dtype the frozen base is held in. `auto`: for LoRA training, the decoder's "
        "linear weights in the compute dtype (bf16/fp16, when train.precision and "
        "eval.precision resolve to the same 16-bit dtype), embeddings and norms in fp32: the "
        "same values autocast computes with from an fp32 base, in half the memory; fp32 "
        "otherwise (full fine-tuning, a quantized base, fp32 compute). Evaluation loads the "
        "whole base in its precision. An explicit dtype loads every weight in it.",
    )
    chat_template: str | None = Field(
        None,
        description="The prompt format, when not the base tokenizer's own chat template: "
        "`plain` (the system text, `### Input:` and `### Response:` sections, the answer "
        "ended by the tokenizer's eos token, the bos token first where the tokenizer adds "
        "one: for base models that ship no chat template), or the path of a Jinja chat "
        "template file, relative to the pilot folder. Its text is in the template hash (data "
        "version, evaluation protocol, adapter manifest) and in the tokenizer every export "
        "saves.",
        min_length=1,
    )
    trust_remote_code: bool = Field(
        False, description="Run code shipped with the model repo. Off unless you set it."
    )
    allow_pickle: bool = Field(
        False, description="Allow .bin/pickle weights (loaded with weights_only=True)."
    )
    quantization: QuantizationSpec | None = Field(
        None,
        description="Quantize the base at load time (bitsandbytes; extra `quant`). The adapter "
        "is bound to the quantized base: verify reloads it quantized the same way.",
    )
