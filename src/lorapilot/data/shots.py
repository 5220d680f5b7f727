"""Demonstrations for a few-shot baseline: the base model prompted with K examples from the
training split, the cheap alternative an adapter has to beat to be worth its training: the
same K for every input, or each input's K most similar (retrieval, `NearestShots`)."""

from __future__ import annotations

import heapq
import math
import random
import re
from collections import Counter

from lorapilot.data.format import PromptFormatter, answer_text
from lorapilot.data.rows import Record, Turns
from lorapilot.errors import UsageError
from lorapilot.spec import TaskSpec


def refuse_shots_for_images(task: TaskSpec, shots: int) -> None:
    """`--shots` prompts a text model with examples: refused for an image pilot, whose
    baseline is a linear probe on the frozen features."""
    if shots and task.modality == "image":
        raise UsageError(
            "--shots: few-shot prompting is a baseline of a text pilot's base model (an image "
            "pilot's baseline is a linear probe on the frozen features)"
        )


def pick_shots(records: list[Record], k: int, seed: int) -> list[Record]:
    """K training examples: the categories in turn, commonest first (K at least the number
    of categories shows each one), each category's examples in a seeded order; the chosen
    ones then shuffled with the same seed, so that no category always comes last (a small
    model leans towards the last answer it read). Deterministic for (records, k, seed)."""
    if k <= 0:
        return []
    rng = random.Random(seed)
    counts = Counter(r.category for r in records)
    pools = {c: sorted((r for r in records if r.category == c), key=lambda r: r.id) for c in counts}
    for pool in pools.values():
        rng.shuffle(pool)
    order = sorted(counts, key=lambda c: (-counts[c], c))
    picked: list[Record] = []
    depth = 0
    while len(picked) < min(k, len(records)):
        for c in order:
            if depth < len(pools[c]) and len(picked) < k:
                picked.append(pools[c][depth])
        depth += 1
    rng.shuffle(picked)
    return picked


_WORD = re.compile(r"\w+")


def _terms(text: str) -> Counter:
    return Counter(_WORD.findall(text.casefold()))


class NearestShots:
    """The K training examples whose input is most like a given input: cosine similarity of
    TF-IDF word vectors (sublinear term frequency, smoothed idf), ties by id; the most
    similar comes last, next to the input (Liu et al. 2022, "What makes good in-context
    examples for GPT-3?", retrieve by similarity; nearest last). A training example whose
    text is the input's own (casefolded, stripped) is never shown to it. Pure."""

    def __init__(self, records: list[Record]):
        self.records = sorted(records, key=lambda r: r.id)
        terms = [_terms(r.text) for r in self.records]
        df: Counter = Counter(t for ts in terms for t in ts)
        n = len(self.records)
        self.idf = {t: math.log((1 + n) / (1 + d)) + 1 for t, d in df.items()}
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for i, ts in enumerate(terms):
            for t, w in self._vector(ts).items():
                self.postings.setdefault(t, []).append((i, w))
        self.keys = [r.text.strip().casefold() for r in self.records]

    def _vector(self, terms: Counter) -> dict[str, float]:
        v = {t: (1 + math.log(c)) * self.idf.get(t, 0.0) for t, c in terms.items()}
        norm = math.sqrt(sum(x * x for x in v.values()))
        return {t: x / norm for t, x in v.items() if x} if norm else {}

    def pick(self, text: str, k: int) -> list[Record]:
        """The K nearest training examples to `text`, least similar first."""
        score: dict[int, float] = {}
        for t, w in self._vector(_terms(text)).items():
            for i, x in self.postings.get(t, ()):
                score[i] = score.get(i, 0.0) + w * x
        own = text.strip().casefold()
        nearest = heapq.nsmallest(
            k,
            (i for i in range(len(self.records)) if self.keys[i] != own),
            key=lambda i: (-score.get(i, 0.0), self.records[i].id),
        )
        return [self.records[i] for i in reversed(nearest)]


