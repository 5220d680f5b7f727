"""The data path every verb shares: load -> clean -> split -> duplicates/leaks -> version.

`prepare_data` is deterministic: the same files and spec give the same splits and the same
version id, so `baseline`, `train`, `verify` and the final test all see the data `data` saw.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapilot.data.clean import clean_records
from lorapilot.data.dedup import DupItem, DupReport, find_duplicates
from lorapilot.data.format import Encoded, PromptFormatter, answer_text, template_hash
from lorapilot.data.load import load_records
from lorapilot.data.rows import Record, Skipped, conversation_text, skipped_summary
from lorapilot.data.source import file_sources
from lorapilot.data.split import (
    SPLITS,
    category_counts,
    label_counts,
    multi_label_strata,
    sample_records,
    split_groups,
    split_records,
)
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.fsutil import sha256_file, sha256_json, sha256_tree
from lorapilot.spec import Pilot


@dataclass
class PreparedData:
    """The cleaned, split, leak-checked records of a pilot and what was removed on the way."""

    splits: dict[str, list[Record]]
    skipped: list[Skipped]
    dropped: list[dict]
    duplicates: DupReport
    leak_dropped: list[dict] = field(default_factory=list)
    target_excluded: list[dict] = field(default_factory=list)
    version: str = ""
    answer_budget: int = 0
    answer_room: int = 0  # the longest answer's completion tokens, even where it cannot fit
    labels: list[str] | None = None  # a multi-label task's: counts() are per label

    def counts(self) -> dict[str, dict[str, int]]:
        """{split: {category: examples}}; for a multi-label task {split: {label: examples
        carrying it}} (its categories are strata, the rarest label of each example)."""
        if self.labels is not None:
            return label_counts(self.splits, self.labels)
        return category_counts(self.splits)


def load_all(pilot: Pilot) -> tuple[list[Record], list[Skipped]]:
    """Read the spec's data: one file to split, pre-split files, or an HF dataset (a saved
    folder in data.file/files, or data.hf_dataset from the local cache)."""
    spec = pilot.spec
    data = spec.data
    if data.hf_dataset:
        from lorapilot.data.hf import load_cached

        return load_cached(data.hf_dataset, spec.task, data, pilot.dir)
    records: list[Record] = []
    skipped: list[Skipped] = []
    for key, rel, split in file_sources(pilot):
        path = pilot.path(rel, key)
        recs, skips = load_records(
            path, spec.task, data, split=split, display_path=rel, key=key, pilot_dir=pilot.dir
        )
        records += recs
        skipped += skips
    _unique_ids(pilot, records)
    if spec.task.modality == "image":
        from lorapilot.data.images import attach_images

        records, skips = attach_images(records, pilot.dir, spec.task, data)
        skipped += skips
    return records, skipped


def _unique_ids(pilot: Pilot, records: list[Record]) -> None:
    """One id, one example, across every data file (a file checks its own rows): an id is
    how predictions, leaks, label reviews and reports name an example, and two files that
    number their rows alike (train.jsonl and test.jsonl both from `1`) would merge two."""
    first: dict[str, str] = {}
    for r in records:
        seen = first.setdefault(r.id, r.source)
        if seen != r.source:
            raise UsageError(
                f"{pilot.spec_path}: data: the id {r.id!r} names two examples, {seen} and "
                f"{r.source}: ids must be unique across the data files; give each file's ids "
                "a prefix of their own, or set data.fields.id: null to name every example by "
                "its file and line"
            )


def source_hashes(pilot: Pilot, datasets_only: bool = False) -> dict[str, str]:
    """sha256 of every data input: a file's bytes; for an HF dataset, its arrow files.
    `datasets_only` leaves plain files out (the data version hashes their records)."""
    data = pilot.spec.data
    if data.hf_dataset:
        from lorapilot.data.hf import arrow_hash, cache_tables

        name = data.hf_dataset.name + (
            f"/{data.hf_dataset.config}" if data.hf_dataset.config else ""
        )
        return {f"hf_dataset:{name}": arrow_hash(cache_tables(data.hf_dataset, pilot.dir))}
    out: dict[str, str] = {}
    for key, rel, split in file_sources(pilot):
        path = pilot.path(rel, key)
        if path.is_dir():
            from lorapilot.data.hf import arrow_hash, saved_kind, saved_tables

            if saved_kind(path):
                out[rel] = arrow_hash(saved_tables(path, rel, key, split))
                continue
            if not datasets_only:  # an image folder: every file's path and bytes
                out[rel] = sha256_tree(path)
            continue
        if not datasets_only:
            out[rel] = sha256_file(path)
    return out


PairsOf = Callable[[dict[str, list[Record]]], DupReport]
"""The duplicate pairs among the records of some splits (texts or images)."""


def text_pairs(pilot: Pilot) -> PairsOf:
    data = pilot.spec.data
    return _remembered(
        lambda splits: find_duplicates(
            [DupItem(r.id, s, conversation_text(r)) for s, recs in splits.items() for r in recs],
            threshold=data.near_dup_threshold,
            seed=data.split.seed,
        )
    )


def _remembered(pairs_of: PairsOf) -> PairsOf:
    """`pairs_of` that answers the same splits once: the split `data.leakage: together`
    checked last is, unsampled, the one the leak check searches again."""
    last: dict[tuple, DupReport] = {}

    def pairs(splits: dict[str, list[Record]]) -> DupReport:
        key = tuple((s, tuple(r.id for r in recs)) for s, recs in splits.items())
        if key not in last:
            last.clear()
            last[key] = pairs_of(splits)
        return last[key]

    return pairs


TOGETHER_ROUNDS = 5
"""Splits `data.leakage: together` tries before it leaves a leak to the leak check."""


def _kept_together(pilot: Pilot, pairs_of: PairsOf) -> Callable:
    """`split(records, seed, val, test)` that keeps each set of duplicates (pairs joined
    transitively), and each data.split.group where one is set, whole in one split.

    The search before the split cannot promise every pair: in a large bucket of look-alike
    texts it pairs each text with a few anchors only (dedup.ANCHORS), and the search after
    the split, anchored per split, can find a pair it missed (FastChat's templated chats:
    187 of them). So the split is checked and, while a pair crosses it, that pair is joined
    and the split made again."""
    group_column = pilot.spec.data.split.group

    def split(records: list[Record], seed: int, val: float, test: float) -> dict:
        parent = {r.id: r.id for r in records}

        def root(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def join(a: str, b: str) -> None:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)

        found = pairs_of({"all": records})
        for p in found.exact + found.near:
            join(p.a_id, p.b_id)
        if group_column:
            first: dict[str, str] = {}
            for r in records:
                join(r.id, first.setdefault(str(r.group), r.id))
        for _ in range(TOGETHER_ROUNDS):
            out = split_groups(records, seed, val, test, key=lambda r: root(r.id))
            crossing = pairs_of(out).cross_split()
            for p in crossing:
                join(p.a_id, p.b_id)
            if not crossing:
                break
        return out

    return split


def _split(
    pilot: Pilot, records: list[Record], pairs_of: PairsOf | None = None
) -> dict[str, list[Record]]:
    data = pilot.spec.data
    split = split_groups if data.split.group else split_records
    if data.leakage == "together" and pairs_of is not None:
        split = _kept_together(pilot, pairs_of)
    if data.split.group and any(r.group is None for r in records):
        raise UsageError(
            f"data.split.group: {data.split.group!r} is a column, and an image folder has "
            "none; list the images in a JSONL or CSV file with that column (data.file), or "
            "remove data.split.group"
        )
    # Records carry a split when their source was pre-split (data.files, a DatasetDict, or
    # the train/validation splits of data.hf_dataset); otherwise lorapilot splits them.
    if not data.files and not any(r.split for r in records):
        return split(records, data.split.seed, data.split.val, data.split.test)
    out: dict[str, list[Record]] = {s: [] for s in SPLITS}
    for r in records:
        out[r.split or "train"].append(r)
    if data.files is not None and data.files.val is None and not out["val"]:
        # train + (official) test files: validation comes out of train, stratified and
        # seeded like a whole-file split; the given test split stays as it is
        carved = split(out["train"], data.split.seed, data.split.val, 0.0)
        out["train"], out["val"] = carved["train"], carved["val"]
    return out


def require_examples(splits: dict[str, list[Record]], skipped: list[Skipped]) -> None:
    """No training or no validation example left is bad input (exit 2), said with what was
    set aside on the way: a pilot on nothing must not pass as a pilot."""
    empty = [s for s in ("train", "val") if not splits.get(s)]
    if not empty:
        return
    sizes = ", ".join(f"{s} {len(splits.get(s) or [])}" for s in SPLITS)
    why = ""
    if skipped:
        top = "; ".join(f"{g['count']} x {g['problem']}" for g in skipped_summary(skipped)[:3])
        why = f"; {len(skipped)} record(s) were set aside: {top}"
    raise UsageError(
        f"data: no {' and no '.join(empty)} examples left ({sizes}){why}. Fix the data or "
        "the spec (task.labels, data.fields, data.on_error, data.unlisted_labels, data.split, "
        "data.sample) so that both splits keep examples"
    )


def group_report(pilot: Pilot, splits: dict[str, list[Record]]) -> dict[str, Any] | None:
    """data.split.group's outcome: groups per split, the largest ones, and groups found in
    more than one split (only pre-split sources can have them: they leak, as duplicates do)."""
    column = pilot.spec.data.split.group
    if not column:
        return None
    where: dict[str, dict[str, int]] = {}
    for s, recs in splits.items():
        for r in recs:
            if r.group is not None:
                where.setdefault(r.group, {}).setdefault(s, 0)
                where[r.group][s] += 1
    shared = sorted(g for g, at in where.items() if len(at) > 1)
    largest = sorted(where, key=lambda g: (-sum(where[g].values()), g))[:5]
    return {
        "column": column,
        "n_groups": len(where),
        "per_split": {s: sum(1 for at in where.values() if s in at) for s in SPLITS},
        "largest": [{"group": g, "n": sum(where[g].values()), "splits": where[g]} for g in largest],
        "shared": [{"group": g, "splits": where[g]} for g in shared],
    }


def data_version(pilot: Pilot, splits: dict[str, list[Record]], tmpl_hash: str) -> str:
    """Hash of the cleaned records per split, the cleaning rules, split parameters and prompt."""
    data = pilot.spec.data
    payload = {
        "records": {
            # a conversation's earlier turns are part of its input (only where there are
            # some, so a pilot without them keeps the version it had)
            s: [
                [r.id, r.text, r.label, r.target, *([r.context] if r.context else [])]
                for r in sorted(recs, key=lambda r: r.id)
            ]
            for s, recs in splits.items()
        },
        "cleaning": data.cleaning,
        "max_chars": data.max_chars,
        "split": data.split.model_dump(),
        **({"sample": data.sample.model_dump()} if data.sample is not None else {}),
        "max_length": data.max_length,
        "truncation_side": data.truncation_side,
        "template": tmpl_hash,
    }
    arrow = source_hashes(pilot, datasets_only=True)
    if arrow:  # only for HF datasets: the versions of plain files stay what they were
        payload["arrow_files"] = arrow
    return "dv-" + sha256_json(payload)[:16]


def _split_and_sample(
    pilot: Pilot, records: list[Record], skipped: list[Skipped], pairs_of: PairsOf | None = None
) -> dict[str, list[Record]]:
    data = pilot.spec.data
    splits = _split(pilot, records, pairs_of)
    if data.sample is not None:
        for name, size in data.sample.model_dump().items():
            if size is not None and splits.get(name):
                seed = f"{data.split.seed}:sample:{name}"
                splits[name] = sample_records(splits[name], size, seed)
    require_examples(splits, skipped)
    return splits


def _drop_leaks_from_train(
    pilot: Pilot, splits: dict[str, list[Record]], dups: DupReport
) -> list[dict]:
    """Under `leakage: drop_from_train`, remove the train side of every cross-split pair
    (in place) -> the rows removed."""
    leaks = dups.cross_split()
    if not leaks or pilot.spec.data.leakage != "drop_from_train":
        return []
    drop_ids = set()
    for p in leaks:
        for rid, split in ((p.a_id, p.a_split), (p.b_id, p.b_split)):
            if split == "train":
                drop_ids.add(rid)
    dropped = [{"id": r.id, "source": r.source} for r in splits["train"] if r.id in drop_ids]
    splits["train"] = [r for r in splits["train"] if r.id not in drop_ids]
    return dropped


def prepare_image_data(
    pilot: Pilot, pipeline: dict[str, Any], *, enforce_leakage: bool = True
) -> PreparedData:
    """The image path: load and open every image, split, sample, find equal and near-equal
    images, apply the leakage policy, version. No text cleaning (the inputs are paths); the
    version hashes each image's bytes and the resolved transform `pipeline`."""
    from lorapilot.data.imagededup import ImageItem, find_image_duplicates

    data = pilot.spec.data
    records, skipped = load_all(pilot)

    @_remembered
    def pairs_of(split: dict[str, list[Record]]) -> DupReport:
        items = [
            ImageItem(r.id, s, r.image.pixel_hash, r.image.phash, r.image.thumb)
            for s, recs in split.items()
            for r in recs
            if r.image is not None
        ]
        return find_image_duplicates(items, max_bits=data.near_dup_bits)

    splits = _split_and_sample(pilot, records, skipped, pairs_of)
    dups = pairs_of(splits)
    prepared = PreparedData(
        splits=splits,
        skipped=skipped,
        dropped=[],
        duplicates=dups,
        leak_dropped=_drop_leaks_from_train(pilot, splits, dups),
    )
    prepared.version = image_data_version(pilot, splits, pipeline)
    if enforce_leakage:
        check_leakage(pilot, prepared)
    return prepared


