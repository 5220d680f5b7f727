"""Rebuild the committed subset of Fashion-MNIST: 100 images per class, PNG, in the
ImageFolder layout data/images/<label>/fmnist-<split>-<index>.png.

Source: the Debian package `dataset-fashion-mnist` (MIT licence, Zalando Research), which
installs the original IDX files under /usr/share/datasets/fashion-mnist/. The selection is
seeded and taken from the original training file, so it is the same on every machine:

    apt-get install dataset-fashion-mnist
    python examples/fashion-items/build.py [--per-class 100] [--source DIR]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
from PIL import Image

LABELS = [
    "t-shirt_top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle_boot",
]
SOURCE = Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format): a magic number, the dimensions, then uint8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "images")
    args = ap.parse_args()
    images = read_idx(args.source / "train-images-idx3-ubyte.gz")
    labels = read_idx(args.source / "train-labels-idx1-ubyte.gz")
    out = args.out
    tmp = out.with_name("images.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(args.seed)
    for k, name in enumerate(LABELS):
        (tmp / name).mkdir(parents=True)
        picked = np.sort(rng.choice(np.flatnonzero(labels == k), args.per_class, replace=False))
        for i in picked:
            # optimize=True: smallest PNG; the pixels are the original 28x28 grayscale ones
            Image.fromarray(images[i], mode="L").save(
                tmp / name / f"fmnist-train-{i:05d}.png", optimize=True
            )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"wrote {args.per_class * len(LABELS)} images to {out}")


if __name__ == "__main__":
    main()
