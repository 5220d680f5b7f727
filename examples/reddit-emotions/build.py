"""Rebuild the committed subset of GoEmotions (Ekman taxonomy): 1,200 of its 43,410 training
comments, shuffled with a fixed seed, and the first 300 of its dev and test files, as
data/train.jsonl, data/val.jsonl and data/test.jsonl ({"id", "text", "emotions"}).

Source: GoEmotions (Demszky et al. 2020, google-research/google-research, Apache-2.0), its
comments mapped to Ekman's six emotions and neutral, as in ReyRiordan/GoEmotions-pytorch
(Apache-2.0), folder data/ekman: train.tsv, dev.tsv, test.tsv (text, comma-separated label
indices, comment id; no header) and labels.txt. With a clone of it:

    python examples/reddit-emotions/build.py --source GoEmotions-pytorch/data/ekman

The selection depends only on the files and the seed, so it is the same on every machine.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def read(path: Path, labels: list[str]) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line:
            continue
        text, ids, cid = line.split("\t")
        rows.append({"id": cid, "text": text,
                     "emotions": [labels[int(i)] for i in ids.split(",")]})  # fmt: skip
    return rows


def write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    tmp.replace(out)


def build(source: Path, out: Path, n_train: int, n_eval: int, seed: int = 0) -> dict[str, int]:
    labels = (source / "labels.txt").read_text(encoding="utf-8").split()
    train = read(source / "train.tsv", labels)
    random.Random(seed).shuffle(train)
    parts = {
        "train": train[:n_train],
        "val": read(source / "dev.tsv", labels)[:n_eval],
        "test": read(source / "test.tsv", labels)[:n_eval],
    }
    for name, rows in parts.items():
        write(rows, out / f"{name}.jsonl")
    return {name: len(rows) for name, rows in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="the data/ekman folder")
    ap.add_argument("--n-train", type=int, default=1200, help="training rows (default 1200)")
    ap.add_argument("--n-eval", type=int, default=300, help="dev and test rows (default 300)")
    ap.add_argument("--out", type=Path, default=HERE / "data")
    args = ap.parse_args()
    print(build(args.source, args.out, args.n_train, args.n_eval), "->", args.out)


if __name__ == "__main__":
    main()
