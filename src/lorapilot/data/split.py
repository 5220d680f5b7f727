"""Stratified, deterministic train/val/test split (pure, no I/O).

Each category is split on its own, so every category keeps its share in val and test, and
adding examples of one category never moves the examples of another. The order within a
category depends only on the ids and `f"{seed}:{category}"`, never on file order or on
Python's hash seed, so the same data and seed give the same split on any machine. (A
multi-label example's category is the rarest of its labels in the whole data: there, adding
examples can change which label is rarest, and so move examples.)
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable

from lorapilot.data.rows import Record

SPLITS = ("train", "val", "test")
MIN_TO_SPLIT = 3


def _round_half_up(x: float) -> int:
    # round() rounds 2.5 to 2 and 3.5 to 4; half-up is what people expect from "15% of 10".
    return math.floor(x + 0.5)


def split_sizes(n: int, val: float, test: float) -> tuple[int, int, int]:
    """(n_train, n_val, n_test) for one category of n examples.

    A category with fewer than 3 examples goes entirely to train: one example in val says
    nothing about a category, and the model should at least see the rare case. Otherwise
    train keeps at least one example (the larger of val and test gives way; test on a tie).
    """
    if n < MIN_TO_SPLIT:
        return n, 0, 0
    n_test = _round_half_up(n * test)
    n_val = _round_half_up(n * val)
    while n_test + n_val > n - 1:
        if n_test >= n_val and n_test > 0:
            n_test -= 1
        else:
            n_val -= 1
    return n - n_val - n_test, n_val, n_test


def split_records(
    records: Iterable[Record], seed: int, val: float, test: float
) -> dict[str, list[Record]]:
    """Records -> {"train", "val", "test"}, stratified by category; each list sorted by id.

    The returned records carry their split in `Record.split` (new objects; inputs untouched).
    """
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ValueError(f"val={val} and test={test} must be fractions that leave some train")
    by_category: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_category[record.category].append(record)
    out: dict[str, list[Record]] = {name: [] for name in SPLITS}
    for category in sorted(by_category):
        group = sorted(by_category[category], key=lambda r: (r.id, r.source))
        random.Random(f"{seed}:{category}").shuffle(group)
        _, n_val, n_test = split_sizes(len(group), val, test)
        parts = {
            "test": group[:n_test],
            "val": group[n_test : n_test + n_val],
            "train": group[n_test + n_val :],
        }
        for name, part in parts.items():
            out[name].extend(dataclasses.replace(r, split=name) for r in part)
    for name in SPLITS:
        out[name].sort(key=lambda r: (r.id, r.source))
    return out


def multi_label_strata(records: list[Record], labels: list[str]) -> list[Record]:
    """A multi-label example's category: the rarest of its labels over all the records
    (ties: task.labels order), so each label's rare examples are spread over the splits in
    proportion instead of riding with a commoner label they co-occur with (the first step of
    iterative stratification, Sechidis et al. 2011). Records without labels keep theirs."""
    count: dict[str, int] = defaultdict(int)
    for r in records:
        for label in r.target or ():
            count[label] += 1
    rank = {label: i for i, label in enumerate(labels)}
    out = []
    for r in records:
        if r.target:
            rarest = min(r.target, key=lambda lab: (count[lab], rank.get(lab, len(rank))))
            r = dataclasses.replace(r, category=rarest)
        out.append(r)
    return out


def split_groups(
    records: Iterable[Record],
    seed: int,
    val: float,
    test: float,
    key: Callable[[Record], str | None] = lambda r: r.group,
) -> dict[str, list[Record]]:
    """Records -> {"train", "val", "test"} with every group (`Record.group`, or `key`: a set
    of duplicates) whole in one split, as close to the per-category sizes of `split_records`
    as whole groups allow.

    Each category's target sizes are `split_sizes`'; groups are placed largest first (ties
    in a seeded order) where they bring the per-category counts closest to the targets
    (total absolute deviation; train wins ties), so a group larger than a split's share
    ends in train. Deterministic as `split_records`: ids, groups and the seed decide.
    """
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ValueError(f"val={val} and test={test} must be fractions that leave some train")
    by_group: dict[str, list[Record]] = defaultdict(list)
    per_category: dict[str, int] = defaultdict(int)
    for record in records:
        group = key(record)
        if group is None:
            raise ValueError(f"record {record.id!r} has no group")
        by_group[group].append(record)
        per_category[record.category] += 1
    target: dict[str, dict[str, int]] = {name: {} for name in SPLITS}
    for category, n in per_category.items():
        for name, size in zip(SPLITS, split_sizes(n, val, test), strict=True):
            target[name][category] = size
    have: dict[str, dict[str, int]] = {name: defaultdict(int) for name in SPLITS}
    order = sorted(by_group)
    random.Random(f"{seed}:groups").shuffle(order)
    order.sort(key=lambda g: -len(by_group[g]))  # stable: the shuffle orders equal sizes
    out: dict[str, list[Record]] = {name: [] for name in SPLITS}
    for g in order:
        members = by_group[g]
        counts: dict[str, int] = defaultdict(int)
        for r in members:
            counts[r.category] += 1

        def change(name: str, counts: dict[str, int] = counts) -> int:
            t, h = target[name], have[name]
            return sum(abs(h[c] + k - t[c]) - abs(h[c] - t[c]) for c, k in counts.items())

        best = min(SPLITS, key=lambda name: (change(name), SPLITS.index(name)))
        for c, k in counts.items():
            have[best][c] += k
        out[best].extend(dataclasses.replace(r, split=best) for r in members)
    for name in SPLITS:
        out[name].sort(key=lambda r: (r.id, r.source))
    return out


def category_counts(splits: dict[str, list[Record]]) -> dict[str, dict[str, int]]:
    """{split: {category: count}}, every category listed in every split (0 when absent),
    so a category missing from val or test is visible rather than silently absent."""
    categories = sorted({r.category for part in splits.values() for r in part})
    counts: dict[str, dict[str, int]] = {}
    for name, part in splits.items():
        c = dict.fromkeys(categories, 0)
        for r in part:
            c[r.category] += 1
        counts[name] = c
    return counts


def label_counts(splits: dict[str, list[Record]], labels: list[str]) -> dict[str, dict[str, int]]:
    """{split: {label: examples carrying it}} for a multi-label task (an example counts for
    each of its labels), every label listed in every split."""
    out = {}
    for name, part in splits.items():
        c = dict.fromkeys(labels, 0)
        for r in part:
            for label in r.target or ():
                c[label] = c.get(label, 0) + 1
        out[name] = c
    return out


def sample_size(n: int, size: int | float) -> int:
    """How many of `n` records a sample size keeps: a count (at most n) or a fraction
    (rounded half up, at least 1 of a non-empty split)."""
    if isinstance(size, float):
        return min(n, max(1 if n else 0, _round_half_up(size * n)))
    return min(n, size)


def sample_records(records: list[Record], size: int | float, seed: str) -> list[Record]:
    """A seeded subset of `size` records, stratified: each category keeps its share (largest
    remainder, ties by category name), so the label proportions survive. Sorted by id."""
    n = sample_size(len(records), size)
    by_category: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_category[r.category].append(r)
    cats = sorted(by_category)
    exact = {c: n * len(by_category[c]) / len(records) for c in cats} if records else {}
    quota = {c: int(exact[c]) for c in cats}
    left = n - sum(quota.values())
    for c in sorted(cats, key=lambda c: (-(exact[c] - quota[c]), c))[:left]:
        quota[c] += 1
    out: list[Record] = []
    for c in cats:
        group = sorted(by_category[c], key=lambda r: (r.id, r.source))
        out += random.Random(f"{seed}:{c}").sample(group, quota[c])
    return sorted(out, key=lambda r: (r.id, r.source))
