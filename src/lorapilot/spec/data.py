"""Where the data comes from and how it becomes splits: files or an HF dataset, the field
mapping, cleaning, the split, the sample, lengths and the leak policy."""

from __future__ import annotations

import re
import string
from typing import Annotated, ClassVar, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from lorapilot.spec.common import CLEANING_RULES, _known_names, _Strict


class FieldMap(_Strict):
    """Column names of the data, for sets whose columns are named otherwise."""

    text: str = Field("text", description="Column holding the input text.")
    image: str = Field(
        "image", description="Column holding the image path, relative to the pilot folder."
    )
    label: str = Field("label", description="Column holding the label (classification).")
    target: str = Field("target", description="Column holding the target object (extraction).")
    id: str | None = Field("id", description="Column holding a stable example id, if any.")
    text_template: str | None = Field(
        None,
        description="The input text built from several columns, each named in braces: "
        "'Subject: {subject}\\n\\n{body}' (in place of `text`). A column that is empty or "
        "null in a row leaves its place empty, and the `data` report counts such rows per "
        "column; a row whose columns are all empty is invalid. `{{` and `}}` are literal "
        "braces.",
    )

    image_template: str | None = Field(
        None,
        description="image_classification: the image path built from columns, each named in "
        "braces, for a table that names each image by an id: 'images/{image_id}.jpg' (in "
        "place of `image`; relative to the pilot folder, as `image` is). A row with an "
        "empty column is invalid.",
    )
    messages: str | None = Field(
        None,
        description="Column holding a chat conversation, as OpenAI's and TRL's fine-tuning "
        "data write it (a list of {role, content}; a JSON string in a CSV cell), or ShareGPT's "
        "(FastChat, axolotl: {from: human|gpt|system, value}), in place of "
        "`text` and `label`/`target`: its last user turn is the input text, its last "
        "assistant turn the answer (the label; the labels separated by label_separator; the "
        "target as JSON), the turns before the last user turn earlier turns the prompt holds "
        "as said (the loss is on the answer alone). A system turn is not used, the spec's "
        "task.system is the prompt: `data` counts the rows whose system turn differs from it. "
        "User and assistant turns in turn from a user turn (after an optional system turn), "
        "ending with the answer (inputs to predict: with the last user turn); another shape "
        "is an invalid row.",
    )
    label_separator: str = Field(
        ",",
        min_length=1,
        description="multi_label_classification: what separates the labels of a label cell "
        "given as text (a CSV cell `anger,sadness`); a JSON list is read as it is.",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {
        "image": ("image",),
        "text_template": (None,),
        "image_template": (None,),
        "messages": (None,),
        "label_separator": (",",),
    }

    @field_validator("text_template", "image_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            template_parts(v)
        return v

    # (Both refusals compare with the defaults, not the keys set: a dumped spec, as run
    # records and adapter manifests hold it, writes every default out and must validate.)
    @model_validator(mode="after")
    def _one_text(self) -> FieldMap:
        if self.text_template is not None and self.text != "text":
            raise ValueError(
                "set text (one column) or text_template (several), not both: the template "
                "names its columns itself"
            )
        if self.image_template is not None and self.image != "image":
            raise ValueError(
                "set image (a column of paths) or image_template (a path built from columns), "
                "not both"
            )
        return self

    @model_validator(mode="after")
    def _messages_alone(self) -> FieldMap:
        defaults = {"text": "text", "label": "label", "target": "target", "text_template": None}
        both = sorted(k for k, v in defaults.items() if getattr(self, k) != v)
        if self.messages is not None and both:
            raise ValueError(
                f"messages holds the input and the answer; set it or {', '.join(both)}, not both"
            )
        return self

    def input_columns(self, modality: str) -> list[str]:
        """The columns the input is read from: the image path; the conversation; the text
        column, or the columns text_template names, in order, once each."""
        if modality == "image":
            if self.image_template is not None:
                return list(dict.fromkeys(c for _, c in template_parts(self.image_template) if c))
            return [self.image]
        if self.messages is not None:
            return [self.messages]
        if self.text_template is None:
            return [self.text]
        return list(dict.fromkeys(c for _, c in template_parts(self.text_template) if c))


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """(literal text, column name or None) pairs of a data.fields.text_template. Column names
    are taken whole (`{Review Text}`, `{a.b}`: no attribute or index lookup); a conversion or
    format spec is refused, as is a template that names no column."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(
            f"{e} (write a column as {{name}}, a literal brace as {{{{ or }}}})"
        ) from None
    parts: list[tuple[str, str | None]] = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (spec or conversion):
            shown = f"{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}"
            raise ValueError(
                f"{{{shown}}}: write a column as {{name}}, with no format spec or conversion "
                "(a column whose name holds ':' or '!' cannot be named here; rename it)"
            )
        if name is not None and not name.strip():
            raise ValueError("{}: every placeholder names a column, e.g. {body}")
        parts.append((literal, name))
    if not any(name for _, name in parts):
        raise ValueError("names no column: write each column in braces, e.g. '{title}\\n{body}'")
    return parts


class SplitSpec(_Strict):
    """The split of a single data file into train, validation and test."""

    seed: int = Field(0, description="Seed of the stratified split.")
    val: float = Field(0.15, gt=0, lt=1, description="Fraction for validation.")
    test: float = Field(0.15, ge=0, lt=1, description="Fraction reserved for the final test.")
    group: str | None = Field(
        None,
        description="Column whose value keeps examples together: every example of a group (a "
        "customer, a patient, a photographer, a source document) goes to the same split, so no "
        "validation or test example shares its origin with a training one. Pre-split files: "
        "groups found in two splits are reported.",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {"group": (None,)}

    @model_validator(mode="after")
    def _sum(self) -> SplitSpec:
        if self.val + self.test >= 0.9:
            raise ValueError("val + test must leave at least 10% for train")
        return self


class DataFiles(_Strict):
    """Pre-split files or folders, relative to the pilot folder."""

    train: str = Field(
        description="Training file (JSONL, CSV) or folder; a pattern (`data/train-*.parquet`, "
        "the shards a dataset is published in) reads every file it matches, in name order, "
        "as does one for val or test. Ids must be unique across all the files."
    )
    val: str | None = Field(
        None,
        description="Validation file; without it a stratified, seeded `data.split.val` "
        "fraction of train is held out (e.g. a public set with only train and test files).",
    )
    test: str | None = Field(
        None, description="Test file, reserved for the final test; without it there is none."
    )


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

    train: int | float | None = Field(
        None, description="Training examples kept: a count or a fraction."
    )
    val: int | float | None = Field(
        None, description="Validation examples kept: a count or a fraction."
    )
    test: int | float | None = Field(None, description="Test examples kept: a count or a fraction.")

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
    """Where the data comes from, with what permission, and how it becomes versioned splits."""

    source: str | None = Field(None, description="Where the data comes from.")
    permission: str | None = Field(
        None, description="The permission to use it: a licence or an internal approval."
    )
    file: str | None = Field(
        None,
        description="One file to split into train/val/test, or a folder written by `datasets` "
        "save_to_disk: a Dataset is split, a DatasetDict's train/validation(/test) are used as "
        "they are. A pattern (`data/part-*.parquet`) reads every file it matches, in name "
        "order.",
    )
    files: DataFiles | None = Field(
        None, description="Pre-split files (or save_to_disk Dataset folders), used as they are."
    )
    hf_dataset: HFDataset | None = Field(
        None, description="A dataset in the local HF datasets cache, by name, offline."
    )
    format: Literal["auto", "jsonl", "csv", "parquet", "datasets"] = Field(
        "auto",
        description="auto: by extension (.jsonl/.ndjson/.json: JSON Lines, or a .json file "
        "holding one JSON array of records; .csv; .parquet); a save_to_disk folder is recognised "
        "by its metadata.",
    )
    fields: FieldMap = Field(
        default_factory=FieldMap, description="Which columns of the data hold the input and target."
    )
    cleaning: list[str] = Field(
        default_factory=lambda: ["unicode_nfc", "strip", "collapse_whitespace", "drop_empty"],
        description=f"Cleaning rules by name, applied in order: {', '.join(CLEANING_RULES)}.",
    )
    max_chars: int | None = Field(None, gt=0, description="Limit for the `max_chars` rule.")
    split: SplitSpec = Field(
        default_factory=SplitSpec, description="The seeded, stratified split of a single file."
    )
    max_length: Annotated[int, Field(ge=16)] | Literal["auto"] = Field(
        "auto",
        description="Max tokens of prompt + answer; auto: the model's context (config.json's "
        "max_position_embeddings), so no example is cut unless it is longer; the data report "
        "says the longest example.",
    )
    truncation: Literal["fail", "allow"] = Field(
        "fail",
        description="An input cut by max_length: fail (`data` exits 1 naming the examples and "
        "the length that fits them all) or allow (trained and evaluated cut, counted per split "
        "and category in the data report).",
    )
    truncation_side: Literal["left", "right"] = Field(
        "left", description="Which end of the *input text* is cut when too long."
    )
    on_error: Literal["fail", "skip"] = Field("fail", description="Policy for invalid records.")
    unlisted_labels: Literal["fail", "drop"] = Field(
        "fail",
        description="Classification: an example whose label is not in task.labels: fail "
        "(exit 2 naming it) or drop (left out on purpose, counted per label in the data report; "
        "e.g. a public set's 'Not sure' or rare classes outside the pilot's labels).",
    )
    on_truncated_target: Literal["fail", "exclude"] = Field(
        "exclude", description="A target that would be cut is never cut silently."
    )
    leakage: Literal["fail", "drop_from_train", "together", "warn"] = Field(
        "fail",
        description="Policy for duplicates between train and val/test. fail: `data` exits 1 "
        "naming the pairs; drop_from_train: the train row of each pair is left out, counted; "
        "together: where lorapilot splits (one file, or val out of a train file), each set of "
        "exact and near duplicates is found first and kept whole in one split, so none leaks "
        "(pairs across files you split yourself still fail); warn: kept, listed as a warning.",
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
        "unlisted_labels": ("fail",),
    }
