"""Duplicate and leak detection: exact after normalisation, near by verified MinHash-LSH."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

from lorapilot.data.dedup import (
    ANCHORS,
    DupItem,
    DupReport,
    choose_bands,
    find_duplicates,
    normalize_for_dedup,
)
from lorapilot.data.dedup import _minhash as minhash
from lorapilot.data.dedup import _shingle_hashes as shingle_hashes

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
    "matches near an old harbour where ships unload grain coffee timber and steel before "
    "dawn breaks across distant hills covered with pine forests rivers meadows villages"
).split()


def jaccard3(a: str, b: str) -> float:
    """Reference: Jaccard of word 3-shingle sets, computed on strings (no hashing)."""

    def sh(t: str) -> set[tuple[str, ...]]:
        w = normalize_for_dedup(t).split()
        return {tuple(w[i : i + 3]) for i in range(len(w) - 2)}

    x, y = sh(a), sh(b)
    return len(x & y) / len(x | y)


def random_text(rng: random.Random, n: int = 40, vocab: list[str] | None = None) -> str:
    return " ".join(rng.choice(vocab or WORDS) for _ in range(n))


def ids(pairs) -> set[tuple[str, str]]:
    return {(p.a_id, p.b_id) for p in pairs}


def test_normalize_case_punctuation_spacing_unicode():
    assert normalize_for_dedup("  Hello,\tWORLD!!  it's\n\nfine. ") == "hello world its fine"
    assert normalize_for_dedup("ｈｅｌｌｏ　ｗｏｒｌｄ") == "hello world"  # NFKC fullwidth
    assert normalize_for_dedup("Straße") == normalize_for_dedup("STRASSE")  # casefold
    assert normalize_for_dedup("") == ""
    assert normalize_for_dedup("?!...") == ""


def test_exact_duplicates_after_normalisation():
    items = [
        DupItem("a", "train", "Reset my password, please."),
        DupItem("b", "train", "reset   my PASSWORD please"),
        DupItem("c", "train", "Reset my password please!!"),
        DupItem("d", "train", "Where is my invoice for March?"),
    ]
    rep = find_duplicates(items)
    # a group of n gives n-1 pairs, each member with the group's first
    assert ids(rep.exact) == {("a", "b"), ("a", "c")}
    assert all(p.kind == "exact" and p.similarity == 1.0 for p in rep.exact)
    assert rep.near == []


def test_near_copy_with_two_words_changed_is_found_with_exact_jaccard():
    rng = random.Random(3)
    base = random_text(rng, 40, [f"w{i}" for i in range(500)])
    words = base.split()
    words[10], words[30] = "changed", "altered"
    copy = " ".join(words)
    j = jaccard3(base, copy)
    # 38 shingles each, 3 lost per changed word: 32 / 44 = 0.727, not "about 0.8"
    assert j == pytest.approx(32 / 44)

    items = [DupItem("x", "train", base), DupItem("y", "train", copy)]
    rep = find_duplicates(items, threshold=0.7)
    assert rep.exact == []
    assert len(rep.near) == 1
    pair = rep.near[0]
    assert (pair.a_id, pair.b_id, pair.kind) == ("x", "y", "near")
    assert pair.similarity == pytest.approx(j, abs=1e-12)
    # verified exactly: just above the true Jaccard it is not reported
    assert find_duplicates(items, threshold=j + 0.01).near == []


def test_unrelated_texts_are_not_paired():
    rng = random.Random(0)
    vocab = [f"tok{i}" for i in range(3000)]
    items = [DupItem(str(i), "train", random_text(rng, 50, vocab)) for i in range(300)]
    rep = find_duplicates(items, threshold=0.5)
    assert rep.exact == [] and rep.near == []


def test_cross_split_vs_within_split():
    rng = random.Random(1)
    t1, t2 = random_text(rng), random_text(rng)
    t3 = random_text(rng, 60, [f"v{i}" for i in range(400)])
    t3_near = t3.rsplit(" ", 1)[0] + " different"
    items = [
        DupItem("tr1", "train", t1),
        DupItem("te1", "test", t1.upper()),  # exact leak
        DupItem("tr2", "train", t2),
        DupItem("tr3", "train", t2 + " ."),  # exact, same split
        DupItem("tr4", "train", t3),
        DupItem("va4", "val", t3_near),  # near leak
    ]
    rep = find_duplicates(items)
    assert ids(rep.cross_split()) == {("tr1", "te1"), ("tr4", "va4")}
    assert ids(rep.within_split()) == {("tr2", "tr3")}
    assert [p.cross_split for p in rep.exact] == [True, False]
    assert rep.near[0].kind == "near" and rep.near[0].cross_split


def test_every_copy_of_a_leaked_text_is_in_a_cross_split_pair():
    """A per-record policy (drop the train side of each leak) must see every train copy."""
    rng = random.Random(2)
    t = random_text(rng, 50, [f"u{i}" for i in range(400)])
    t_near = t.split(" ", 1)[1] + " extra"
    items = [
        DupItem("a1", "train", t),
        DupItem("a2", "train", t),
        DupItem("b", "test", t),
        DupItem("c1", "train", t_near),
        DupItem("c2", "train", t_near + "!"),
    ]
    rep = find_duplicates(items)
    in_leaks = {x for p in rep.cross_split() for x in (p.a_id, p.b_id)}
    assert in_leaks == {"a1", "a2", "b", "c1", "c2"}
    assert {("a1", "b"), ("a2", "b")} <= ids(p for p in rep.exact if p.cross_split)
    assert {("b", "c1"), ("b", "c2")} <= ids(rep.near)


def test_deterministic_given_seed():
    rng = random.Random(5)
    vocab = [f"d{i}" for i in range(200)]
    texts = [random_text(rng, 30, vocab) for _ in range(100)]
    texts += [" ".join(t.split()[:-1]) for t in texts[:30]]  # near copies
    items = [DupItem(str(i), ("train", "val")[i % 2], t) for i, t in enumerate(texts)]
    r1, r2 = find_duplicates(items, seed=7), find_duplicates(items, seed=7)
    assert r1.exact == r2.exact and r1.near == r2.near
    assert r1.to_dict() == r2.to_dict()
    assert len(r1.near) >= 25


def test_five_thousand_identical_texts_are_fast_and_linear():
    items = [DupItem(str(i), "train", "the same boilerplate text again") for i in range(5000)]
    t0 = time.perf_counter()
    rep = find_duplicates(items)
    assert time.perf_counter() - t0 < 30.0  # ~1 s quiet; all ~12.5M pairs would take minutes
    assert len(rep.exact) == 4999  # n-1, not n^2/2
    assert rep.near == []


def test_bucket_cap_on_five_thousand_near_identical_texts():
    """Templated texts all share LSH buckets: pairs are capped, every text still paired."""
    template = " ".join(WORDS[:40])
    items = [
        DupItem(str(i), ("train", "test")[i % 2], f"{template} ticket number {i}")
        for i in range(5000)
    ]
    t0 = time.perf_counter()
    rep = find_duplicates(items)
    assert time.perf_counter() - t0 < 30.0  # ~1 s quiet; all ~12.5M pairs would take minutes
    assert rep.exact == []
    assert len(rep.near) <= 5000 * ANCHORS * 2  # the full clique would be 12.5M
    paired = {x for p in rep.near for x in (p.a_id, p.b_id)}
    assert len(paired) == 5000
    assert all(p.similarity >= 0.8 for p in rep.near)
    leaked = {x for p in rep.cross_split() for x in (p.a_id, p.b_id)}
    assert len(leaked) == 5000


@pytest.mark.parametrize("shingle", [1, 3, 5])
def test_empty_and_short_texts_do_not_crash(shingle):
    items = [
        DupItem("e1", "train", ""),
        DupItem("e2", "test", "   "),
        DupItem("p", "train", "?!"),  # empty after normalisation
        DupItem("w1", "train", "hello"),
        DupItem("w2", "val", "Hello!"),
        DupItem("w3", "train", "goodbye"),
        DupItem("two", "train", "hello there"),
    ]
    rep = find_duplicates(items, shingle=shingle)
    assert ids(rep.exact) == {("e1", "e2"), ("e1", "p"), ("w1", "w2"), ("e2", "p")}
    assert rep.near == []
    assert find_duplicates([]).exact == []
    assert find_duplicates([DupItem("only", "train", "")]).near == []


def test_short_texts_near_match_on_whole_token_list():
    items = [DupItem("a", "train", "refund please"), DupItem("b", "test", "refund please now")]
    # "refund please" is one 2-word shingle; "refund please now" one 3-shingle: J = 0
    assert find_duplicates(items, threshold=0.1).near == []
    items = [DupItem("a", "train", "a b c d"), DupItem("b", "test", "a b c d e")]
    rep = find_duplicates(items, threshold=0.6)
    assert [(p.a_id, p.b_id, p.similarity) for p in rep.near] == [("a", "b", pytest.approx(2 / 3))]


def test_to_dict_counts_truncation_and_leaks_first():
    items = [DupItem(f"t{i}", "train", "same") for i in range(5)] + [DupItem("v", "val", "same")]
    d = find_duplicates(items).to_dict(max_pairs=3)
    assert d["counts"]["exact"] == 5 + 4  # n-1 plus the other train copies with the val one
    assert d["counts"]["exact_cross_split"] == 5
    assert d["counts"]["within_split"] == 4
    assert d["truncated"] == {"exact": True, "near": False}
    assert len(d["exact"]) == 3 and all(p["cross_split"] for p in d["exact"])
    assert d["params"]["bands"] * d["params"]["rows"] <= d["params"]["num_perm"]
    empty = DupReport(exact=[], near=[]).to_dict()
    assert empty["counts"]["cross_split"] == 0 and empty["truncated"]["near"] is False
    assert dataclasses.asdict(find_duplicates(items).exact[0])["kind"] == "exact"


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
def test_lsh_s_curve_catches_pairs_at_threshold(threshold):
    bands, rows = choose_bands(threshold, 128)
    assert bands * rows <= 128
    assert 1 - (1 - threshold**rows) ** bands >= 0.99
    assert (1 - 0.5 ** (1 / bands)) ** (1 / rows) < threshold  # 50% point below threshold


def test_minhash_estimate_is_unbiased():
    """Guards the permutation family: agreement rate must track the exact Jaccard."""
    rng = random.Random(9)
    vocab = [f"m{i}" for i in range(2000)]
    texts, exact = [], []
    for k in range(300):
        a = [rng.choice(vocab) for _ in range(50)]
        b = list(a)
        for p in rng.sample(range(50), k % 12):
            b[p] = f"new{k}_{p}"
        texts += [" ".join(a), " ".join(b)]
        exact.append(jaccard3(texts[-2], texts[-1]))
    h, counts = shingle_hashes(texts, 3)
    sig = minhash(h, counts, 128, 0)
    est = (sig[0::2] == sig[1::2]).mean(axis=1)
    err = est - np.array(exact)
    assert abs(err.mean()) < 0.01
    assert err.std() < 0.06  # sqrt(J(1-J)/128) <= 0.044


def test_bad_parameters_raise():
    with pytest.raises(ValueError):
        find_duplicates([], threshold=0)
    with pytest.raises(ValueError):
        find_duplicates([], shingle=0)