def image_data_version(
    pilot: Pilot, splits: dict[str, list[Record]], pipeline: dict[str, Any]
) -> str:
    """Hash of each split's records (id, path, label, image bytes' sha256), the split and
    sample parameters, the duplicate rule and the transform pipeline."""
    from lorapilot.data.images import PIXEL_RULES, pixel_rules_apply

    data = pilot.spec.data
    payload = {
        "records": {
            s: [
                [r.id, r.text, r.label, r.image.sha256 if r.image else None]
                for r in sorted(recs, key=lambda r: r.id)
            ]
            for s, recs in splits.items()
        },
        "split": data.split.model_dump(),
        **({"sample": data.sample.model_dump()} if data.sample is not None else {}),
        "near_dup_bits": data.near_dup_bits,
        "pipeline": pipeline,
    }
    if any(
        r.image is not None and pixel_rules_apply(r.image) for recs in splits.values() for r in recs
    ):  # only where they change what the model sees, so other versions stay what they were
        payload["pixel_rules"] = PIXEL_RULES
    return "dv-" + sha256_json(payload)[:16]


def prepare_data(pilot: Pilot, tokenizer: Any, *, enforce_leakage: bool = True) -> PreparedData:
    """Load, clean, split, find duplicates, apply the leakage and truncation policies.

    A cross-split duplicate under `leakage: fail` raises CheckFailed (exit 1) listing the pairs,
    unless `enforce_leakage` is False (the `data` verb records the report before failing).
    """
    spec = pilot.spec
    data = spec.data
    records, skipped = load_all(pilot)
    records, dropped = clean_records(records, data.cleaning, data.max_chars)
    if spec.task.multi_label:
        records = multi_label_strata(records, list(spec.task.labels or []))
    pairs_of = text_pairs(pilot)
    splits = _split_and_sample(pilot, records, skipped, pairs_of)
    dups = pairs_of(splits)
    leak_dropped = _drop_leaks_from_train(pilot, splits, dups)

    fmt = formatter_for(pilot, tokenizer)
    answers = [answer_text(spec.task, r.label, r.target) for recs in splits.values() for r in recs]
    if spec.task.kind == "classification":
        answers += list(spec.task.labels or [])
    budget = room = fmt.answer_budget_for(answers) if answers else 0
    target_excluded: list[dict] = []
    prompt = len(fmt._ids(fmt.prompt_text("")))
    if prompt + 2 > fmt.max_length:  # not one input token and one answer token would fit
        parts = (
            "task.system, task.template and the labels they list"
            if spec.task.labels
            else ("task.system and task.template")
        )
        raise CheckFailed(
            f"data.max_length={data.max_length} is shorter than the prompt alone: {parts} take "
            f"{prompt} tokens before any input. Set data.max_length "
            f"to at least {prompt + budget + 1} plus the longest input (`lorapilot data` then "
            "names any input it cuts), or shorten task.system"
        )
    if fmt.max_length - budget < prompt:
        msg = (
            f"data.max_length={data.max_length} leaves no room for the input text: the prompt "
            "template "
            f"alone plus the longest answer ({budget} tokens) exceed it"
        )
        if data.on_truncated_target == "fail":
            raise CheckFailed(msg)
        # exclude: drop the examples whose own answer cannot fit, keep a budget that fits
        keep_budget = fmt.max_length - prompt - 1
        for s in SPLITS:
            kept = []
            for r in splits.get(s, []):
                enc = fmt.encode(
                    r.text, answer_text(spec.task, r.label, r.target), keep_budget, r.context
                )
                if enc.target_truncated:
                    target_excluded.append({"id": r.id, "split": s, "source": r.source})
                else:
                    kept.append(r)
            splits[s] = kept
        budget = keep_budget
        empty = [s for s in ("train", "val") if not splits.get(s)]
        if empty:
            raise CheckFailed(
                f"data: no {' and no '.join(empty)} examples left: {len(target_excluded)} were "
                f"left out because their answer would be cut by data.max_length="
                f"{data.max_length} (data.on_truncated_target: exclude); raise data.max_length"
            )

    prepared = PreparedData(
        splits=splits,
        skipped=skipped,
        dropped=dropped,
        duplicates=dups,
        leak_dropped=leak_dropped,
        target_excluded=target_excluded,
        answer_budget=budget,
        answer_room=room,
        labels=list(spec.task.labels or []) if spec.task.multi_label else None,
    )
    prepared.version = data_version(pilot, splits, template_hash(tokenizer, spec.task))
    if enforce_leakage:
        check_leakage(pilot, prepared)
    return prepared


