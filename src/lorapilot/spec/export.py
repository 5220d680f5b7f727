"""What the pilot hands over besides its report: the adapter formats `run` exports and checks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from lorapilot.spec.common import _Strict

EXPORT_FORMATS = ("peft", "merged", "gguf")


class ExportSpec(_Strict):
    """The deliverable's formats. `peft` is the adapter folder with its manifest (always in the
    deliverable); `merged` a merged model folder checked against the adapter; `gguf` the files
    for llama.cpp and Ollama, checked by predicting the validation split in llama.cpp itself
    (needs the `serve` extra). Out of the spec hash: exporting changes no result."""

    formats: list[Literal["peft", "merged", "gguf"]] = Field(
        default_factory=lambda: ["peft"],
        description="Formats `run` exports into deliverable/ after the decision and checks: "
        "peft, merged, gguf.",
    )
    min_agreement: float = Field(
        0.98,
        ge=0.0,
        le=1.0,
        description="GGUF: the least share of validation examples llama.cpp must predict as "
        "lorapilot did (for generated answers: of their tokens, each predicted from the same "
        "preceding tokens; gated for an original, f32 or f16 base; reported only for a base "
        "quantized further than the one trained on).",
    )
    gguf_base: Literal["auto", "original", "f32", "f16", "q8_0"] = Field(
        "auto",
        description="GGUF: the base file. original: the GGUF the base was dequantized from (the "
        "default model's Q4_1, the exact weights trained on); f32/f16/q8_0: converted from the "
        "safetensors; auto: original where there is one, else f16.",
    )

    merge_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="merged: the merged weights' dtype. auto/float32: the exact merge, checked "
        "on the logits; float16/bfloat16: half the size, written tensor by tensor and checked "
        "on the validation predictions (bfloat16 rounds much of a LoRA update away: "
        "docs/exporting.md).",
    )
    reference: Literal["recorded", "fp32"] = Field(
        "recorded",
        description="GGUF: what llama.cpp's predictions are compared with: the train run's "
        "recorded validation predictions, or the adapter evaluated again in fp32 (its exact "
        "arithmetic: a bf16 evaluation alone flips close greedy generations).",
    )

    @field_validator("formats")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a format is listed twice")
        return v
