"""The task: its kind (classification, extraction, format, image classification), the
labels or the fields with their value types, the prompt template and the image settings."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from lorapilot.spec.common import _known_names, _Strict

ValueType = Literal["string", "number", "integer", "boolean", "date", "list", "object", "map"]
_NESTED_KEYS = ("fields", "items", "values", "ordered")
SCALAR_TYPES = ("string", "number", "integer", "boolean", "date")
LABELLED_KINDS = ("classification", "multi_label_classification", "image_classification")
LABEL_SEPARATOR = ", "
"""Between the labels of a multi-label answer, in task.labels order: `anger, sadness`."""


class ValueSpec(_Strict):
    """The type of a value in an extraction target; `object`, `list` and `map` nest.

    object: named child `fields`; list: `items` of one type (a scalar or an object; none
    given: any JSON values, compared whole); map: keys chosen by each example (slot names),
    `values` of one type. A type may be written as its name alone: `items: string`.
    """

    type: ValueType = Field(
        "string",
        description="string, number, integer, boolean, date (ISO YYYY-MM-DD), list, object, map.",
    )
    fields: list[FieldSpec] | None = Field(None, description="An object's fields.")
    items: ValueSpec | None = Field(None, description="A list's item type.")
    values: ValueSpec | None = Field(None, description="A map's value type.")
    ordered: bool = Field(
        False, description="A list compared in order (default: as a multiset, any order)."
    )
    or_list: bool = Field(
        False,
        description="A scalar that may also be a list of such values, written `type: string | "
        "list` (or `values: string | list` for a map): a slot named twice in one example. "
        "Compared as a multiset (one value is a list of one).",
    )
    description: str = Field("", description="Shown to the model in the prompt.")
    enum: list[str] | None = Field(
        None,
        description="A string value's closed set of allowed values (an intent, a status): a "
        "target outside it is refused by `data`, a prediction outside it is not schema-valid, "
        "and the exported schema.json and fields.gbnf hold answers to it. A closed-set value "
        "is not free text: task.grounded does not count it.",
    )
    grounded: bool | None = Field(
        None,
        description="Whether this value's strings must appear in the input text; default: "
        "task.grounded, except a value with an `enum` (never counted). Set false on a "
        "classification-like field without an enum.",
    )

    @field_validator("items", "values", mode="before")
    @classmethod
    def _type_name(cls, v: Any) -> Any:
        return {"type": v} if isinstance(v, str) else v

    @model_validator(mode="before")
    @classmethod
    def _scalar_or_list(cls, data: Any) -> Any:
        """`type: string | list` -> type string, or_list true (either order)."""
        if isinstance(data, dict) and isinstance(data.get("type"), str) and "|" in data["type"]:
            parts = sorted({p.strip() for p in data["type"].split("|")})
            scalars = [p for p in parts if p != "list"]
            if "list" not in parts or len(scalars) != 1 or scalars[0] not in SCALAR_TYPES:
                raise ValueError(
                    f"type {data['type']!r}: the one alternative written with | is a scalar "
                    f"or a list of it, e.g. `string | list` (scalars: {', '.join(SCALAR_TYPES)})"
                )
            data = {**data, "type": scalars[0], "or_list": True}
        return data

    @model_validator(mode="after")
    def _shape(self) -> ValueSpec:
        if self.type == "object":
            if not self.fields:
                raise ValueError("an object needs `fields`")
            names = [f.name for f in self.fields]
            if len(set(names)) != len(names):
                raise ValueError("field names must be unique")
        elif self.fields is not None:
            raise ValueError(f"`fields` belongs to type object, not {self.type}")
        if self.items is not None and self.type != "list":
            raise ValueError(f"`items` belongs to type list, not {self.type}")
        if self.values is not None and self.type != "map":
            raise ValueError(f"`values` belongs to type map, not {self.type}")
        if self.enum is not None and (self.type != "string" or not self.enum):
            raise ValueError("`enum` is a non-empty list of the values of a string")
        if self.ordered and self.type != "list":
            raise ValueError(f"`ordered` belongs to type list, not {self.type}")
        if self.or_list and self.type not in SCALAR_TYPES:
            raise ValueError(f"`or_list` (`<scalar> | list`) belongs to a scalar, not {self.type}")
        return self

    def leaf_paths(self, path: str = "") -> list[str]:
        """Every leaf path this type names, in spec order: `slots.*` for a map's keys,
        `items[]` for a list's scalars, `items[].amount` for its objects' fields. An untyped
        list (no `items`) is one leaf, compared whole."""
        if self.type == "object":
            return [
                p
                for f in self.fields or []
                for p in f.leaf_paths(f"{path}.{f.name}" if path else f.name)
            ]
        if self.type == "map":
            key = f"{path}.*" if path else "*"
            return self.values.leaf_paths(key) if self.values is not None else [key]
        if self.type == "list" and self.items is not None:
            return self.items.leaf_paths(path + "[]")
        return [path]

    @property
    def has_leaves(self) -> bool:
        """An object, a map or a typed list: a value scored leaf by leaf, whose subtree gets
        its own leaf-level precision, recall and F1 (`per_field.<name>.leaf_f1`)."""
        return self.type in ("object", "map") or (self.type == "list" and self.items is not None)

    @property
    def nested(self) -> bool:
        """Whether this value has structure beyond today's flat fields."""
        return (
            self.type in ("object", "map") or self.items is not None or self.ordered or self.or_list
        )

    _omitted_at: ClassVar[dict[str, tuple]] = {
        **{k: (None, False) for k in _NESTED_KEYS},
        "or_list": (False,),
        "enum": (None,),
        "grounded": (None,),
    }