def remaining_leaks(pilot: Pilot, prepared: PreparedData) -> list[dict]:
    """Cross-split pairs still present after the policy ran (drop_from_train removes some)."""
    present = {r.id for recs in prepared.splits.values() for r in recs}
    out = []
    for p in prepared.duplicates.cross_split():
        if p.a_id in present and p.b_id in present:
            out.append(dataclasses.asdict(p) | {"cross_split": True})
    return out


def describe_leaks(leaks: list[dict], limit: int = 10) -> str:
    """`val:a ~ test:b (near, 0.93); ...`: the pairs by name, the first `limit` of them."""
    shown = "; ".join(
        f"{p['a_split']}:{p['a_id']} ~ {p['b_split']}:{p['b_id']} ({p['kind']}, "
        f"{p['similarity']:.2f})"
        for p in leaks[:limit]
    )
    return shown + (f" and {len(leaks) - limit} more" if len(leaks) > limit else "")


def check_leakage(pilot: Pilot, prepared: PreparedData) -> None:
    """Exit 1 on a leak the policy did not remove: under `fail` any cross-split pair; under
    `drop_from_train` a pair of two held-out rows (val ~ test), which dropping train rows
    cannot fix; under `together` a pair across files the user split (lorapilot's own split
    leaves none). `warn` keeps them (the data report lists them as a warning)."""
    leaks = remaining_leaks(pilot, prepared)
    policy = pilot.spec.data.leakage
    if not leaks or policy == "warn":
        return
    if policy in ("fail", "together"):
        held_out = [p for p in leaks if "train" not in (p["a_split"], p["b_split"])]
        if len(held_out) == len(leaks):  # val ~ test only: dropping train rows fixes none
            fix = (
                "Remove the validation row of each pair from the data (never the test row), "
                "or set data.leakage: warn"
            )
        elif held_out:
            fix = (
                "Set data.leakage: drop_from_train for the pairs with a train row, and remove "
                f"the validation row of the {len(held_out)} val ~ test pair(s) from the data, "
                "never the test row (or set data.leakage: warn)"
            )
        else:
            fix = "Fix the data, or set data.leakage: drop_from_train (or warn)"
        if policy == "together":  # lorapilot's own split left none: these are the user's
            fix = ("data.leakage: together keeps duplicates in one split only where lorapilot "
                   f"splits, not across the files you gave. {fix}")  # fmt: skip
        elif not pilot.spec.data.files:
            fix = ("Set data.leakage: together to keep each set of duplicates in one split "
                   f"when lorapilot splits the file. Or: {fix[0].lower()}{fix[1:]}")  # fmt: skip
        raise CheckFailed(
            f"{len(leaks)} duplicate pair(s) across splits (leaks): {describe_leaks(leaks)}. "
            f"{fix}.",
            {"cross_split": leaks},
        )
    raise CheckFailed(
        f"{len(leaks)} duplicate pair(s) between held-out splits, which data.leakage: "
        f"drop_from_train cannot fix (it drops train rows only): {describe_leaks(leaks)}. "
        "Remove the validation row of each pair from the data (never the test row), or set "
        "data.leakage: warn.",
        {"cross_split": leaks},
    )


