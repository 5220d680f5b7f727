"""Exact and near duplicates, within and across splits (a cross-split pair is a leak).

Exact: equal text after `normalize_for_dedup`. Near: MinHash over word shingles, LSH
banding to find candidates, then the exact Jaccard of the shingle sets decides, so the
reported similarity is never an estimate. Pure functions over in-memory items; the data
verb decides what a leak means for the run (see DESIGN.md: only cli/registry touch disk).

Cost is linear in the number of shingles: hashing and MinHash are numpy array passes
(about 100k records of 50 words in a few seconds on two cores, see bench/README.md), and
the only Python loops are per text (normalising, splitting) and per verified candidate.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

import numpy as np

EXACT = "exact"
NEAR = "near"

# In a large LSH bucket (templated texts, boilerplate) every member is paired only with
# the first ANCHORS members of each split in that bucket, not with every other member, and
# after the union over bands each text keeps its first ANCHORS candidates per split: at
# most texts * ANCHORS * splits candidates instead of texts^2 / 2 (5,000 templated texts:
# 160k pairs in about a second, not 12.5M). Each text is still compared with texts of
# every split, so a leak is not hidden by the cap; what is lost is the full clique (A~B
# and A~C are reported, B~C may not be), and a text whose only true partners are outside
# a huge bucket's anchors can be missed.
ANCHORS = 16

# LSH is tuned so a pair whose Jaccard equals the threshold becomes a candidate with at
# least this probability; the S-curve's 50% point then sits below the threshold. At 0.98
# the planted-pair recall of bench/dedup_bench.py was 99.2%, at 0.99 it is 100% for no
# measurable time: extra candidates are cheap, they are filtered by estimate and verified.
_MIN_RECALL_AT_THRESHOLD = 0.99
# Candidates whose MinHash estimate is this many standard errors (plus a slack) below the
# threshold skip the exact check; it bounds the Python work on template-heavy data.
_PREFILTER_SIGMAS = 4.0
_PREFILTER_SLACK = 0.05
# Shingles per MinHash block: a (block, num_perm) uint64 array stays cache-sized.
_BLOCK = 4096
# Texts per word-splitting chunk (bounds the Python strings alive at once).
_TEXT_CHUNK = 8192

_PUNCT = re.compile(r"[^\w\s]|_")

_U64 = np.uint64
_C1 = _U64(0xFF51AFD7ED558CCD)  # murmur3 fmix64 constants: a bijective 64-bit mixer
_C2 = _U64(0xC4CEB9FE1A85EC53)
_S33 = _U64(33)
_SHINGLE_SEED = _U64(0x9E3779B97F4A7C15)
_BAND_SEED = _U64(0x2545F4914F6CDD1D)


@dataclass(frozen=True)
class DupItem:
    """One record as dedup sees it."""

    id: str
    """The record's id, echoed in pairs."""
    split: str
    """train / val / test (any label): pairs across different splits are leaks."""
    text: str
    """The cleaned input text (what the model will read), not the target."""


@dataclass(frozen=True)
class DupPair:
    """Two records with equal or near-equal text; `a` is the earlier item in the input."""

    a_id: str
    a_split: str
    b_id: str
    b_split: str
    kind: str
    """"exact" (equal normalised text) or "near" (shingle Jaccard >= threshold)."""
    similarity: float
    """1.0 for exact; the exact Jaccard of the two shingle sets for near."""

    @property
    def cross_split(self) -> bool:
        """A pair spanning two splits is a leak: the model may have seen its evaluation text."""
        return self.a_split != self.b_split

    def to_dict(self) -> dict[str, Any]:
        return {
            "a_id": self.a_id,
            "a_split": self.a_split,
            "b_id": self.b_id,
            "b_split": self.b_split,
            "kind": self.kind,
            "similarity": round(self.similarity, 6),
            "cross_split": self.cross_split,
        }