class FieldSpec(ValueSpec):
    """One named field of an extraction target (at any level of nesting)."""

    name: str = Field(min_length=1, description="Key in the target JSON object.")
    required: bool = Field(True, description="A required field must be present and non-null.")


ValueSpec.model_rebuild()


IMAGE_AUGMENTS = ("hflip", "vflip")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class ImageSpec(_Strict):
    """How an image becomes the model's input, in this order: mode, resize, crop, scale to
    [0, 1], normalise. Keys left unset are taken from the model's image processor
    (`preprocessor_config.json`); the resolved pipeline is recorded with the data version."""

    size: int | None = Field(
        None, ge=8, le=4096, description="Side of the square input, in pixels (default: model's)."
    )
    resize: Literal["shorter_side", "stretch", "pad"] | None = Field(
        None,
        description="shorter_side: scale the shorter side to `size` (keeps the aspect ratio); "
        "stretch: to size x size; pad: the longer side to `size`, then pad to a square. "
        "Default: as the model's image processor does, else shorter_side.",
    )
    crop: Literal["center", "none"] | None = Field(
        None,
        description="center: crop size x size from the middle after resizing. Default: as the "
        "model's image processor does, else center.",
    )
    mode: Literal["RGB", "L"] = Field("RGB", description="Colour mode every image is converted to.")
    normalize: Literal["from_model", "none"] = Field(
        "from_model", description="from_model: the image processor's mean/std; none: [0, 1]."
    )
    mean: list[float] | None = Field(None, description="Per-channel mean (overrides the model).")
    std: list[float] | None = Field(None, description="Per-channel std (overrides the model).")
    augment: list[str] = Field(
        default_factory=list,
        description=f"Training-only random transforms: {', '.join(IMAGE_AUGMENTS)}.",
    )
    max_pixels: int = Field(
        40_000_000,
        gt=0,
        description="Images with more pixels are refused before they are decoded "
        "(decompression bombs).",
    )

    @field_validator("augment")
    @classmethod
    def _augments(cls, v: list[str]) -> list[str]:
        return _known_names(v, IMAGE_AUGMENTS, "augment")

    @model_validator(mode="after")
    def _stats(self) -> ImageSpec:
        channels = 1 if self.mode == "L" else 3
        for key in ("mean", "std"):
            v = getattr(self, key)
            if v is not None and len(v) not in (1, channels):
                raise ValueError(f"`{key}` needs 1 or {channels} values for mode {self.mode}")
        if self.std is not None and any(x <= 0 for x in self.std):
            raise ValueError("`std` values must be positive")
        return self


