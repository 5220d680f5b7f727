"""Image properties per split and category, and the shortcut check: a category whose images
differ from the others' in size, shape, colour mode, format or file size gives the model a
way to learn the label without looking at the content (one class all grayscale, all
640x480, all PNG while the rest are JPEG). Pure: records in, dicts and messages out."""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from lorapilot.data.images import pixel_rules_of
from lorapilot.data.rows import ImageMeta, Record

# A category is compared with the others only with at least this many images.
MIN_IMAGES = 5
# Categorical properties: two categories are alike when the shares of each value (of mode,
# format, size) differ by at most this much (1.0 RGBA vs 0.0 is not alike).
SHARE_GAP = 0.5
# Numeric properties: two categories are alike when their medians are within this factor.
MEDIAN_FACTOR = {"width": 1.2, "height": 1.2, "aspect": 1.2, "bytes": 2.0}


def _values(meta: ImageMeta) -> dict[str, Any]:
    return {
        "width": meta.width,
        "height": meta.height,
        "aspect": meta.width / meta.height,
        "bytes": meta.bytes,
        "mode": meta.mode,
        "format": meta.format,
        "size": f"{meta.width}x{meta.height}",
    }


def _summary(metas: list[ImageMeta]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(metas)}
    if not metas:
        return out
    vals = [_values(m) for m in metas]
    for key in ("width", "height", "aspect", "bytes"):
        xs = [v[key] for v in vals]
        out[key] = {"min": min(xs), "median": median(xs), "max": max(xs)}
        if key == "aspect":
            out[key] = {k: round(x, 4) for k, x in out[key].items()}
    for key in ("mode", "format", "size"):
        counts = Counter(v[key] for v in vals)
        out[key] = dict(counts.most_common(5 if key == "size" else None))
    return out


def image_stats(splits: dict[str, list[Record]]) -> dict[str, Any]:
    """{per_split: {split: {category: summary}}, per_category: {category: summary over all
    splits}, all: summary}: width, height, aspect, bytes (min/median/max), mode, format and
    the commonest sizes (counts)."""
    per_split: dict[str, dict[str, Any]] = {}
    by_cat: dict[str, list[ImageMeta]] = {}
    for split, recs in splits.items():
        cats: dict[str, list[ImageMeta]] = {}
        for r in recs:
            if r.image is not None:
                cats.setdefault(r.category, []).append(r.image)
                by_cat.setdefault(r.category, []).append(r.image)
        per_split[split] = {c: _summary(m) for c, m in sorted(cats.items())}
    return {
        "per_split": per_split,
        "per_category": {c: _summary(m) for c, m in sorted(by_cat.items())},
        "all": _summary([m for ms in by_cat.values() for m in ms]),
    }


def shortcut_warnings(records: list[Record]) -> list[dict[str, Any]]:
    """Every (category, property) where the category stands apart: fewer than half of the
    other categories are like it (a share of some mode/format/size within SHARE_GAP, a median
    width/height/aspect/bytes within MEDIAN_FACTOR). So one RGBA class among ten is named, not
    the nine others; with two categories both are. Entries: {category, property, value,
    category_share, others_share} or {category, property, category_median, others_median},
    the others' figure being the median over the other categories."""
    by_cat: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.image is not None:
            by_cat.setdefault(r.category, []).append(_values(r.image))
    cats = sorted(c for c, vs in by_cat.items() if len(vs) >= MIN_IMAGES)
    if len(cats) < 2:
        return []
    shares = {(c, key): Counter(v[key] for v in by_cat[c]) for c in cats for key in _CATEGORICAL}
    medians = {(c, key): median(v[key] for v in by_cat[c]) for c in cats for key in MEDIAN_FACTOR}
    out: list[dict[str, Any]] = []
    for c in cats:
        others = [o for o in cats if o != c]
        n = len(by_cat[c])
        for key in _CATEGORICAL:
            values = sorted(set().union(*(shares[(x, key)] for x in cats)))
            for value in values:
                mine = shares[(c, key)][value] / n
                theirs = [shares[(o, key)][value] / len(by_cat[o]) for o in others]
                alike = sum(abs(mine - t) <= SHARE_GAP for t in theirs)
                if alike * 2 < len(others):
                    out.append(
                        {
                            "category": c,
                            "property": key,
                            "value": value,
                            "category_share": round(mine, 4),
                            "others_share": round(median(theirs), 4),
                        }
                    )
                    break  # one finding per property is enough to look
        for key, factor in MEDIAN_FACTOR.items():
            mine = medians[(c, key)]
            theirs = [medians[(o, key)] for o in others]
            alike = sum(_within(mine, t, factor) for t in theirs)
            if alike * 2 < len(others):
                out.append(
                    {
                        "category": c,
                        "property": key,
                        "category_median": round(mine, 4),
                        "others_median": round(median(theirs), 4),
                    }
                )
    return out


_CATEGORICAL = ("mode", "format", "size")


def _within(a: float, b: float, factor: float) -> bool:
    if a <= 0 or b <= 0:
        return a == b
    return max(a / b, b / a) <= factor


def describe_shortcut(w: dict[str, Any]) -> str:
    """One warning line naming the category and the property."""
    if "value" in w:
        return (
            f"category {w['category']!r} differs from the others in {w['property']}: "
            f"{w['category_share']:.0%} of its images are {w['value']}, "
            f"{w['others_share']:.0%} of the others' (a shortcut the model can learn "
            "instead of the content)"
        )
    return (
        f"category {w['category']!r} differs from the others in {w['property']}: median "
        f"{w['category_median']:g} vs {w['others_median']:g} (a shortcut the model can learn "
        "instead of the content)"
    )


# What `model_pixels` does beyond a plain conversion, by the rule `pixel_rules_of` names.
_PIXEL_CHANGES = {
    "turned_upright": "stored turned, with an EXIF orientation: turned upright as a viewer "
    "shows them",
    "transparent": "with transparency: composited onto white, as transformers' convert_to_rgb does",
    "scaled_16_bit": "of more than 8 bits a channel: scaled to 8 bits (value / 257), where a "
    "plain conversion clips at 255",
}


def pixel_changes(records: list[Record], shown: int = 3) -> dict[str, Any]:
    """How many images the model sees otherwise than a plain `convert` would give, per rule,
    with the first few ids: no image is changed silently."""
    hits: dict[str, list[str]] = {k: [] for k in _PIXEL_CHANGES}
    for r in records:
        for rule in pixel_rules_of(r.image) if r.image is not None else []:
            hits[rule].append(r.id)
    return {k: {"n": len(ids), "examples": ids[:shown]} for k, ids in hits.items()}


def describe_pixel_changes(changes: dict[str, Any]) -> list[str]:
    """One line per rule that changed any image: the count, what was done, the first ids."""
    return [
        f"{c['n']} image(s) {_PIXEL_CHANGES[k]} (e.g. {', '.join(c['examples'])})"
        for k, c in changes.items()
        if c["n"]
    ]
