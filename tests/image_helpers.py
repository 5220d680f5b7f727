"""Small image pilots written on the fly: random-noise PNGs (all distinct), a folder per label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import write_pilot
from PIL import Image

LABELS = ["cat", "dog", "fox"]


def noise(seed: int, size: tuple[int, int] = (24, 20), mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
    img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
    return img if mode in ("RGB", "L") else img.convert(mode)


def image_pilot(tmp: Path, per_label: int = 8, layout: str = "folder", **image) -> Path:
    """A pilot with `per_label` images per label: `folder` (ImageFolder) or `jsonl` (a file
    with image paths and labels)."""
    lines = []
    for k, label in enumerate(LABELS):
        for i in range(per_label):
            rel = f"data/images/{label}/{label}-{i:02d}.png"
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            noise(100 * k + i).save(tmp / rel)
            lines.append(f'{{"image": "{rel}", "label": "{label}", "id": "{label}-{i}"}}')
    data = {"file": "data/images"} if layout == "folder" else {"file": "data/images.jsonl"}
    if layout == "jsonl":
        (tmp / "data" / "images.jsonl").write_text("\n".join(lines) + "\n")
    spec = {
        "name": "imgs",
        "hypothesis": "images can be told apart",
        "task": {
            "kind": "image_classification",
            "labels": LABELS,
            "image": {
                "size": 16,
                "resize": "stretch",
                "crop": "none",
                "normalize": "none",
                **image,
            },
        },
        "data": {
            **data,
            "source": "generated noise",
            "permission": "generated",
            "split": {"seed": 0, "val": 0.25, "test": 0.25},
        },
    }
    return write_pilot(tmp, spec)