class TaskSpec(_Strict):
    """What the model must do, and exactly how it is asked."""

    kind: Literal[
        "classification",
        "multi_label_classification",
        "extraction",
        "format",
        "image_classification",
    ] = Field(
        description="classification: one label per text; multi_label_classification: every "
        "label that applies to a text (one or more), answered as a comma-separated list; "
        "extraction: a JSON object of named fields; format: output that must follow a JSON "
        "schema or regex; image_classification: one label per image."
    )
    labels: list[str] | None = Field(
        None, description="Allowed labels (classification, multi_label_classification)."
    )
    fields: list[FieldSpec] | None = Field(None, description="Target fields (extraction).")
    json_schema: dict[str, Any] | None = Field(
        None, description="JSON schema the output must satisfy (extraction/format)."
    )
    regex: str | None = Field(
        None,
        description="Regex the whole output must match (format). A named group `answer` "
        "(`(?P<answer>...)`) marks the part compared with the same group of the target: "
        "`answer_match` (e.g. a worked solution's final number).",
    )
    system: str | None = Field(
        None,
        description="System prompt; `{labels}`, `{label_descriptions}` and `{fields}` are "
        "substituted.",
    )
    template: str = Field(
        "{text}", description="User turn; `{text}` is the input, `{labels}`/`{fields}` as above."
    )
    label_descriptions: dict[str, str] | None = Field(
        None,
        description="What labels mean, for a prompt that says so: `{label_descriptions}` in "
        "task.system or task.template becomes one line per label, `label: description` (a "
        "label without one: its name alone). Opaque names (`card_arrival`, an emotion "
        "taxonomy's groups) are then explained to the zero-shot base as to the adapter.",
    )
    grounded: bool = Field(
        False,
        description="extraction/format: every string value must appear in the input text; "
        "`ungrounded_value_rate` counts the values the model invented.",
    )
    image: ImageSpec | None = Field(
        None, description="image_classification: how images are resized, cropped, normalised."
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError("needs at least 2 labels")
        if len(set(v)) != len(v):
            raise ValueError("labels must be unique")
        for label in v:
            if not label.strip() or any(ord(c) < 32 for c in label):
                raise ValueError(f"label {label!r} is empty or has control characters")
        return v

    @field_validator("template")
    @classmethod
    def _template(cls, v: str) -> str:
        if "{text}" not in v:
            raise ValueError("must contain the placeholder {text}")
        return v

    @field_validator("regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"is not a valid regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _by_kind(self) -> TaskSpec:
        if self.labelled and not self.labels:
            raise ValueError(f"task.labels is required for a {self.kind} task")
        if self.multi_label:
            joined = [lab for lab in self.labels or [] if LABEL_SEPARATOR.strip() in lab]
            spaced = [lab for lab in self.labels or [] if lab != lab.strip()]
            if spaced:
                raise ValueError(
                    f"label {spaced[0]!r} starts or ends with a space, which a multi-label "
                    "answer's comma-separated labels cannot keep"
                )
            if joined:
                raise ValueError(
                    f"label {joined[0]!r} holds a comma: a multi-label answer lists its labels "
                    "separated by commas (rename the label, e.g. with ' and ' or '/')"
                )
        if self.image is not None and self.kind != "image_classification":
            raise ValueError("task.image applies to image_classification tasks")
        if self.kind == "image_classification" and self.image is None:
            self.__dict__["image"] = ImageSpec()
        if self.kind == "extraction" and not self.fields:
            raise ValueError("task.fields is required for an extraction task")
        if self.kind == "format" and not (self.json_schema or self.regex):
            raise ValueError("a format task needs task.json_schema or task.regex")
        if self.fields:
            names = [f.name for f in self.fields]
            if len(set(names)) != len(names):
                raise ValueError("task.fields names must be unique")
        if self.grounded and self.kind not in ("extraction", "format"):
            raise ValueError("task.grounded applies to extraction and format tasks")
        self._check_label_descriptions()
        return self

    def _check_label_descriptions(self) -> None:
        shown = any("{label_descriptions}" in (t or "") for t in (self.system, self.template))
        if self.label_descriptions is None:
            if shown:
                raise ValueError(
                    "the prompt shows {label_descriptions} and task.label_descriptions is not set"
                )
            return
        if not self.labels or self.kind == "image_classification":
            raise ValueError("task.label_descriptions applies to a text task with task.labels")
        unknown = [k for k in self.label_descriptions if k not in self.labels]
        if unknown:
            raise ValueError(f"task.label_descriptions: {unknown[0]!r} is not one of task.labels")
        empty = [k for k, v in self.label_descriptions.items() if not v.strip()]
        if empty:
            raise ValueError(f"task.label_descriptions: {empty[0]!r} has an empty description")
        if not shown:
            raise ValueError(
                "task.label_descriptions is set but no prompt shows it: write "
                "{label_descriptions} in task.system or task.template"
            )

    _omitted_at: ClassVar[dict[str, tuple]] = {
        "grounded": (False,),
        "image": (None,),
        "label_descriptions": (None,),
    }

    @property
    def text_target(self) -> bool:
        """A format task with only a regex: the target is the output string itself."""
        return (
            self.kind == "format" and not self.json_schema and not self.fields and bool(self.regex)
        )

    @property
    def answer_group(self) -> bool:
        """A regex-only format task whose regex marks the answer: `(?P<answer>...)`."""
        return self.text_target and "answer" in re.compile(self.regex or "").groupindex

    @property
    def labelled(self) -> bool:
        """Answers drawn from task.labels (one per example, or several for a multi-label
        task): label metrics, per-label categories, the label column of the data."""
        return self.kind in LABELLED_KINDS

    @property
    def multi_label(self) -> bool:
        """Every label that applies: the answer is a list of labels, not one."""
        return self.kind == "multi_label_classification"

    @property
    def modality(self) -> Literal["text", "image"]:
        return "image" if self.kind == "image_classification" else "text"

    @property
    def nested(self) -> bool:
        """Whether any field nests (object, map, list with items): the flat prompt and
        metrics are kept byte for byte for specs without."""
        return any(f.nested for f in self.fields or [])