@dataclass
class DupReport:
    """All duplicate pairs found; exact and near are disjoint."""

    exact: list[DupPair]
    """Per group of n equal texts, n-1 pairs (each member with the group's first), plus each
    member with the first member of every other split, so each copy of a leak is paired."""
    near: list[DupPair]
    """Pairs of distinct normalised texts with shingle Jaccard >= threshold."""
    params: dict[str, Any] = field(default_factory=dict)
    """Settings used (threshold, shingle, num_perm, bands, rows, seed), for the run record."""

    def cross_split(self) -> list[DupPair]:
        """Leaks: exact then near pairs whose two items are in different splits."""
        return [p for p in self.exact + self.near if p.cross_split]

    def within_split(self) -> list[DupPair]:
        return [p for p in self.exact + self.near if not p.cross_split]

    def to_dict(self, max_pairs: int = 200) -> dict[str, Any]:
        """Counts plus at most `max_pairs` pairs per kind, leaks listed first so a truncated
        list still shows them; `truncated` says which lists were cut."""

        def listed(pairs: list[DupPair]) -> list[dict[str, Any]]:
            ordered = [p for p in pairs if p.cross_split] + [p for p in pairs if not p.cross_split]
            return [p.to_dict() for p in ordered[:max_pairs]]

        n_exact_cross = sum(p.cross_split for p in self.exact)
        n_near_cross = sum(p.cross_split for p in self.near)
        return {
            "counts": {
                "exact": len(self.exact),
                "near": len(self.near),
                "exact_cross_split": n_exact_cross,
                "near_cross_split": n_near_cross,
                "cross_split": n_exact_cross + n_near_cross,
                "within_split": len(self.exact) + len(self.near) - n_exact_cross - n_near_cross,
            },
            "exact": listed(self.exact),
            "near": listed(self.near),
            "truncated": {
                "exact": len(self.exact) > max_pairs,
                "near": len(self.near) > max_pairs,
            },
            "params": dict(self.params),
        }


def normalize_for_dedup(text: str) -> str:
    """NFKC, casefold, punctuation (and symbols, underscores) removed, whitespace collapsed.

    Punctuation is deleted rather than turned into a space so that "e-mail" == "email";
    two texts that differ only in case, punctuation or spacing are the same example.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_PUNCT.sub("", text).split())


def find_duplicates(
    items: list[DupItem],
    threshold: float = 0.8,
    shingle: int = 3,
    num_perm: int = 128,
    seed: int = 0,
) -> DupReport:
    """Exact pairs by normalised text, near pairs by MinHash-LSH verified with exact Jaccard.

    Near detection runs on one representative per (normalised text, split): identical
    copies are already exact pairs, and 5,000 copies of one text cost one MinHash, while
    keeping one per split still finds a near leak from any split to any other. A near pair
    is reported between those representatives; when it crosses splits, the other copies of
    each text are paired too, so every record involved in a leak appears in some
    cross-split pair (what a per-record policy such as drop_from_train needs).
    Deterministic for a given `seed`.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if shingle < 1 or num_perm < 1:
        raise ValueError(f"shingle and num_perm must be >= 1, got {shingle}, {num_perm}")
    bands, rows = choose_bands(threshold, num_perm)
    params = {
        "threshold": threshold,
        "shingle": shingle,
        "num_perm": num_perm,
        "bands": bands,
        "rows": rows,
        "s_curve_50": round((1 - 0.5 ** (1 / bands)) ** (1 / rows), 3),
        "seed": seed,
        "anchors": ANCHORS,
    }

    norm = [normalize_for_dedup(it.text) for it in items]
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(norm):
        groups.setdefault(t, []).append(i)

    exact_ij: list[tuple[int, int]] = []
    reps: list[int] = []  # first member of each (group, split), the only texts MinHashed
    rep_members: list[list[int]] = []  # that group's members in that split
    group_of_rep: list[int] = []
    for g, members in enumerate(groups.values()):
        by_split: dict[str, list[int]] = {}
        for m in members:
            by_split.setdefault(items[m].split, []).append(m)
        exact_ij.extend((members[0], m) for m in members[1:])
        if len(by_split) > 1:
            # Each member also pairs with the first member of every other split, so every
            # record with a copy in another split is in a leak pair (n-1 pairs alone would
            # leave a second train copy of a test text unflagged).
            firsts = [ms[0] for ms in by_split.values()]
            extra = {
                (min(m, f), max(m, f))
                for m in members
                for f in firsts
                if items[f].split != items[m].split and members[0] not in (m, f)
            }
            exact_ij.extend(sorted(extra))
        for ms in by_split.values():
            reps.append(ms[0])
            rep_members.append(ms)
            group_of_rep.append(g)
    exact = [_pair(items, i, j, EXACT, 1.0) for i, j in exact_ij]

    near = _near_pairs(
        items,
        norm,
        reps,
        rep_members,
        group_of_rep,
        threshold,
        shingle,
        num_perm,
        bands,
        rows,
        seed,
    )
    return DupReport(exact=exact, near=near, params=params)


