"""The pilot spec (pilot.yaml): pydantic models, defaults, JSON Schema and error formatting.

The spec is the pre-registration of the pilot: the hypothesis, the success criterion and the
guards are written before any model is trained, and every run records the spec's hash.
Everything but `name`, `hypothesis`, `task` and `data` has a default.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from lorapilot.errors import UsageError
from lorapilot.fsutil import sha256_json

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


ValueType = Literal["string", "number", "integer", "boolean", "date", "list", "object", "map"]
_NESTED_KEYS = ("fields", "items", "values", "ordered")


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
    description: str = Field("", description="Shown to the model in the prompt.")

    @field_validator("items", "values", mode="before")
    @classmethod
    def _type_name(cls, v: Any) -> Any:
        return {"type": v} if isinstance(v, str) else v

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
        if self.ordered and self.type != "list":
            raise ValueError(f"`ordered` belongs to type list, not {self.type}")
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
    def nested(self) -> bool:
        """Whether this value has structure beyond today's flat fields."""
        return self.type in ("object", "map") or self.items is not None or self.ordered

    _omitted_at: ClassVar[dict[str, tuple]] = {k: (None, False) for k in _NESTED_KEYS}


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

    kind: Literal["classification", "extraction", "format", "image_classification"] = Field(
        description="classification: one label per text; extraction: a JSON object of named "
        "fields; format: output that must follow a JSON schema or regex; image_classification: "
        "one label per image."
    )
    labels: list[str] | None = Field(None, description="Allowed labels (classification).")
    fields: list[FieldSpec] | None = Field(None, description="Target fields (extraction).")
    json_schema: dict[str, Any] | None = Field(
        None, description="JSON schema the output must satisfy (extraction/format)."
    )
    regex: str | None = Field(None, description="Regex the whole output must match (format).")
    system: str | None = Field(
        None, description="System prompt; `{labels}` and `{fields}` are substituted."
    )
    template: str = Field(
        "{text}", description="User turn; `{text}` is the input, `{labels}`/`{fields}` as above."
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
        return self

    _omitted_at: ClassVar[dict[str, tuple]] = {"grounded": (False,), "image": (None,)}

    @property
    def labelled(self) -> bool:
        """One label per example (text or image): label metrics, a per-label split."""
        return self.kind in ("classification", "image_classification")

    @property
    def modality(self) -> Literal["text", "image"]:
        return "image" if self.kind == "image_classification" else "text"

    @property
    def nested(self) -> bool:
        """Whether any field nests (object, map, list with items): the flat prompt and
        metrics are kept byte for byte for specs without."""
        return any(f.nested for f in self.fields or [])


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
    base: str = Field(
        DEFAULT_BASE,
        description="`smollm2-135m-instruct` (fetched by `lorapilot model fetch`), a local HF "
        "folder, or a hub id resolved offline from the local HF cache. Image pilots: default "
        "`efficientnet-lite0` (`lorapilot model fetch --image`).",
    )
    revision: str | None = Field(None, description="Hub revision (commit) for a hub id.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype the base weights are loaded in (master weights)."
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


class FieldMap(_Strict):
    text: str = Field("text", description="Column holding the input text.")
    image: str = Field(
        "image", description="Column holding the image path, relative to the pilot folder."
    )
    label: str = Field("label", description="Column holding the label (classification).")
    target: str = Field("target", description="Column holding the target object (extraction).")
    id: str | None = Field("id", description="Column holding a stable example id, if any.")

    _omitted_at: ClassVar[dict[str, tuple]] = {"image": ("image",)}


class SplitSpec(_Strict):
    seed: int = Field(0, description="Seed of the stratified split.")
    val: float = Field(0.15, gt=0, lt=1, description="Fraction for validation.")
    test: float = Field(0.15, ge=0, lt=1, description="Fraction reserved for the final test.")

    @model_validator(mode="after")
    def _sum(self) -> SplitSpec:
        if self.val + self.test >= 0.9:
            raise ValueError("val + test must leave at least 10% for train")
        return self


class DataFiles(_Strict):
    train: str
    val: str | None = Field(
        None,
        description="Validation file; without it a stratified, seeded `data.split.val` "
        "fraction of train is held out (e.g. a public set with only train and test files).",
    )
    test: str | None = None


class HFSplits(_Strict):
    """Which split of an HF dataset is which of ours; used as they are, like data.files."""

    train: str = Field("train", description="Split used for training.")
    val: str = Field("validation", description="Split used for validation.")
    test: str | None = Field(None, description="Split reserved for the final test, if any.")


class HFDataset(_Strict):
    """A dataset in the local Hugging Face `datasets` cache, read by name and offline only."""

    name: str = Field(
        description="Hub id as it was downloaded, e.g. `org/name`; read from the local HF "
        "datasets cache, never from the network (needs the `datasets` extra)."
    )
    config: str | None = Field(
        None, description="Config (subset) name; needed when several are cached."
    )
    split: str | None = Field(
        None, description="One split to divide into train/val/test (like data.file)."
    )
    splits: HFSplits | None = Field(
        None,
        description="Splits used as they are. Default (neither split nor splits): "
        "train + validation/val/dev (+ test) as they are, or the only split divided.",
    )
    cache_dir: str | None = Field(
        None,
        description="datasets cache folder (a relative path is from the pilot folder); default "
        "$HF_DATASETS_CACHE, else $HF_HOME/datasets.",
    )

    @field_validator("name")
    @classmethod
    def _hub_id(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", v):
            raise ValueError(f"{v!r} is not a hub dataset id like `org/name`")
        return v

    @model_validator(mode="after")
    def _one_split_rule(self) -> HFDataset:
        if self.split and self.splits:
            raise ValueError(
                "give data.hf_dataset.split (to divide) or .splits (as they are), not both"
            )
        return self


class SampleSpec(_Strict):
    """A seeded subset per split (counts, or fractions in (0, 1]), stratified by category:
    a first pass sized to the machine without writing a script. Part of the data version."""

    train: int | float | None = None
    val: int | float | None = None
    test: int | float | None = None

    @field_validator("train", "val", "test")
    @classmethod
    def _size(cls, v: int | float | None) -> int | float | None:
        if v is None or isinstance(v, bool):
            if isinstance(v, bool):
                raise ValueError("must be a count (>= 1) or a fraction in (0, 1]")
            return v
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be a count >= 1 or a fraction in (0, 1] (got {v})")
        if isinstance(v, float) and not 0 < v <= 1:
            raise ValueError(f"a fraction must be in (0, 1] (got {v}); a count is an integer")
        return v


class DataSpec(_Strict):
    source: str | None = Field(None, description="Where the data comes from.")
    permission: str | None = Field(
        None, description="The permission to use it: a licence or an internal approval."
    )
    file: str | None = Field(
        None,
        description="One file to split into train/val/test, or a folder written by `datasets` "
        "save_to_disk: a Dataset is split, a DatasetDict's train/validation(/test) are used as "
        "they are.",
    )
    files: DataFiles | None = Field(
        None, description="Pre-split files (or save_to_disk Dataset folders), used as they are."
    )
    hf_dataset: HFDataset | None = Field(
        None, description="A dataset in the local HF datasets cache, by name, offline."
    )
    format: Literal["auto", "jsonl", "csv", "parquet", "datasets"] = Field(
        "auto",
        description="auto: by extension; a save_to_disk folder is recognised by its metadata.",
    )
    fields: FieldMap = Field(default_factory=FieldMap)
    cleaning: list[str] = Field(
        default_factory=lambda: ["unicode_nfc", "strip", "collapse_whitespace", "drop_empty"],
        description=f"Cleaning rules by name, applied in order: {', '.join(CLEANING_RULES)}.",
    )
    max_chars: int | None = Field(None, gt=0, description="Limit for the `max_chars` rule.")
    split: SplitSpec = Field(default_factory=SplitSpec)
    max_length: int = Field(512, ge=16, description="Max tokens of prompt + answer.")
    truncation_side: Literal["left", "right"] = Field(
        "left", description="Which end of the *input text* is cut when too long."
    )
    on_error: Literal["fail", "skip"] = Field("fail", description="Policy for invalid records.")
    on_truncated_target: Literal["fail", "exclude"] = Field(
        "exclude", description="A target that would be cut is never cut silently."
    )
    leakage: Literal["fail", "drop_from_train", "warn"] = Field(
        "fail", description="Policy for duplicates between train and val/test."
    )
    near_dup_threshold: float = Field(0.8, gt=0, le=1, description="Jaccard threshold.")
    near_dup_bits: int = Field(
        10,
        ge=0,
        le=24,
        description="Images: candidate near duplicates differ in at most this many of the 64 "
        "bits of their perceptual hash; their thumbnails then decide.",
    )
    category: str | None = Field(
        None,
        description="extraction/format: the category of an example for per-category metrics, "
        "guards, the stratified split and sampling: a column of the data (`doc_type`) or a "
        "path in the target (`target.intent`). Default: which optional fields the target fills.",
    )
    sample: SampleSpec | None = Field(
        None,
        description="Use a seeded, stratified subset of each split, e.g. {train: 200, val: 0.5} "
        "(after the split, before duplicates are searched).",
    )

    @field_validator("cleaning")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        return _known_names(v, CLEANING_RULES, "cleaning rule")

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        if sum(bool(x) for x in (self.file, self.files, self.hf_dataset)) != 1:
            raise ValueError(
                "give exactly one of data.file (to split), data.files or data.hf_dataset"
            )
        if "max_chars" in self.cleaning and self.max_chars is None:
            raise ValueError("the max_chars cleaning rule needs data.max_chars")
        return self

    _omitted_at: ClassVar[dict[str, tuple]] = {
        **{k: (None,) for k in ("hf_dataset", "sample", "category")},
        "near_dup_bits": (10,),
    }


class AdapterSpec(_Strict):
    method: Literal["lora", "full"] = "lora"
    r: int = Field(16, gt=0, description="LoRA rank: must be a positive integer.")
    alpha: float = Field(32, gt=0, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt, or `all-linear`."
    )
    modules_to_save: list[str] = Field(default_factory=list, description="Extra trained modules.")


def _bare_on_off(v: Any) -> Any:
    """YAML 1.1 reads a bare `off` as false and `on` as true."""
    return {False: "off", True: "on"}.get(v, v) if isinstance(v, bool) else v


AutoOnOff = Annotated[Literal["auto", "on", "off"], BeforeValidator(_bare_on_off)]


class TrainSpec(_Strict):
    seed: int = 0
    epochs: float = Field(2, gt=0, description="Passes over train (ignored if max_steps is set).")
    max_steps: int | None = Field(None, gt=0, description="Optimizer steps; overrides epochs.")
    lr: float = Field(2e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    micro_batch: int = Field(8, gt=0, description="Examples per forward/backward.")
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    grad_checkpointing: bool = False
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast precision; auto: bf16 on a GPU with bf16 (else fp16) and on CPUs "
        "with AMX/AVX512-BF16, fp32 on other CPUs (bf16 is emulated there).",
    )
    max_grad_norm: float | None = Field(1.0, gt=0)
    loss_on: Literal["completion", "all"] = Field(
        "completion", description="Which tokens carry the loss: the answer only, or all."
    )
    eval_every: int | None = Field(None, gt=0, description="Validation every N steps.")
    save_every: int | None = Field(None, gt=0, description="Checkpoint every N steps.")
    distributed: Literal["none", "ddp", "fsdp"] = "none"
    threads: int | None = Field(
        None,
        ge=1,
        description="torch's intra-op CPU threads (default: the cores this process may use, "
        "or OMP_NUM_THREADS); recorded in each run's environment.",
    )
    shared_prefix: AutoOnOff = Field(
        "auto",
        description="on: the prompt prefix the rows of a micro-batch share (chat header, "
        "system prompt) runs once per micro-batch, forward and backward (same loss and "
        "gradients); off: every row computes it; auto: on on a CPU, and on a GPU only for "
        "micro-batches where it saves enough work to pay for its second decoder pass "
        "(measured: bench/README.md). One process, DDP or FSDP, with or without activation "
        "checkpointing; the run record says which path ran and why.",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {"shared_prefix": ("auto",)}  # same gradients


class EvalNormalize(_Strict):
    case: bool = True
    whitespace: bool = True
    list_order: bool = True


class EvalSpec(_Strict):
    mode: Literal["score", "generate"] = Field(
        "score", description="Classification: score every label (no parse failures) or generate."
    )
    batch_size: int = Field(16, gt=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast precision of evaluation, resolved as train.precision; the "
        "resolved value is recorded in the eval protocol.",
    )
    max_new_tokens: int | None = Field(None, gt=0, description="Default: longest target + margin.")
    normalize: EvalNormalize = Field(default_factory=EvalNormalize)
    min_support: int = Field(
        5, ge=1, description="Below this support a per-category verdict is 'insufficient data'."
    )
    label_search: Literal["best_first", "all"] = Field(
        "best_first",
        description="Label scoring: best_first scores only the labels the argmax needs (a "
        "label's log-probability can only fall as its tokens are added: the same prediction, "
        "much faster with many labels; predictions.jsonl keeps the scores computed); all "
        "scores every label.",
    )
    shared_prefix: AutoOnOff = Field(
        "auto",
        description="on: the prompt prefix every prompt shares is computed once and its "
        "key/value cache reused by every batch; off: each batch computes it; auto: on on a "
        "CPU, off on a GPU (where the extra pass cost more than it saved in all but one "
        "measured case: bench/README.md). Part of the eval protocol, resolved: in bf16 the "
        "summation order can flip a close prediction.",
    )

    # omitted from the spec hash at their defaults: specs written before them hash the same
    _omitted_at: ClassVar[dict[str, tuple]] = {
        "label_search": ("best_first",),  # same argmax
        "shared_prefix": ("auto",),
    }


class SuccessSpec(_Strict):
    metric: str = Field(description="Main metric, e.g. macro_f1, accuracy, field_f1.")
    min_gain: float = Field(description="Required absolute gain over the baseline.")


GUARD_RULES = ("max_drop", "min", "min_gain", "max", "max_rise")


class GuardSpec(_Strict):
    """A must-not-degrade rule. Give exactly one of max_drop, min, min_gain (metrics where
    higher is better) or max, max_rise (rates where lower is better: invalid_rate,
    ungrounded_value_rate)."""

    metric: str = Field(
        description="A metric name, or `per_category.<m>` / `per_field.<m>` for every one."
    )
    max_drop: float | None = Field(None, ge=0, description="base - candidate <= this.")
    min: float | None = Field(None, description="candidate >= this.")
    min_gain: float | None = Field(None, description="candidate - base >= this.")
    max: float | None = Field(None, description="candidate <= this.")
    max_rise: float | None = Field(None, ge=0, description="candidate - base <= this.")

    @model_validator(mode="after")
    def _one_rule(self) -> GuardSpec:
        given = [k for k in GUARD_RULES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a guard needs exactly one of " + ", ".join(GUARD_RULES))
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for key in ("max", "max_rise"):  # unset: left out, so older specs keep their hash
            if out.get(key, 0) is None:
                del out[key]
        return out


class LimitsSpec(_Strict):
    memory_gb: float | None = Field(None, gt=0, description="Peak memory allowed per device.")
    time_hours: float | None = Field(None, gt=0, description="Wall time allowed for one run.")
    usd_per_hour: float = Field(0.0, ge=0, description="Rental price.")
    cost_cap_usd: float | None = Field(None, gt=0)
    rental_days: Literal[3, 7, 30] = 7
    margin: float = Field(0.2, ge=0, description="Safety margin on estimates (fraction).")
    window: str | None = Field(None, description="The agreed operating window, free text.")


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


class PilotSpec(_Strict):
    """The whole pilot.yaml."""

    name: str = Field(description="Pilot name: letters, digits, . _ - (used in paths).")
    hypothesis: str = Field(min_length=1, description="The behaviour to improve, in words.")
    task: TaskSpec
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    adapter: AdapterSpec = Field(default_factory=AdapterSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    success: SuccessSpec | None = None
    guards: list[GuardSpec] = Field(default_factory=list)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    tracking: list[Literal["mlflow", "tensorboard"]] = Field(
        default_factory=list,
        description="Mirror every run to these trackers (optional extras: pip install "
        "'lorapilot[mlflow]' / 'lorapilot[tensorboard]'). The run records stay the source of "
        "truth; `lorapilot sync` mirrors existing ones.",
    )
    variants: list[VariantSpec] = Field(
        default_factory=list,
        description="Pre-registered experiments besides `base` (the recipe as written), run "
        "in order by `lorapilot run`.",
    )
    selection: SelectionSpec = Field(default_factory=SelectionSpec)

    @field_validator("variants")
    @classmethod
    def _unique(cls, v: list[VariantSpec]) -> list[VariantSpec]:
        seen: set[str] = set()
        for i, var in enumerate(v):
            if var.name in seen:
                raise ValueError(f"[{i}].name {var.name!r} is given twice")
            seen.add(var.name)
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be 1-64 of letters, digits, '.', '_', '-' (no path separators)")
        return v

    @field_validator("hypothesis")
    @classmethod
    def _hyp(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must state the behaviour to improve (non-empty)")
        return v

    @model_validator(mode="after")
    def _quantized_base_takes_an_adapter(self) -> PilotSpec:
        if self.model.quantization is None:
            return self
        if self.adapter.method == "full":
            raise ValueError(
                "model.quantization: a quantized base cannot be fine-tuned in full "
                "(adapter.method: full); use adapter.method: lora, or drop the quantization"
            )
        if self.train.distributed == "fsdp":
            raise ValueError(
                "model.quantization: a quantized base is not sharded with FSDP here; use "
                "train.distributed: ddp (each GPU holds the whole quantized base)"
            )
        return self

    @model_validator(mode="after")
    def _category_source(self) -> PilotSpec:
        by = self.data.category
        if by is None:
            return self
        if self.task.labelled:
            raise ValueError("data.category: a classification example's category is its label")
        if by.startswith("target.") and self.task.fields:
            fields: list[FieldSpec] | None = self.task.fields
            for key in by[len("target.") :].split("."):
                field = next((f for f in fields or [] if f.name == key), None)
                if field is None or field.type in ("list", "map"):
                    raise ValueError(
                        f"data.category: {by!r} is not a field path of task.fields (an object's "
                        "fields may be named by dots, e.g. target.intent; lists and maps not)"
                    )
                fields = field.fields
            if fields is not None:
                raise ValueError(f"data.category: {by!r} is an object, not a category value")
        return self

    @model_validator(mode="after")
    def _metrics_exist(self) -> PilotSpec:
        """The success metric and every guard name a metric this task kind produces."""
        from lorapilot.spec.metric_names import problem

        fields = [f.name for f in self.task.fields or []]
        fields += [p for f in self.task.fields or [] for p in f.leaf_paths(f.name) if p != f.name]
        named = [("success.metric", self.success.metric)] if self.success is not None else []
        named += [(f"guards[{i}].metric", g.metric) for i, g in enumerate(self.guards)]
        if self.selection.metric is not None:
            named.append(("selection.metric", self.selection.metric))
        for key, name in named:
            why = problem(name, self.task.kind, self.task.labels, fields, self.task.grounded)
            if why:
                raise ValueError(f"{key}: {why}")
        return self

    @model_validator(mode="after")
    def _defaults_by_task(self) -> PilotSpec:
        if self.task.modality == "image" and "base" not in self.model.model_fields_set:
            self.model.__dict__["base"] = IMAGE_BASE
        if self.success is None:
            metric = "macro_f1" if self.task.labelled else "field_f1"
            object.__setattr__(self, "success", SuccessSpec(metric=metric, min_gain=0.05))
        return self

    @property
    def selection_metric(self) -> str:
        assert self.success is not None
        return self.selection.metric or self.success.metric

    def variant_names(self) -> list[str]:
        """The plan, in order: `base` first."""
        return ["base", *(v.name for v in self.variants)]

    def spec_hash(self) -> str:
        """Hash of the resolved spec, `tracking` held at its default: where runs are mirrored
        changes no result, so switching a tracker on keeps reuse and resume working."""
        resolved = self.model_dump(mode="json")
        resolved["tracking"] = []
        return sha256_json(resolved)


# --------------------------------------------------------------------------- loading


def _loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p in ("function-after", "function-before") or str(p).startswith("function-"):
            continue
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


_FRIENDLY = {
    "greater_than": "must be a positive number",
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


def format_validation_error(err: ValidationError, source: str) -> str:
    """One paragraph naming every bad key path, e.g. `adapter.r: must be a positive integer`."""
    lines = []
    for e in err.errors():
        loc = _loc(e["loc"])
        typ = e["type"]
        msg = e["msg"]
        if typ == "greater_than" and e.get("ctx", {}).get("gt") == 0:
            kind = "integer" if isinstance(e.get("input"), int) else "number"
            msg = f"must be a positive {kind} (got {e.get('input')!r})"
        elif typ == "finite_number":
            msg = f"must be a finite number (got {e.get('input')!r})"
        elif typ in _FRIENDLY:
            msg = _FRIENDLY[typ]
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        lines.append(f"{loc}: {msg}")
    return f"{source}: invalid pilot spec: " + "; ".join(lines)


class _SafeLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases: a billion-laughs YAML must not expand in memory."""

    def compose_node(self, parent, index):  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in a pilot spec", event.start_mark
            )
        return super().compose_node(parent, index)


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{source}:{where} is not valid YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{source}: is not valid YAML: nested too deeply") from None
    except ValueError as e:  # a constructor's own error: an impossible date, `!!int x`
        raise UsageError(f"{source}: is not valid YAML: a value cannot be read ({e})") from None


def spec_from_dict(raw: Any, source: str = "pilot.yaml") -> PilotSpec:
    if not isinstance(raw, dict):
        raise UsageError(
            f"{source}: the pilot spec must be a YAML mapping (key: value), got "
            f"{type(raw).__name__}"
        )
    try:
        return PilotSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(format_validation_error(e, source)) from None


def resolve_pilot(path: str | Path) -> tuple[Path, Path]:
    """PILOT is a folder holding pilot.yaml or the YAML file itself -> (pilot_dir, spec_path)."""
    p = Path(path)
    if p.is_dir():
        spec = p / SPEC_FILENAME
        if not spec.is_file():
            raise UsageError(
                f"{p}: no {SPEC_FILENAME} in this folder (PILOT is a pilot folder or its YAML file)"
            )
        return p.resolve(), spec.resolve()
    if p.is_file():
        return p.parent.resolve(), p.resolve()
    raise UsageError(f"{p}: no such pilot folder or spec file")


MAX_SPEC_BYTES = 1 << 20


def load_spec_file(spec_path: Path) -> tuple[PilotSpec, dict]:
    """Read, parse and validate a spec file -> (spec, raw dict as written)."""
    try:
        size = spec_path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise UsageError(f"{spec_path}: {size} bytes is too large for a pilot spec (max 1 MiB)")
        text = spec_path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UsageError(f"{spec_path}: not valid UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"{spec_path}: cannot read: {e.strerror}") from None
    if "\x00" in text:
        raise UsageError(f"{spec_path}: contains a NUL byte; a pilot spec is a text file")
    raw = parse_yaml(text, str(spec_path))
    spec = spec_from_dict(raw, str(spec_path))
    for i in range(len(spec.variants)):  # every variant is refused now, not when it trains
        variant_of(spec, raw, i, str(spec_path))
    return spec, raw


# --------------------------------------------------------------------------- variants

# Parameter groups for the one-change rule: a variant touching two groups is `combined`.
PARAM_GROUPS = {
    "adapter.r": "rank",
    "adapter.alpha": "rank",
    "adapter.target_modules": "target_modules",
    "adapter.modules_to_save": "target_modules",
    "adapter.dropout": "regularisation",
    "train.weight_decay": "regularisation",
    "train.lr": "learning_rate",
    "train.schedule": "learning_rate",
    "train.warmup_ratio": "learning_rate",
    "train.epochs": "duration",
    "train.max_steps": "duration",
}


def param_group(key: str) -> str:
    if key.startswith("model.quantization"):  # bits, type, compute dtype: one idea, the base
        return "model"
    return PARAM_GROUPS.get(key, key)


def _parse_value(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_SafeLoader)
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


def parse_sets(sets: list[str], source: str = "--set") -> list[tuple[str, Any]]:
    """`key.path=value` strings -> (key, value) pairs, the value read as YAML."""
    pairs = []
    for item in sets:
        if "=" not in item:
            raise UsageError(f"{source} {item!r}: expected KEY=VALUE, e.g. train.lr=1e-4")
        key, _, value = item.partition("=")
        key = key.strip()
        if not _KEY_PATH_RE.fullmatch(key):
            raise UsageError(f"{source} {item!r}: {key!r} is not a key path like train.lr")
        pairs.append((key, _parse_value(value)))
    return pairs


def apply_values(raw: dict, pairs: list[tuple[str, Any]], source: str = "--set") -> dict:
    """A copy of a raw spec dict with each dotted key set to its value."""
    import copy

    out = copy.deepcopy(raw)
    for key, new in pairs:
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            if child is None:
                child = node[p] = {}
            if not isinstance(child, dict):
                raise UsageError(f"{source} {key}: {p!r} is not a section")
            node = child
        node[parts[-1]] = copy.deepcopy(new)
    return out


def apply_overrides(raw: dict, sets: list[str], source: str = "--set") -> tuple[dict, dict]:
    """Apply `key.path=value` overrides to a raw spec dict -> (new raw, diff {key: [old, new]})."""
    pairs = parse_sets(sets, source)
    diff = {key: [_dotted(raw, key), new] for key, new in pairs}
    return apply_values(raw, pairs, source), diff


def resolved_diff(old: PilotSpec, new: PilotSpec, keys: list[str]) -> dict:
    """{key: [old, new]} for each key whose *resolved* value (defaults included) changed; a
    mirror (tracking) is not a change of the recipe."""
    old_d, new_d = old.model_dump(mode="json"), new.model_dump(mode="json")
    diff = {}
    for key in dict.fromkeys(keys):
        a, b = _dotted(old_d, key), _dotted(new_d, key)
        if a != b and key.split(".")[0] != "tracking":
            diff[key] = [a, b]
    return diff


def variant_of(spec: PilotSpec, raw: dict, index: int, source: str) -> tuple[PilotSpec, dict, dict]:
    """Variant `index` of a spec applied -> (its spec, its raw dict, its resolved diff).
    Refused (exit 2, naming `variants[i]`) when it does not validate, changes nothing, or
    changes two parameter groups without a `why:`."""
    v = spec.variants[index]
    where = f"{source}: variants[{index}] ({v.name})"
    raw2 = apply_values(raw, list(v.set.items()), where)
    new = spec_from_dict(raw2, where)
    diff = resolved_diff(spec, new, list(v.set))
    if not diff:
        raise UsageError(f"{where}: changes nothing: every key it sets already has that value")
    if variant_label(diff) == "combined" and not (v.why or "").strip():
        groups = sorted({param_group(k) for k in diff})
        raise UsageError(
            f"{where}: changes {len(groups)} parameter groups ({', '.join(groups)}): a combined "
            "variant must say why in `why:`, or be split into one-change variants"
        )
    return new, raw2, diff


def variant_label(diff: dict) -> str:
    """`base` (no change), `one_change` (one parameter group) or `combined`."""
    if not diff:
        return "base"
    groups = {param_group(k) for k in diff}
    return "one_change" if len(groups) == 1 else "combined"


def json_schema() -> dict:
    schema = PilotSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "lorapilot pilot.yaml"
    return schema


class Pilot:
    """A loaded pilot: its folder, spec file, validated spec and the raw mapping as written."""

    def __init__(
        self,
        dir: Path,
        spec_path: Path,
        spec: PilotSpec,
        raw: dict,
        diff: dict | None = None,
        variant: str | None = "base",
    ):
        self.dir = dir
        self.spec_path = spec_path
        self.spec = spec
        self.raw = raw
        self.diff = diff or {}
        self.variant = variant
        """The plan's variant this pilot runs (`base`: the spec as written), or None for
        ad-hoc `--set` overrides, which no plan pre-registered."""

    @property
    def runs_dir(self) -> Path:
        return self.dir / "runs"

    def path(self, relative: str, key: str) -> Path:
        """Resolve a data path from the spec; it must stay inside the pilot folder."""
        p = Path(relative)
        if p.is_absolute():
            raise UsageError(
                f"{self.spec_path}: {key}: {relative!r} must be a path relative to the pilot folder"
            )
        full = (self.dir / p).resolve()
        if not full.is_relative_to(self.dir):
            raise UsageError(
                f"{self.spec_path}: {key}: {relative!r} points outside the pilot folder {self.dir}"
            )
        return full


def _dotted(d: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def load_pilot(
    path: str | Path, sets: list[str] | None = None, variant: str | None = None
) -> Pilot:
    """PILOT (folder or YAML) -> validated Pilot, with `--set` overrides applied and recorded,
    or one of the spec's pre-registered `variants` (`base`: the spec as written)."""
    pilot_dir, spec_path = resolve_pilot(path)
    spec, raw = load_spec_file(spec_path)
    diff: dict = {}
    name: str | None = "base"
    if variant is not None:
        if sets:
            raise UsageError(
                f"--variant {variant} with --set: a pre-registered variant runs as written; "
                "add another variant to pilot.yaml instead"
            )
        names = spec.variant_names()
        if variant not in names:
            raise UsageError(
                f"--variant {variant!r}: {spec_path} has no such variant (plan: {', '.join(names)})"
            )
        if variant != "base":
            spec, raw, diff = variant_of(spec, raw, names.index(variant) - 1, str(spec_path))
        name = variant
    elif sets:
        pairs = parse_sets(sets)
        raw2 = apply_values(raw, pairs)
        new_spec = spec_from_dict(raw2, f"{spec_path} with --set {' '.join(sets)}")
        diff = resolved_diff(spec, new_spec, [key for key, _ in pairs])
        spec, raw = new_spec, raw2
        name = None if diff else "base"
    if spec.model.quantization is not None:  # refused now, not after the data is prepared
        from lorapilot.spec.requirements import require_quantization

        require_quantization(spec.model.quantization, str(spec_path))
    if spec.tracking:  # a tracker whose package is missing is refused now, not after training
        from lorapilot.spec.requirements import require_trackers

        require_trackers(spec.tracking, str(spec_path))
    return Pilot(pilot_dir, spec_path, spec, raw, diff, name)


def require_text(pilot: Pilot, what: str) -> None:
    """What is not built for images (export, a text model) refuses an image pilot up front
    instead of reading its image paths as text."""
    if pilot.spec.task.modality == "image":
        raise UsageError(
            f"{pilot.spec_path}: task.kind: image_classification: {what} is not available for "
            "image pilots yet (check, data, inspect, baseline, smoke, probe, budget, train, "
            "verify, eval, compare, report and run are)"
        )
