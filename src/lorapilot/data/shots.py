"""Demonstrations for a few-shot baseline: the base model prompted with K examples from the
training split, the cheap alternative an adapter has to beat to be worth its training."""

from __future__ import annotations

import random
from collections import Counter

from lorapilot.data.format import PromptFormatter, answer_text
from lorapilot.data.rows import Record
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


def few_shot_formatter(
    fmt: PromptFormatter, train: list[Record], task: TaskSpec, k: int, seed: int, budget: int,
    context: int,
) -> tuple[PromptFormatter, dict]:  # fmt: skip
    """`fmt` with K demonstrations from `train` before every prompt, and what the protocol
    records of them. Refused when the longest prompt would pass the model's context."""
    picked = pick_shots(train, k, seed)
    if not picked:
        raise UsageError(f"--shots {k}: the training split has no examples to show")
    shot_fmt = fmt.with_shots(
        [(r.text, answer_text(task, r.label, r.target)) for r in picked], budget
    )
    added = shot_fmt.max_length - fmt.max_length
    if shot_fmt.max_length > context:
        raise UsageError(
            f"--shots {k}: the {len(picked)} demonstrations add {added} tokens to every prompt, "
            f"{shot_fmt.max_length} with data.max_length ({fmt.max_length}): more than the "
            f"model's context ({context}); use fewer shots or a smaller data.max_length"
        )
    info = {
        "k": len(picked),
        "seed": seed,
        "ids": [r.id for r in picked],
        "categories": [r.category for r in picked],
        "prompt_tokens_added": added,
        "max_length": shot_fmt.max_length,
    }
    return shot_fmt, info
