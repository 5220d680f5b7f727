"""Lengths and the loss-mask audit over the whole dataset, and per-example inspection.

The sampled `inspect` view is for eyes; the audit is the check: every example is encoded
exactly as training will encode it, and the tokens carrying the loss are decoded and
compared with the answer written in the data.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from lorapilot.data.format import Encoded, PromptFormatter
from lorapilot.data.rows import Record


def _percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    s = sorted(values)
    idx = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[idx]


def length_stats(encoded: dict[str, list[Encoded]], max_length: int) -> dict[str, dict]:
    """Token counts per split: p50/p95/max, how many inputs were cut, targets that cannot fit."""
    out = {}
    for split, encs in encoded.items():
        n = [e.n_tokens for e in encs]
        out[split] = {
            "n": len(encs),
            "p50": _percentile(n, 50),
            "p95": _percentile(n, 95),
            "max": max(n) if n else 0,
            "max_length": max_length,
            "n_truncated": sum(e.truncated for e in encs),
            "n_target_truncated": sum(e.target_truncated for e in encs),
            "target_tokens": sum(len(e.loss_positions) for e in encs),
            "tokens": sum(n),
        }
    return out


def truncation_report(
    encoded: dict[str, list[Encoded]],
    splits: dict[str, list[Record]],
    max_length: int,
    policy: str,
    *,
    answer_room: int,
    uncut_prompt_tokens: Callable[[Record], int],
    shown: int = 20,
) -> dict[str, Any]:
    """The inputs `max_length` cut, counted per split and per category, with their ids and
    the length that would fit every example whole. Every prompt is cut to leave room for the
    *longest* answer (the evaluation prompt must not depend on the example's own answer), so
    that length is the longest uncut prompt plus that room (`fits_at`), not the longest
    example (`longest_tokens`, the cut ones counted uncut)."""
    per_split: dict[str, int] = {}
    per_category: dict[str, dict[str, int]] = {}
    ids: list[str] = []
    longest = longest_prompt = lost_turns = 0
    for split, encs in encoded.items():
        for rec, enc in zip(splits.get(split, []), encs, strict=True):
            longest = max(longest, enc.n_tokens + enc.n_text_tokens_cut)
            prompt = uncut_prompt_tokens(rec) if enc.truncated else enc.prompt_len
            longest_prompt = max(longest_prompt, prompt)
            if not enc.truncated:
                continue
            per_split[split] = per_split.get(split, 0) + 1
            cats = per_category.setdefault(split, {})
            cats[rec.category] = cats.get(rec.category, 0) + 1
            n, turns = enc.n_text_tokens_cut, enc.extra.get("turns_dropped", 0)
            lost_turns += turns > 0
            gone = f", its {turns} oldest turns let go" if turns else ""
            ids.append(f"{rec.id} ({split}, {n} token{'' if n == 1 else 's'} cut{gone})")
    return {
        "max_length": max_length,
        "policy": policy,
        "n_truncated": sum(per_split.values()),
        "per_split": per_split,
        "per_category": per_category,
        # conversations that lost earlier turns (oldest first) to fit, within n_truncated
        "n_lost_turns": lost_turns,
        "examples": ids[:shown],
        "longest_tokens": longest,
        "longest_prompt_tokens": longest_prompt,
        "answer_room_tokens": answer_room,
        "fits_at": longest_prompt + answer_room,
    }


def expected_target(fmt: PromptFormatter, enc: Encoded) -> str:
    """What the loss positions must decode to, built from strings, not from the ids checked."""
    eot = (
        fmt.tok.convert_ids_to_tokens(enc.end_of_turn_id) if enc.end_of_turn_id is not None else ""
    )
    if fmt.loss_on == "all":
        return fmt.prompt_text(enc.extra["text"], enc.extra.get("context", ())) + enc.answer + eot
    return enc.answer + eot


def decoded_target(fmt: PromptFormatter, enc: Encoded) -> str:
    return fmt.tok.decode([enc.input_ids[i] for i in enc.loss_positions])


def example_view(fmt: PromptFormatter, rec: Record, enc: Encoded, split: str) -> dict[str, Any]:
    """One example after the exact preprocessing, with its loss check (the inspect JSON row)."""
    dec, exp = decoded_target(fmt, enc), expected_target(fmt, enc)
    pos = enc.loss_positions
    return {
        "id": rec.id,
        "split": split,
        "category": rec.category,
        "source": rec.source,
        "n_tokens": enc.n_tokens,
        "prompt_tokens": enc.prompt_len,
        "loss_positions": pos,
        "decoded_target": dec,
        "expected_target": exp,
        "match": dec == exp,
        "truncated": enc.truncated,
        "target_truncated": enc.target_truncated,
        "tokens_cut": enc.n_text_tokens_cut,
        "rendered": fmt.tok.decode(enc.input_ids),
        "pieces": [fmt.tok.decode([i]) for i in enc.input_ids],
    }


def mask_audit(
    fmt: PromptFormatter,
    records: dict[str, list[Record]],
    encoded: dict[str, list[Encoded]],
    budget: int,
) -> dict[str, Any]:
    """Check every example: loss tokens decode to the answer, the eval prompt is the training
    prefix, nothing has zero loss tokens, the end-of-turn token is trained."""
    total = loss = 0
    zero_loss: list[str] = []
    mismatched: list[dict] = []
    prompt_differs: list[str] = []
    eot_missing: list[str] = []
    cut: list[str] = []
    for split, encs in encoded.items():
        for rec, enc in zip(records[split], encs, strict=True):
            total += enc.n_tokens
            loss += len(enc.loss_positions)
            if not enc.loss_positions:
                zero_loss.append(rec.id)
            if enc.target_truncated:
                cut.append(rec.id)
            dec, exp = decoded_target(fmt, enc), expected_target(fmt, enc)
            if dec != exp:
                mismatched.append({"id": rec.id, "decoded": dec[-200:], "expected": exp[-200:]})
            if enc.end_of_turn_id is None or enc.labels[-1] != enc.end_of_turn_id:
                eot_missing.append(rec.id)
            if fmt.encode_prompt(rec.text, budget, rec.context) != enc.prompt_ids:
                prompt_differs.append(rec.id)
    n = sum(len(v) for v in encoded.values())
    ok = not (zero_loss or mismatched or prompt_differs or cut)
    return {
        "ok": ok,
        "n_examples": n,
        "loss_on": fmt.loss_on,
        "loss_token_fraction": round(loss / total, 4) if total else 0.0,
        "zero_loss_examples": zero_loss,
        "mismatched": mismatched[:20],
        "n_mismatched": len(mismatched),
        "answers_cut": cut,
        "end_of_turn_trained": not eot_missing,
        "n_end_of_turn_missing": len(eot_missing),
        "eval_prompt_is_train_prefix": not prompt_differs,
        "n_prompt_differs": len(prompt_differs),
    }


def sample_per_category(records: list[Record], per_category: int, seed: int = 0) -> list[Record]:
    """A seeded sample of `per_category` records from every category, in category order."""
    by_cat: dict[str, list[Record]] = {}
    for r in records:
        by_cat.setdefault(r.category, []).append(r)
    rng = random.Random(seed)
    out = []
    for cat in sorted(by_cat):
        recs = sorted(by_cat[cat], key=lambda r: r.id)
        out += rng.sample(recs, min(per_category, len(recs)))
    return out


def smoke_sample(
    records: list[Record], per_category: int, min_n: int, max_n: int, seed: int = 0
) -> list[Record]:
    """The smoke's examples: `per_category` from every category, topped up to `min_n` from
    the other records when the categories are few, cut to a seeded `max_n` when they are many
    (a smoke proves wiring: it need not see every one of 77 labels)."""
    few = sample_per_category(records, per_category, seed)
    rng = random.Random(seed)
    if len(few) < min_n:
        taken = {r.id for r in few}
        rest = sorted((r for r in records if r.id not in taken), key=lambda r: r.id)
        few += rng.sample(rest, min(min_n - len(few), len(rest)))
    if len(few) > max_n:
        few = sorted(rng.sample(few, max_n), key=lambda r: (r.category, r.id))
    return few
