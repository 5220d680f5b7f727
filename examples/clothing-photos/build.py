"""Rebuild the committed subset of the clothing dataset: 400 of its photos drawn at random with
a fixed seed (from all its rows: the pilot's ten labels and the ones it leaves out), made
smaller, with the CSV that lists them: data/clothing.csv ({id, image, label, sender_id,
kids}) and data/images/.

Source: alexeygrigorev/clothing-dataset (CC0 1.0), images.csv and images/<id>.jpg at commit
7ed86a9 (5,403 labelled rows, 351 contributors in `sender_id`). With a clone of it:

    python examples/clothing-photos/build.py --source clothing-dataset

Rows whose image file is missing from the source (5 of them) are not drawn. Each photo is
resized to 128 px on its shorter side (Lanczos) and saved as JPEG quality 85, so the example
stays small (the pilot's transform takes 128 px); the CSV names each image by its
path relative to the pilot folder, since the source names it by id alone.
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDE = 128


def build(source: Path, out: Path, n: int, seed: int = 0) -> int:
    """Draw `n` rows of `source`/images.csv with `seed`, write the smaller photos and the CSV
    under `out` (the example's data folder); returns the number of rows written."""
    from PIL import Image

    with (source / "images.csv").open(newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if (source / "images" / f"{r['image']}.jpg").is_file()]
    rows.sort(key=lambda r: r["image"])
    random.Random(seed).shuffle(rows)
    rows = sorted(rows[:n], key=lambda r: r["image"])
    (out / "images").mkdir(parents=True, exist_ok=True)
    for r in rows:
        with Image.open(source / "images" / f"{r['image']}.jpg") as img:
            img = img.convert("RGB")
            scale = SIDE / min(img.size)
            size = (max(SIDE, round(img.width * scale)), max(SIDE, round(img.height * scale)))
            img.resize(size, Image.Resampling.LANCZOS).save(
                out / "images" / f"{r['image']}.jpg", quality=85
            )
    tmp = out / "clothing.csv.tmp"
    with tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["id", "image", "label", "sender_id", "kids"])
        for r in rows:
            image = f"{out.name}/images/{r['image']}.jpg"
            w.writerow([r["image"], image, r["label"], r["sender_id"], r["kids"]])
    tmp.replace(out / "clothing.csv")
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="a clone of clothing-dataset")
    ap.add_argument("--n", type=int, default=400, help="photos to keep (default 400)")
    ap.add_argument("--out", type=Path, default=HERE / "data")
    args = ap.parse_args()
    print(f"{build(args.source, args.out, args.n)} photos -> {args.out}")


if __name__ == "__main__":
    main()
