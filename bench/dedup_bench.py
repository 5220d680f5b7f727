"""Time `find_duplicates` on synthetic texts with planted exact and near duplicates.

    .venv/bin/python bench/dedup_bench.py [--n 100000] [--json]

Texts are ~50 words drawn from a seeded Zipf-like vocabulary of a few thousand words (so
common words repeat as in real text). About 2% of records are planted exact copies (case,
punctuation and spacing changed) and 5% planted near copies (two words of one text
substituted); recall is measured on those planted pairs. Splits are drawn 80/10/10, so
many planted pairs are cross-split leaks.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from lorapilot.data.dedup import DupItem, find_duplicates, normalize_for_dedup

SPLITS = ("train", "val", "test")


def make_items(n: int, seed: int = 0, vocab_size: int = 4000, words: int = 50):
    """(items, planted): planted holds (index a, index b, kind) of each planted pair."""
    rng = np.random.default_rng(seed)
    vocab = [_word(rng, i) for i in range(vocab_size)]
    weights = 1.0 / np.arange(1, vocab_size + 1) ** 0.9
    weights /= weights.sum()
    n_exact, n_near = n // 50, n // 20
    n_base = n - n_exact - n_near
    lengths = rng.integers(words - 15, words + 16, size=n_base)
    flat = rng.choice(vocab_size, size=int(lengths.sum()), p=weights)
    texts: list[str] = []
    pos = 0
    for length in lengths.tolist():
        texts.append(" ".join(vocab[w] for w in flat[pos : pos + length]))
        pos += length
    splits = rng.choice(len(SPLITS), size=n, p=[0.8, 0.1, 0.1]).tolist()
    planted: list[tuple[int, int, str]] = []
    for _ in range(n_exact):
        src = int(rng.integers(n_base))
        t = texts[src].upper().replace(" ", "  , ", 1) + "!"
        planted.append((src, len(texts), "exact"))
        texts.append(t)
    for _ in range(n_near):
        src = int(rng.integers(n_base))
        toks = texts[src].split()
        for p in rng.choice(len(toks), size=2, replace=False).tolist():
            toks[p] = vocab[int(rng.integers(vocab_size))]
        planted.append((src, len(texts), "near"))
        texts.append(" ".join(toks))
    items = [
        DupItem(f"r{i}", SPLITS[s], t) for i, (t, s) in enumerate(zip(texts, splits, strict=True))
    ]
    return items, planted


def _word(rng: np.random.Generator, i: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(letters[c] for c in rng.integers(26, size=3 + i % 7))


def _jaccard(a: str, b: str, k: int = 3) -> float:
    def sh(t: str) -> set[tuple[str, ...]]:
        w = normalize_for_dedup(t).split()
        return {tuple(w[i : i + k]) for i in range(len(w) - k + 1)} if len(w) >= k else {tuple(w)}

    x, y = sh(a), sh(b)
    return len(x & y) / len(x | y) if x | y else 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="number of records to generate")
    ap.add_argument("--threshold", type=float, default=0.8, help="near-duplicate Jaccard threshold")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generator and of MinHash")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    items, planted = make_items(args.n, seed=args.seed)
    t0 = time.perf_counter()
    report = find_duplicates(items, threshold=args.threshold, seed=args.seed)
    elapsed = time.perf_counter() - t0

    found = {(p.a_id, p.b_id) for p in report.exact + report.near}
    ids = [it.id for it in items]
    # Near recall only counts planted pairs that truly reach the threshold (two substituted
    # words in a short text can fall below it; then missing them is correct).
    exact_planted = [(a, b) for a, b, k in planted if k == "exact"]
    near_planted = [
        (a, b)
        for a, b, k in planted
        if k == "near" and _jaccard(items[a].text, items[b].text) >= args.threshold
    ]

    def recall(pairs: list[tuple[int, int]]) -> float:
        hit = sum((ids[a], ids[b]) in found or (ids[b], ids[a]) in found for a, b in pairs)
        return hit / len(pairs) if pairs else 1.0

    out = {
        "n": args.n,
        "seconds": round(elapsed, 3),
        "records_per_s": round(args.n / elapsed),
        "exact_pairs": len(report.exact),
        "near_pairs": len(report.near),
        "cross_split_pairs": len(report.cross_split()),
        "recall_exact": round(recall(exact_planted), 4),
        "recall_near": round(recall(near_planted), 4),
        "near_planted_at_threshold": len(near_planted),
        "params": report.params,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:28s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
