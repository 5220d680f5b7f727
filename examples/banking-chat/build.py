"""Rebuild the committed subset of BANKING77 written as chat fine-tuning data: 12 training
queries per intent from its train.csv, and 2 per intent for validation and 2 for test from
its test.csv (seed 0), as data/train.jsonl, data/val.jsonl and data/test.jsonl, each row a
conversation as OpenAI's fine-tuning API and TRL take it:

    {"messages": [{"role": "system", ...}, {"role": "user", "content": QUERY},
                  {"role": "assistant", "content": INTENT}]}

Source: BANKING77 (Casanueva et al. 2020, PolyAI-LDN/task-specific-datasets, CC-BY-4.0),
folder banking_data: train.csv and test.csv (text, category; a header). With a clone of it:

    python examples/banking-chat/build.py --source task-specific-datasets/banking_data

The selection depends only on the files and the seed, so it is the same on every machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
SYSTEM = "You are a support assistant for a bank. Reply with the intent of the customer's message."


def by_intent(path: Path) -> dict[str, list[str]]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        out[r["category"]].append(r["text"])
    return out


def conversation(text: str, intent: str) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": text},
                         {"role": "assistant", "content": intent}]}  # fmt: skip


def pick(groups: dict[str, list[str]], rng: random.Random, counts: list[int]) -> list[list]:
    """Per intent (sorted), `counts[i]` queries for part i, drawn without replacement; each
    part shuffled."""
    parts: list[list] = [[] for _ in counts]
    for intent in sorted(groups):
        texts = rng.sample(groups[intent], sum(counts))
        start = 0
        for part, n in zip(parts, counts, strict=True):
            part += [conversation(t, intent) for t in texts[start : start + n]]
            start += n
    for part in parts:
        rng.shuffle(part)
    return parts


def write(rows: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    tmp.replace(out)


def build(source: Path, out: Path, n_train: int, n_eval: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    (train,) = pick(by_intent(source / "train.csv"), rng, [n_train])
    val, test = pick(by_intent(source / "test.csv"), rng, [n_eval, n_eval])
    parts = {"train": train, "val": val, "test": test}
    for name, rows in parts.items():
        write(rows, out / f"{name}.jsonl")
    return {name: len(rows) for name, rows in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="the banking_data folder")
    ap.add_argument("--n-train", type=int, default=12, help="training queries per intent")
    ap.add_argument("--n-eval", type=int, default=2, help="val and test queries per intent")
    ap.add_argument("--out", type=Path, default=HERE / "data", help="output folder")
    args = ap.parse_args()
    print(build(args.source, args.out, args.n_train, args.n_eval))


if __name__ == "__main__":
    main()
