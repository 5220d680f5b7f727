"""Inputs to predict (`lorapilot predict --input FILE`): a file read as the pilot's own data is
read (the spec's fields, formats, `data.on_error`, the cleaning rules; image paths relative
to the pilot folder), except that a label or target is optional: a row that has one is
checked as in the pilot's data and scored, one without is only predicted. Whatever is set
aside (a bad row under `on_error: skip`, a text empty after cleaning) is counted and named,
and every input found in one of the pilot's own splits is named by split: a prediction on a
training example says nothing new, and one on the reserved test split is not a test result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapilot.data.clean import clean_records
from lorapilot.data.dedup import normalize_for_dedup
from lorapilot.data.load import load_records
from lorapilot.data.rows import Record, Skipped, answer_of, conversation_text, skipped_summary
from lorapilot.errors import UsageError
from lorapilot.fsutil import sha256_file, sha256_tree
from lorapilot.spec import Pilot

SHOWN_IDS = 20  # ids listed per overlap or cut, the counts are whole


@dataclass
class Inputs:
    path: Path
    sha256: str
    records: list[Record]
    skipped: list[Skipped] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)  # empty after cleaning

    def record(self) -> dict[str, Any]:
        """What the run record keeps of the input file."""
        return {
            "file": str(self.path),
            "sha256": self.sha256,
            "n": len(self.records),
            "n_with_answer": sum(answer_of(r) is not None for r in self.records),
            "skipped": len(self.skipped),
            "skipped_by_problem": skipped_summary(self.skipped),
            "dropped": self.dropped,
        }


def read_inputs(
    pilot: Pilot, path: Path, field_name: str | None = None, answer_field: str | None = None
) -> Inputs:
    """The file's rows as records; `field_name`: the column holding the input text (images:
    the image path), `answer_field` the one holding the label or target, when they are not
    the ones data.fields names."""
    spec = pilot.spec
    data = spec.data
    renamed = {}
    if field_name and data.fields.text_template is not None:
        raise UsageError(
            f"--field {field_name}: the pilot builds its input from the columns "
            f"data.fields.text_template names ({', '.join(data.fields.input_columns('text'))}); "
            "the input file must have those columns"
        )
    if answer_field and data.fields.messages and not field_name:
        raise UsageError(
            f"--answer-field {answer_field}: the pilot reads inputs and answers from the "
            f"conversations in {data.fields.messages!r} (data.fields.messages); to read a file "
            "of plain columns, give --field NAME for its input too"
        )
    if field_name:
        renamed["image" if spec.task.modality == "image" else "text"] = field_name
        renamed["messages"] = None  # the named column, not a conversation, is the input
        renamed["image_template"] = None  # a column of paths, not ids in the pilot's path
    if answer_field:
        renamed["label" if spec.task.labelled else "target"] = answer_field
    if renamed:
        data = data.model_copy(update={"fields": data.fields.model_copy(update=renamed)})
    path = Path(path)
    shown = str(path)
    if path.is_dir():
        from lorapilot.data import hf

        kind = hf.saved_kind(path)
        if kind == "dataset_dict":
            names = sorted(p.name for p in path.iterdir() if hf.saved_kind(p) == "dataset")
            raise UsageError(
                f"{path}: --input holds a DatasetDict (splits: {', '.join(names)}); give one "
                f"split's folder, e.g. {path / (names[0] if names else 'test')}"
            )
        if kind is None and spec.task.modality != "image":
            raise UsageError(
                f"{path}: --input must be a JSONL, CSV or Parquet file, or a folder "
                "datasets' save_to_disk wrote for one split"
            )
        if kind is None:  # a folder of images: their paths are the pilot folder's
            shown = _in_pilot(pilot, path)
    column = data.fields.input_columns(spec.task.modality)[0]
    try:
        records, skipped = load_records(
            path, spec.task, data, display_path=shown, key="--input",
            pilot_dir=pilot.dir, answers=False,
        )  # fmt: skip
    except UsageError as e:
        templated = data.fields.text_template is not None
        if f"{column!r}" in str(e) and not field_name and not templated:
            raise UsageError(f"{e} (--field NAME reads the inputs from another column)") from None
        raise
    dropped: list[dict] = []
    if spec.task.modality == "image":
        from lorapilot.data.images import attach_images

        records, more = attach_images(records, pilot.dir, spec.task, data)
        skipped += more
    else:
        records, dropped = clean_records(records, data.cleaning, data.max_chars)
    if not records:
        raise UsageError(
            f"{path}: no input to predict ({len(skipped)} rows set aside, {len(dropped)} empty "
            "after cleaning)"
        )
    return Inputs(path, _digest(path), records, skipped, dropped)


def _in_pilot(pilot: Pilot, path: Path) -> str:
    """A folder of images as a path relative to the pilot folder, as image paths are
    written (a pilot folder holds its images, so that it can be copied whole)."""
    root = pilot.dir.resolve()
    full = path.resolve()
    if not full.is_relative_to(root):
        raise UsageError(
            f"{path}: a folder of images to predict must be inside the pilot folder {root} "
            "(image paths are the pilot folder's); copy it there"
        )
    return full.relative_to(root).as_posix()


def _digest(path: Path) -> str:
    """A file's sha256; a save_to_disk folder's: of its arrow files, as its data version has;
    a folder of images: of every file's path and bytes."""
    if path.is_file():
        return sha256_file(path)
    from lorapilot.data.hf import arrow_hash, saved_kind, saved_tables

    if saved_kind(path):
        return arrow_hash(saved_tables(path, str(path), "--input", None))
    return sha256_tree(path)


def overlap(inputs: list[Record], splits: dict[str, list[Record]]) -> dict[str, Any]:
    """The inputs that are examples of the pilot's own splits (the same text once normalised
    as the duplicate check normalises it; images: the same pixels), by split."""

    def key(r: Record) -> str:
        if r.image is not None:
            return r.image.pixel_hash
        return normalize_for_dedup(conversation_text(r))

    where: dict[str, str] = {}
    for split, recs in splits.items():
        for r in recs:
            where.setdefault(key(r), split)
    found: dict[str, list[str]] = {}
    for r in inputs:
        split = where.get(key(r))
        if split is not None:
            found.setdefault(split, []).append(r.id)
    return {split: {"n": len(ids), "ids": ids[:SHOWN_IDS]} for split, ids in sorted(found.items())}