DEFAULT_CONTEXT = 2048  # a base whose config.json states no context length


def model_context(tokenizer: Any) -> int:
    """The base's context length: config.json's max_position_embeddings beside the tokenizer
    (the base folder), else the tokenizer's own model_max_length when it is a real one."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        cfg = cfg.get("text_config", cfg) if "max_position_embeddings" not in cfg else cfg
        if isinstance(cfg.get("max_position_embeddings"), int):
            return int(cfg["max_position_embeddings"])
    except (OSError, ValueError, AttributeError):
        pass
    n = getattr(tokenizer, "model_max_length", None)
    return int(n) if isinstance(n, int) and 16 <= n < 10_000_000 else DEFAULT_CONTEXT


def max_length_of(pilot: Pilot, tokenizer: Any) -> int:
    """`data.max_length` as a number: `auto` is the model's context."""
    m = pilot.spec.data.max_length
    return model_context(tokenizer) if m == "auto" else int(m)


def formatter_for(pilot: Pilot, tokenizer: Any) -> PromptFormatter:
    spec = pilot.spec
    return PromptFormatter(
        tokenizer,
        spec.task,
        max_length_of(pilot, tokenizer),
        spec.data.truncation_side,
        spec.train.loss_on,
    )


def encode_records(fmt: PromptFormatter, task, records: list[Record], budget: int) -> list[Encoded]:
    return [
        fmt.encode(r.text, answer_text(task, r.label, r.target), budget, r.context) for r in records
    ]
