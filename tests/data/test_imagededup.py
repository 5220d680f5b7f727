"""Duplicate images: exact by pixels, near by perceptual hash confirmed on thumbnails."""

from __future__ import annotations

import io
import random

import numpy as np
from PIL import Image

from lorapilot.data.imagededup import (
    NEAR_CORRELATION,
    ImageItem,
    _near,
    find_image_duplicates,
)
from lorapilot.data.images import perceptual_hash, pixel_hash, thumbnail


def _photo(seed: int, size: int = 48) -> Image.Image:
    """A smooth random picture (noise upsampled), so resizing keeps its look."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8))
    return small.resize((size, size), Image.Resampling.BICUBIC)


def _item(rid: str, split: str, img: Image.Image) -> ImageItem:
    return ImageItem(rid, split, pixel_hash(img), perceptual_hash(img), thumbnail(img))


def _jpeg(img: Image.Image, quality: int = 70) -> Image.Image:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue()))


def test_exact_and_near_copies_across_splits_are_leaks_and_distinct_images_are_not():
    a, b, c = _photo(1), _photo(2), _photo(3)
    items = [
        _item("a", "train", a),
        _item("a-copy", "test", a.convert("RGB")),  # same pixels, other mode
        _item("b", "train", b),
        _item("b-jpeg", "val", _jpeg(b)),
        _item("b-big", "train", b.resize((96, 96), Image.Resampling.BILINEAR)),
        _item("c", "val", c),
    ]
    rep = find_image_duplicates(items, max_bits=10)
    assert [(p.a_id, p.b_id) for p in rep.exact] == [("a", "a-copy")]
    assert rep.exact[0].cross_split and rep.exact[0].similarity == 1.0
    near = {(p.a_id, p.b_id) for p in rep.near}
    assert near == {("b", "b-jpeg"), ("b", "b-big"), ("b-jpeg", "b-big")}
    assert all(p.similarity >= NEAR_CORRELATION for p in rep.near)
    assert {(p.a_id, p.b_id) for p in rep.cross_split()} == {
        ("a", "a-copy"),
        ("b", "b-jpeg"),
        ("b-jpeg", "b-big"),
    }


def test_similar_but_different_pictures_with_equal_hashes_are_not_near_duplicates():
    """Equal perceptual hashes, different pictures: the thumbnails decide."""
    a = _photo(4)
    arr = np.asarray(a, dtype=np.int16)
    noisy = Image.fromarray(
        np.clip(arr + np.random.default_rng(0).integers(-60, 61, arr.shape), 0, 255).astype(
            np.uint8
        )
    )
    items = [_item("a", "train", a), _item("noisy", "val", noisy)]
    assert bin(items[0].phash ^ items[1].phash).count("1") <= 10  # a candidate...
    assert find_image_duplicates(items, max_bits=10).near == []  # ...refused


def test_the_banded_search_finds_every_pair_within_the_distance():
    """Pigeonhole bands vs all pairs, on random 64-bit hashes with planted close ones."""
    rng = random.Random(0)
    hashes = [rng.getrandbits(64) for _ in range(300)]
    for i in range(0, 300, 3):  # plant neighbours at 0..8 bits
        flip = rng.sample(range(64), rng.randint(0, 8))
        h = hashes[i]
        for bit in flip:
            h ^= 1 << bit
        hashes[i + 1] = h
    items = [ImageItem(str(i), "train", str(i), h) for i, h in enumerate(hashes)]
    for max_bits in (0, 3, 8):
        got = _near(items, list(range(len(items))), max_bits)
        brute = [
            (i, j, bin(hashes[i] ^ hashes[j]).count("1"))
            for i in range(len(hashes))
            for j in range(i + 1, len(hashes))
            if bin(hashes[i] ^ hashes[j]).count("1") <= max_bits
        ]
        assert got == brute and len(brute) > 0
