"""Rebuild the committed subset of GSM8K: 900 rows of its training file, shuffled with a
fixed seed, as data/gsm8k.jsonl ({"id", "question", "answer"}).

Source: openai/grade-school-math (MIT licence, (c) 2021 OpenAI), the file
grade_school_math/data/train.jsonl at commit 3101c7d (7,473 rows). With a clone of it:

    python examples/gsm8k-format/build.py --source grade-school-math/grade_school_math/data/train.jsonl

The selection depends only on the file and the seed, so it is the same on every machine.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(source: Path, out: Path, n: int, seed: int = 0) -> int:
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line]
    random.Random(seed).shuffle(rows)
    lines = [
        json.dumps({"id": f"gsm-{i}", "question": r["question"], "answer": r["answer"]}) + "\n"
        for i, r in enumerate(rows[:n])
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(out)
    return len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="GSM8K's train.jsonl")
    ap.add_argument("--n", type=int, default=900, help="rows to keep (default 900)")
    ap.add_argument("--out", type=Path, default=HERE / "data" / "gsm8k.jsonl")
    args = ap.parse_args()
    print(f"{build(args.source, args.out, args.n)} rows -> {args.out}")


if __name__ == "__main__":
    main()