class NearestShotsFormatter(PromptFormatter):
    """A formatter whose demonstrations are chosen for each input (`NearestShots`): every
    method that renders an input renders it with its own K neighbours, chosen on the input
    as given (before any cut), so training-style encoding, evaluation prompts and inspect
    agree. `max_length` is the input's room plus the most any K demonstrations can add."""

    def __init__(self, fmt: PromptFormatter, index: NearestShots, task: TaskSpec, k: int,
                 budget: int):  # fmt: skip
        self.plain, self.index, self.k, self.budget = fmt, index, k, budget
        self._by_text: dict[str, PromptFormatter] = {}
        super().__init__(fmt.tok, task, fmt.max_length, fmt.truncation_side, fmt.loss_on)
        # what a demonstration adds: its text (at most an input's room) and answer, plus the
        # turns around them (measured once on a short pair) and a token or two of merging
        pair = fmt.with_shots([("x", "y")], budget).max_length - fmt.max_length
        turns = pair - len(fmt._ids("x")) - len(fmt._ids("y"))
        cost = [
            min(len(fmt._ids(r.text)), fmt.max_length)
            + len(fmt._ids(answer_text(task, r.label, r.target)))
            + turns
            + 2
            for r in index.records
        ]
        self.max_length = fmt.max_length + sum(sorted(cost)[-k:])

    def for_input(self, text: str) -> PromptFormatter:
        got = self._by_text.get(text)
        if got is None:
            picked = self.index.pick(text, self.k)
            shots = [(r.text, answer_text(self.task, r.label, r.target)) for r in picked]
            got = self.plain.with_shots(shots, self.budget)
            got.shot_ids = [r.id for r in picked]  # type: ignore[attr-defined]
            self._by_text[text] = got
        return got

    def shot_ids_for(self, text: str) -> list[str]:
        return self.for_input(text).shot_ids  # type: ignore[attr-defined]

    def prompt_text(self, text: str, context: Turns = ()) -> str:
        return self.for_input(text).prompt_text(text, context)

    def full_text(self, text: str, answer: str, context: Turns = ()) -> str:
        return self.for_input(text).full_text(text, answer, context)

    def fit_text(self, text: str, answer_budget: int) -> tuple[str, int]:
        return self.for_input(text).fit_text(text, answer_budget)

    def prompt_and_cut(
        self, text: str, answer_budget: int, context: Turns = ()
    ) -> tuple[list[int], int]:
        return self.for_input(text).prompt_and_cut(text, answer_budget, context)

    def encode(self, text: str, answer: str, answer_budget: int, context: Turns = ()):
        return self.for_input(text).encode(text, answer, answer_budget, context)

    def uncut_prompt_tokens(self, text: str, context: Turns = ()) -> int:
        return self.for_input(text).uncut_prompt_tokens(text, context)


def _within_context(what: str, added: int, room: int, context: int, where: str = "every prompt"):
    """Refused (exit 2) when the demonstrations push the longest prompt past the context."""
    if room + added > context:
        raise UsageError(
            f"--shots {what} {added} tokens to {where}, {room + added} with data.max_length "
            f"({room}): more than the model's context ({context}); use fewer shots or a "
            "smaller data.max_length"
        )


def few_shot_formatter(
    fmt: PromptFormatter, train: list[Record], task: TaskSpec, k: int, seed: int, budget: int,
    context: int, selection: str = "fixed",
) -> tuple[PromptFormatter, dict]:  # fmt: skip
    """`fmt` with K demonstrations from `train` before every prompt, and what the protocol
    records of them. `selection` fixed: the same K for every input (`pick_shots`); similar:
    each input's K nearest (`NearestShots`). Refused when the longest prompt would pass the
    model's context."""
    if not train:
        raise UsageError(f"--shots {k}: the training split has no examples to show")
    if selection == "similar":
        near = NearestShotsFormatter(fmt, NearestShots(train), task, min(k, len(train)), budget)
        added = near.max_length - fmt.max_length
        what = f"{k} (eval.few_shot_selection: similar): the {k} longest demonstrations would add"
        _within_context(what, added, fmt.max_length, context, "a prompt")
        info = {
            "k": near.k,
            "selection": "similar",
            "similarity": "tf-idf cosine of the input's words, nearest last",
            "prompt_tokens_added_max": added,
            "max_length": near.max_length,
        }
        return near, info
    picked = pick_shots(train, k, seed)
    shot_fmt = fmt.with_shots(
        [(r.text, answer_text(task, r.label, r.target)) for r in picked], budget
    )
    added = shot_fmt.max_length - fmt.max_length
    _within_context(f"{k}: the {len(picked)} demonstrations add", added, fmt.max_length, context)
    info = {
        "k": len(picked),
        "seed": seed,
        "ids": [r.id for r in picked],
        "categories": [r.category for r in picked],
        "prompt_tokens_added": added,
        "max_length": shot_fmt.max_length,
    }
    return shot_fmt, info