def choose_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows): the most rows per band (fewest false candidates) that still makes a
    pair at the threshold a candidate with probability >= 99%.

    P(candidate | Jaccard s) = 1 - (1 - s^rows)^bands; for 0.8 and 128 permutations this is
    21 bands of 6 rows: P = 99.8% at 0.8, and the S-curve's 50% point is s = 0.57.
    """
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands >= _MIN_RECALL_AT_THRESHOLD:
            best = (bands, rows)
    return best


def _pair(items: list[DupItem], i: int, j: int, kind: str, sim: float) -> DupPair:
    a, b = items[i], items[j]
    return DupPair(a.id, a.split, b.id, b.split, kind, sim)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place; uint64 multiply wraps mod 2^64 by design."""
    h ^= h >> _S33
    h *= _C1
    h ^= h >> _S33
    h *= _C2
    h ^= h >> _S33
    return h


def _shingle_hashes(texts: list[str], shingle: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat uint64 hashes of each text's word shingles, in text order, and per-text counts.

    Words get a stable 8-byte blake2b hash once per distinct word (Python's hash() is
    salted per process); a shingle's hash chains fmix64 over its words' hashes, so the
    per-shingle work is numpy passes, not Python. A text shorter than `shingle` words is one
    shingle of all its words; an empty text has none.
    """
    # Texts are normalised (single spaces, no edge spaces), so counting spaces gives word
    # counts, and a join/split per chunk plus C-level dict and map calls replace per-word
    # Python; chunks keep the word strings of only a few thousand texts alive at once.
    lengths = np.array([t.count(" ") + 1 if t else 0 for t in texts], dtype=np.int64)
    vocab: dict[str, int] = {}
    id_chunks = []
    for c in range(0, len(texts), _TEXT_CHUNK):
        words = " ".join(texts[c : c + _TEXT_CHUNK]).split()
        for w in dict.fromkeys(words):
            if w not in vocab:
                vocab[w] = len(vocab)
        id_chunks.append(
            np.fromiter(map(vocab.__getitem__, words), dtype=np.int64, count=len(words))
        )
    ids = np.concatenate(id_chunks) if id_chunks else np.empty(0, dtype=np.int64)
    assert len(ids) == lengths.sum(), "texts must be normalize_for_dedup output"
    word_hash = np.fromiter(
        (int.from_bytes(blake2b(w.encode(), digest_size=8).digest(), "little") for w in vocab),
        dtype=np.uint64,
        count=len(vocab),
    )
    th = word_hash[ids]
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])

    # Full shingles: every start position with `shingle` words left in its own text.
    doc_of = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
    pos = np.arange(len(th), dtype=np.int64) - offsets[:-1][doc_of]
    starts = np.flatnonzero(pos <= lengths[doc_of] - shingle)
    hashes = [_chain(th, starts, shingle)]
    docs = [doc_of[starts]]
    # Short texts: one shingle of all their words.
    for n in range(1, shingle):
        short = np.flatnonzero(lengths == n)
        if len(short):
            hashes.append(_chain(th, offsets[short], n))
            docs.append(short)
    h = np.concatenate(hashes)
    order = np.argsort(np.concatenate(docs), kind="stable")
    counts = np.where(lengths >= shingle, lengths - shingle + 1, np.minimum(lengths, 1))
    return h[order], counts


def _chain(th: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    h = np.full(len(starts), _SHINGLE_SEED ^ _U64(n), dtype=np.uint64)
    for j in range(n):
        h ^= th[starts + j]
        _fmix64(h)
    return h


def _minhash(hashes: np.ndarray, counts: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """(texts, num_perm) signatures; every text must have >= 1 shingle.

    Permutation p is x -> fmix64(x ^ mask_p): a bijection of uint64 with random masks, no
    modular multiply to overflow. Blocks of whole texts run in threads: numpy releases the
    GIL in these ufuncs, so two cores give nearly twice the speed.
    """
    rng = np.random.default_rng(seed)
    masks = rng.integers(0, np.iinfo(np.uint64).max, size=num_perm, dtype=np.uint64, endpoint=True)
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    sig = np.empty((len(counts), num_perm), dtype=np.uint64)

    # Text boundaries of blocks of about _BLOCK shingles (a longer text is its own block).
    cuts = [0]
    block_of = starts[:-1] // _BLOCK
    cuts.extend((np.flatnonzero(np.diff(block_of)) + 1).tolist())
    cuts.append(len(counts))

    def run(k: int) -> None:
        d0, d1 = cuts[k], cuts[k + 1]
        s0 = starts[d0]
        x = hashes[s0 : starts[d1]]
        y = x[:, None] ^ masks[None, :]
        _fmix64(y)
        sig[d0:d1] = np.minimum.reduceat(y, starts[d0:d1] - s0, axis=0)

    workers = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, range(len(cuts) - 1)))
    return sig


def _candidates(sig: np.ndarray, splits: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Unique (i < j) index pairs sharing at least one LSH band, as an (n, 2) array.

    Pairs are generated vectorised per band: members of a bucket sorted by (split, index),
    the first ANCHORS of each split are the bucket's anchors, each member pairs with every
    anchor of its bucket (see ANCHORS for why this cap keeps leaks visible).
    """
    n = len(sig)
    codes = []
    idx = np.arange(n, dtype=np.int64)
    for b in range(bands):
        key = np.full(n, _BAND_SEED ^ _U64(b), dtype=np.uint64)
        for r in range(b * rows, (b + 1) * rows):
            key ^= sig[:, r]
            _fmix64(key)
        order = np.lexsort((idx, splits, key))
        k, s = key[order], splits[order]
        new_bucket = np.r_[True, k[1:] != k[:-1]]
        bucket = np.cumsum(new_bucket) - 1
        size = np.bincount(bucket)
        keep = size[bucket] >= 2
        if not keep.any():
            continue
        order, s, bucket = order[keep], s[keep], bucket[keep]
        _, bucket = np.unique(bucket, return_inverse=True)
        m = len(order)
        new_group = np.r_[True, (bucket[1:] != bucket[:-1]) | (s[1:] != s[:-1])]
        group_start = np.maximum.accumulate(np.where(new_group, np.arange(m), 0))
        anchor = (np.arange(m) - group_start) < ANCHORS
        anchor_doc = order[anchor]
        n_anchor = np.bincount(bucket[anchor], minlength=bucket[-1] + 1)
        first_anchor = np.zeros_like(n_anchor)
        np.cumsum(n_anchor[:-1], out=first_anchor[1:])
        reps = n_anchor[bucket]  # anchors each member pairs with
        left = np.repeat(order, reps)
        offset = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        right = anchor_doc[np.repeat(first_anchor[bucket], reps) + offset]
        lo, hi = np.minimum(left, right), np.maximum(left, right)
        ne = lo != hi
        codes.append(lo[ne] * n + hi[ne])
    if not codes:
        return np.empty((0, 2), dtype=np.int64)
    u = np.unique(np.concatenate(codes))
    lo, hi = u // n, u % n
    # Anchors differ from band to band (a text misses some of its cluster's buckets), so
    # the union over bands is capped again: each text keeps its first ANCHORS partners per
    # split (by input order); a pair stays if either side keeps it.
    src, dst = np.r_[lo, hi], np.r_[hi, lo]
    order = np.lexsort((dst, splits[dst], src))
    src, dst, s = src[order], dst[order], splits[dst[order]]
    new_group = np.r_[True, (src[1:] != src[:-1]) | (s[1:] != s[:-1])]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(src)), 0))
    kept = (np.arange(len(src)) - group_start) < ANCHORS
    a, b = src[kept], dst[kept]
    u = np.unique(np.minimum(a, b) * n + np.maximum(a, b))
    return np.stack([u // n, u % n], axis=1)


def _near_pairs(
    items: list[DupItem],
    norm: list[str],
    reps: list[int],
    rep_members: list[list[int]],
    group_of_rep: list[int],
    threshold: float,
    shingle: int,
    num_perm: int,
    bands: int,
    rows: int,
    seed: int,
) -> list[DupPair]:
    hashes, counts = _shingle_hashes([norm[r] for r in reps], shingle)
    live = np.flatnonzero(counts > 0)  # empty texts have no shingles: exact-only
    if len(live) < 2:
        return []
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    sig = _minhash(hashes, counts[live], num_perm, seed)

    split_codes: dict[str, int] = {}
    splits = np.array(
        [split_codes.setdefault(items[reps[i]].split, len(split_codes)) for i in live]
    )
    cand = _candidates(sig, splits, bands, rows)
    if len(cand) == 0:
        return []
    cand = cand[_estimate_ok(sig, cand, threshold, num_perm)]

    sets: dict[int, set[int]] = {}

    def shingles(d: int) -> set[int]:
        s = sets.get(d)
        if s is None:
            s = sets[d] = set(hashes[starts[d] : starts[d + 1]].tolist())
        return s

    found: dict[tuple[int, int], float] = {}
    for i, j in live[cand].tolist():
        if group_of_rep[i] == group_of_rep[j]:
            continue  # same text in two splits: already an exact pair
        a, b = shingles(i), shingles(j)
        inter = len(a & b)
        sim = inter / (len(a) + len(b) - inter)
        if sim < threshold:
            continue
        found[_ordered(reps[i], reps[j])] = sim
        if items[reps[i]].split != items[reps[j]].split:
            # A leak involves every copy: pair the other copies of each text in its split
            # with the other text's representative (linear, not copies x copies).
            for m in rep_members[i][1:]:
                found[_ordered(m, reps[j])] = sim
            for m in rep_members[j][1:]:
                found[_ordered(reps[i], m)] = sim
    return [_pair(items, ia, ib, NEAR, sim) for (ia, ib), sim in sorted(found.items())]


def _ordered(i: int, j: int) -> tuple[int, int]:
    return (i, j) if i < j else (j, i)


def _estimate_ok(sig: np.ndarray, cand: np.ndarray, threshold: float, num_perm: int) -> np.ndarray:
    """Mask of candidates whose MinHash Jaccard estimate is not hopelessly below threshold."""
    floor = threshold - _PREFILTER_SIGMAS * math.sqrt(threshold * (1 - threshold) / num_perm)
    floor -= _PREFILTER_SLACK
    ok = np.empty(len(cand), dtype=bool)
    step = 65536
    for s in range(0, len(cand), step):
        c = cand[s : s + step]
        est = (sig[c[:, 0]] == sig[c[:, 1]]).mean(axis=1)
        ok[s : s + step] = est >= floor
    return ok
