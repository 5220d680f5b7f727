"""Image properties per category and the shortcut warnings."""

from __future__ import annotations

from lorapilot.data.imagestats import describe_shortcut, image_stats, shortcut_warnings
from lorapilot.data.rows import ImageMeta, Record


def _rec(i: int, cat: str, w: int = 28, h: int = 28, mode: str = "L", fmt: str = "PNG") -> Record:
    meta = ImageMeta(w, h, mode, fmt, 500 + i, f"s{i}", f"p{i}", i)
    return Record(f"{cat}{i}", f"{cat}/{i}.png", cat, None, "x", "train", cat, meta)


def test_stats_per_split_and_category():
    recs = [_rec(i, "a") for i in range(3)] + [_rec(9, "b", w=30, mode="RGB")]
    st = image_stats({"train": recs[:3], "val": recs[3:]})
    a = st["per_split"]["train"]["a"]
    assert a["n"] == 3 and a["width"] == {"min": 28, "median": 28, "max": 28}
    assert a["mode"] == {"L": 3} and a["size"] == {"28x28": 3}
    assert a["bytes"] == {"min": 500, "median": 501, "max": 502}
    assert st["per_category"]["b"]["mode"] == {"RGB": 1}
    assert st["all"]["n"] == 4 and st["all"]["width"]["max"] == 30


def test_one_class_in_another_mode_or_size_is_named():
    recs = [_rec(i, c) for c in ("a", "b", "c") for i in range(6)]
    assert shortcut_warnings(recs) == []
    rgba = [_rec(i, "b", mode="RGBA") if r.category == "b" else r for i, r in enumerate(recs)]
    found = shortcut_warnings(rgba)
    assert [(w["category"], w["property"], w["value"]) for w in found] == [("b", "mode", "L")]
    assert found[0]["category_share"] == 0.0 and found[0]["others_share"] == 1.0
    text = describe_shortcut(found[0])
    assert "category 'b' differs from the others in mode" in text

    big = [_rec(i, "c", w=64, h=64) if r.category == "c" else r for i, r in enumerate(recs)]
    props = {(w["category"], w["property"]) for w in shortcut_warnings(big)}
    assert props == {("c", "size"), ("c", "width"), ("c", "height")}


def test_with_two_categories_both_are_named():
    recs = [_rec(i, "a") for i in range(6)] + [_rec(i, "b", mode="RGB") for i in range(6)]
    assert {w["category"] for w in shortcut_warnings(recs)} == {"a", "b"}


def test_small_categories_are_not_compared():
    recs = [_rec(i, "a") for i in range(6)] + [_rec(9, "b", mode="RGBA")]
    assert shortcut_warnings(recs) == []
