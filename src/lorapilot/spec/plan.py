"""The experiment plan as written in the spec: the variants (one change each, or a stated
why) and the rule that selects one on validation."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    field_validator,
)

from lorapilot.spec.common import _Strict

VARIANT_SECTIONS = ("adapter.", "train.", "model.quantization")
"""What a variant may change: the recipe. The task, data, evaluation, criterion, guards and
limits stay fixed, or the variants could not be compared with the baseline or each other."""
_VARIANT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
_KEY_PATH_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class VariantSpec(_Strict):
    """One pre-registered experiment: a few overrides of the base recipe."""

    name: str = Field(description="Variant name (letters, digits, . _ -); `base` is reserved.")
    set: dict[str, Any] = Field(
        description="Overrides of the base recipe as dotted keys, e.g. {adapter.r: 8}."
    )
    why: str | None = Field(
        None, description="Required when the variant changes two parameter groups (combined)."
    )

    @field_validator("name")
    @classmethod
    def _vname(cls, v: str) -> str:
        if not _VARIANT_NAME_RE.match(v):
            raise ValueError("must be 1-40 of letters, digits, '.', '_', '-'")
        if v == "base":
            raise ValueError("`base` is reserved: the base recipe is always variant `base`")
        return v

    @field_validator("set")
    @classmethod
    def _keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("a variant must set at least one key")
        for key in v:
            if not _KEY_PATH_RE.fullmatch(key):
                raise ValueError(f"{key!r} is not a key path like adapter.r")
            if not any(key == s.rstrip(".") or key.startswith(s) for s in VARIANT_SECTIONS):
                raise ValueError(
                    f"{key!r}: a variant changes the recipe only (adapter.*, train.*, "
                    "model.quantization.*); the task, data, evaluation, criterion and limits "
                    "are the same for every variant"
                )
        return v


class SelectionSpec(_Strict):
    """The pre-registered rule that picks the variant the decision is about."""

    metric: str | None = Field(None, description="Default: the success metric.")
    split: Literal["val"] = Field(
        "val", description="Always validation: the test split confirms, it does not choose."
    )
    seeds: int = Field(
        1,
        ge=1,
        le=10,
        description="Train every variant this many times, with train.seed, train.seed + 1, "
        "...: a variant is chosen by the mean of its seeds' validation values, and the "
        "adapter carried to verify and the test is its median seed's (a typical run of the "
        "recipe, not the luckiest). The spread between seeds is reported beside every gain, "
        "and a choice or a gain smaller than it is named a limitation. Multiplies the "
        "training time the budget plans.",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {"seeds": (1,)}
