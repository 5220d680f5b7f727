"""Classify with the exported model as the pilot did: `python classify.py [TEXT ...]`.

Written by `lorapilot export --gguf` beside `classifier.json`, `base.gguf` and `adapter.gguf`.
It needs `llama-cpp-python` and `numpy`, nothing of lorapilot. The pilot predicts a label by
scoring the labels after its prompt (the sum of each label's token log-probabilities, the end
of the answer included), not by generating text: generation (the Modelfile, `llama-cli`) may
answer something that is no label. This file builds the pilot's prompt (its chat template, its
cut of a too-long input) and scores the labels the same way; the export's serving check ran
this very file on the validation split and recorded how often it agrees with lorapilot.

    python classify.py "my invoice is wrong"         # one JSON line per text
    printf 'text one\\ntext two\\n' | python classify.py  # or one text per line on stdin
    python classify.py --model merged.gguf --lora none "..."   # the merged model
    python classify.py --scores "..."    # with the log-probabilities of the labels scored
    python classify.py --jsonl < in.jsonl   # {"text": ...} a line (texts with newlines);
                                            # the other keys (an id) are kept in the output

In Python: `Classifier(folder).classify(text)` -> label; `.scores(text)` -> {label: score}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CONFIG = "classifier.json"


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


class LabelScorer:
    """Label log-probabilities after a prompt from one llama.cpp context, reusing the KV cache
    of the longest prefix the next prompt shares with what it holds (as a server's prompt
    cache does). Reads only the last position's logits, so the context needs no logits_all."""

    def __init__(self, llm):
        self.llm = llm

    def _last(self) -> np.ndarray:
        import llama_cpp

        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)  # a float pointer
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))

    def feed(self, ids: list[int]) -> np.ndarray:
        """Make the context hold exactly `ids`; the log-probabilities after them."""
        llm = self.llm
        held = llm.input_ids[: llm.n_tokens].tolist()
        keep = 0
        for a, b in zip(held, ids, strict=False):
            if a != b:
                break
            keep += 1
        llm.n_tokens = min(keep, len(ids) - 1)  # eval drops the cache beyond n_tokens
        llm.eval(ids[llm.n_tokens :])
        return log_softmax(self._last())

    def score(
        self, prompt: list[int], labels: list[list[int]], best_first: bool = True
    ) -> list[float | None]:
        """Each label's summed log-probability after the prompt. `best_first` scores a label
        whole only while it may still win: a label's log-probability only falls as its tokens
        are added, so once the best label scored whole beats every other label's first-token
        score, no other can overtake it. Labels not scored whole are None; the argmax is the
        one scoring every label gives."""
        first = self.feed(prompt)
        n = len(prompt)
        partial = [float(first[lab[0]]) for lab in labels]
        whole: list[float | None] = [
            p if len(lab) == 1 else None for p, lab in zip(partial, labels, strict=True)
        ]
        order = range(len(labels))
        while True:
            pending = [j for j in order if whole[j] is None]
            if not pending:
                break
            if best_first:
                top = max(
                    order, key=lambda j: (whole[j] if whole[j] is not None else partial[j], -j)
                )
                if whole[top] is not None:
                    break
                pending = [top]
            for j in pending:
                whole[j] = self._whole(n, labels[j], partial[j])
        return whole

    def _whole(self, n: int, lab: list[int], first: float) -> float:
        """A label's later tokens, one at a time after the prompt's `n` tokens."""
        self.llm.n_tokens = n
        total = first
        for k in range(1, len(lab)):
            self.llm.eval([lab[k - 1]])
            total += float(log_softmax(self._last())[lab[k]])
        return total


