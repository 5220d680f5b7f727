"""Exact and near duplicate images, within and across splits (a cross-split pair is a leak),
reported in the text path's DupReport so the leakage policy and the report are shared.

Exact: equal pixels (`ImageMeta.pixel_hash`: any format, mode L or RGB). Near: a resized,
re-encoded or brightened copy. Candidates are pairs whose perceptual hashes are at most
`max_bits` of 64 bits apart, all of them, found by the pigeonhole rule: split the 64 bits
into max_bits + 1 bands; two hashes that differ in at most max_bits bits agree on one band,
so only hashes that share a band value are compared. A candidate is a near duplicate when
the Pearson correlation of the two 16x16 grayscale thumbnails is at least NEAR_CORRELATION,
reported as its similarity.

Why the second test: on Fashion-MNIST (centred products on black), distinct photos of two
similar sneakers can have equal perceptual hashes; their thumbnails correlate at most 0.994
(of 1000 images, all pairs), while a JPEG (quality 70), a 2x resize round trip, a 4x
upscale or +15 brightness of an image correlates >= 0.9976 with it, at pHash distances up
to 8 (measured; see tests/data/test_imagededup.py). A shifted crop is not caught.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lorapilot.data.dedup import EXACT, NEAR, DupPair, DupReport

HASH_BITS = 64
NEAR_CORRELATION = 0.995
_ROWS = 1024  # rows of a bucket's distance matrix computed at once


@dataclass(frozen=True)
class ImageItem:
    id: str
    split: str
    pixel_hash: str
    phash: int
    thumb: bytes = b""  # 16x16 grayscale; empty: the hash alone decides


def find_image_duplicates(items: list[ImageItem], max_bits: int) -> DupReport:
    """Exact pairs as in the text path (each member of a group of equal images with the
    group's first, and with the first member of every other split), then near pairs of
    distinct images, with similarity 1 - distance / 64."""
    exact: list[DupPair] = []
    groups: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault(it.pixel_hash, []).append(i)
    firsts: list[int] = []
    for members in groups.values():
        firsts.append(members[0])
        pairs: set[tuple[int, int]] = {(members[0], j) for j in members[1:]}
        first_of_split: dict[str, int] = {}
        for j in members:
            first_of_split.setdefault(items[j].split, j)
        for j in members:
            for s, k in first_of_split.items():
                if s != items[j].split:
                    pairs.add((min(j, k), max(j, k)))
        exact += [_pair(items, a, b, EXACT, 1.0) for a, b in sorted(pairs)]
    near = []
    for a, b, d in _near(items, sorted(firsts), max_bits):
        sim = _correlation(items[a].thumb, items[b].thumb)
        if sim is None:
            sim = 1.0 - d / HASH_BITS
        elif sim < NEAR_CORRELATION:
            continue
        near.append(_pair(items, a, b, NEAR, sim))
    params = {
        "kind": "image",
        "hash": "phash-dct-64",
        "candidate_max_bits": max_bits,
        "min_thumbnail_correlation": NEAR_CORRELATION,
    }
    return DupReport(exact=exact, near=near, params=params)


def _near(items: list[ImageItem], idx: list[int], max_bits: int) -> list[tuple[int, int, int]]:
    """(i, j, distance) for i < j among `idx` (one image per distinct pixel hash) whose
    perceptual hashes are within max_bits, each pair once, in order."""
    if len(idx) < 2 or max_bits < 0:
        return []
    h = np.array([items[i].phash for i in idx], dtype=np.uint64)
    bands = min(max_bits + 1, HASH_BITS)
    edges = np.linspace(0, HASH_BITS, bands + 1).astype(int)
    found: dict[tuple[int, int], int] = {}
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = np.uint64((1 << int(hi - lo)) - 1)
        key = (h >> np.uint64(lo)) & mask
        order = np.argsort(key, kind="stable")
        sorted_keys = key[order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
        ends = np.r_[starts[1:], len(order)]
        for s, e in zip(starts, ends, strict=True):
            if e - s < 2:
                continue
            members = order[s:e]
            block = h[members]
            for r0 in range(0, len(members), _ROWS):  # a big bucket in row chunks
                rows = block[r0 : r0 + _ROWS]
                dist = np.bitwise_count(rows[:, None] ^ block[None, :])
                a, b = np.nonzero(dist <= max_bits)
                for x, y in zip(a + r0, b, strict=True):
                    if x < y:
                        i, j = sorted((int(members[x]), int(members[y])))
                        found[(i, j)] = int(dist[x - r0, y])
    return sorted((idx[i], idx[j], d) for (i, j), d in found.items())


def _correlation(a: bytes, b: bytes) -> float | None:
    """Pearson correlation of two thumbnails (1.0 for two flat ones), None without them."""
    if not a or not b or len(a) != len(b):
        return None
    x = np.frombuffer(a, dtype=np.uint8).astype(np.float64)
    y = np.frombuffer(b, dtype=np.uint8).astype(np.float64)
    x, y = x - x.mean(), y - y.mean()
    norm = float(np.sqrt((x * x).sum() * (y * y).sum()))
    if norm == 0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float((x * y).sum() / norm)


def _pair(items: list[ImageItem], i: int, j: int, kind: str, sim: float) -> DupPair:
    a, b = items[i], items[j]
    return DupPair(a.id, a.split, b.id, b.split, kind, sim)
