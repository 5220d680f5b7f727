"""What every part of the spec shares: the strict base model (unknown keys refused,
assignments validated), the names of the defaults, and the bare YAML on/off switch."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    model_serializer,
)

SPEC_FILENAME = "pilot.yaml"
DEFAULT_BASE = "smollm2-135m-instruct"
IMAGE_BASE = "efficientnet-lite0"
CLEANING_RULES = (
    "strip",
    "collapse_whitespace",
    "unicode_nfc",
    "drop_empty",
    "max_chars",
    "lowercase",
)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _known_names(names: list[str], known: tuple[str, ...], what: str) -> list[str]:
    for name in names:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return names


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a pre-registered criterion must not pass silently.
    Every float must be finite: `.inf`/`.nan` (YAML) or `inf` (--set) would validate as a
    number, compare false against every bound, and end as `Infinity`/`NaN` in run records."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # Keys added after specs were first hashed, left out of the dump while they hold these
    # values (None/False by identity, others by equality), so that a spec written before
    # they existed keeps its hash, and its results stay reusable.
    _omitted_at: ClassVar[dict[str, tuple]] = {}

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for key, values in self._omitted_at.items():
            if key in out and any(
                out[key] is v if v is None or isinstance(v, bool) else out[key] == v for v in values
            ):
                del out[key]
        return out


def _bare_on_off(v: Any) -> Any:
    """YAML 1.1 reads a bare `off` as false and `on` as true."""
    return {False: "off", True: "on"}.get(v, v) if isinstance(v, bool) else v


AutoOnOff = Annotated[Literal["auto", "on", "off"], BeforeValidator(_bare_on_off)]
OnOff = Annotated[Literal["off", "on"], BeforeValidator(_bare_on_off)]