class Classifier:
    """The pilot's classifier: its prompt, its cut of a long input, its label scoring."""

    def __init__(
        self,
        folder: Path | str = HERE,
        model: str | None = None,
        lora: str | None = None,
        threads: int | None = None,
        llm=None,
    ):
        """`model`/`lora`: other files of the folder (`lora` "none": no adapter, e.g. with
        merged.gguf); `llm`: a llama_cpp.Llama already loaded (the serving check's)."""
        folder = Path(folder)
        cfg = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        self.cfg = cfg
        self.labels: list[str] = cfg["labels"]
        self.label_ids: list[list[int]] = cfg["label_ids"]
        if llm is None:
            try:
                from llama_cpp import Llama
            except ImportError:
                raise SystemExit(
                    f"{Path(__file__).name} needs llama-cpp-python: pip install llama-cpp-python"
                ) from None

            lora = cfg["lora"] if lora is None else (None if lora == "none" else lora)
            threads = threads or os.cpu_count() or 1
            llm = Llama(
                model_path=str(folder / (model or cfg["model"])),
                lora_path=str(folder / lora) if lora else None,
                n_ctx=cfg["n_ctx"],
                n_batch=min(cfg["n_ctx"], 512),
                n_threads=threads,
                n_threads_batch=threads,
                verbose=False,
                seed=0,
            )
        self.llm = llm
        self.scorer = LabelScorer(llm)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _prompt(self, text: str) -> str:
        return self.cfg["prompt_head"] + text + self.cfg["prompt_tail"]

    def fit(self, text: str) -> str:
        """The input cut as the pilot cut it (never the template): the prompt plus the room
        of the longest label must fit the pilot's max_length."""
        limit = self.cfg["max_length"] - self.cfg["answer_budget"]
        total = len(self.tokenize(self._prompt(text)))
        if total <= limit:
            return text
        ids = self.tokenize(text)
        keep = len(ids) - (total - limit)
        while keep > 0:
            kept = ids[len(ids) - keep :] if self.cfg["truncation_side"] == "left" else ids[:keep]
            short = self.llm.detokenize(kept).decode("utf-8", errors="replace")
            over = len(self.tokenize(self._prompt(short))) - limit
            if over <= 0:
                return short
            keep -= over  # re-tokenizing a decoded cut can differ by a token or two
        return ""

    def prompt_ids(self, text: str) -> list[int]:
        return self.tokenize(self._prompt(self.fit(text)))

    def scores(self, text: str) -> dict[str, float]:
        """The labels scored whole (best-first search: the ones that could still win)."""
        got = self.scorer.score(
            self.prompt_ids(text), self.label_ids, self.cfg["label_search"] == "best_first"
        )
        return {lab: s for lab, s in zip(self.labels, got, strict=True) if s is not None}

    def classify(self, text: str) -> str:
        return self.best(self.scores(text))

    def best(self, scores: dict[str, float]) -> str:
        """The label scoring highest (the first of the pilot's labels on a tie)."""
        return max(self.labels, key=lambda lab: scores.get(lab, float("-inf")))


def main(argv: list[str]) -> int:
    args, options, flags = [], {"--model": None, "--lora": None}, set()
    it = iter(argv)
    for a in it:
        if a in options:
            options[a] = next(it, None)
            if options[a] is None:
                print(f"{a} needs a value (a file of this folder)", file=sys.stderr)
                return 2
        elif a in ("--scores", "--jsonl"):
            flags.add(a)
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(a)
    rows = [{"text": a} for a in args]
    if not args:
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            if "--jsonl" not in flags:
                rows.append({"text": line.rstrip("\n")})
                continue
            try:
                row = json.loads(line)
                assert isinstance(row, dict) and isinstance(row.get("text"), str)
            except (ValueError, AssertionError):
                print(f"stdin line {n}: not a JSON object with a string 'text'", file=sys.stderr)
                return 2
            rows.append(row)
    clf = Classifier(HERE, model=options["--model"], lora=options["--lora"])
    for row in rows:
        got = clf.scores(row["text"])
        row["label"] = clf.best(got)
        if "--scores" in flags:
            row["scores"] = {k: round(v, 6) for k, v in got.items()}
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
