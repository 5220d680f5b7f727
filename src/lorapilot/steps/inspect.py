"""`lorapilot inspect`: examples per category after the exact preprocessing (template,
truncation, the tokens that carry the loss), each checked to decode to its answer. No run
record: it writes nothing."""

from __future__ import annotations

from typing import Any

from lorapilot.data.audit import example_view, sample_per_category
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.models import load_tokenizer
from lorapilot.spec import Pilot


def run_inspect(
    pilot: Pilot, per_category: int = 2, split: str = "train", seed: int = 0
) -> dict[str, Any]:
    """Sampled examples per category after the exact preprocessing, with their loss check."""
    spec = pilot.spec
    _, tok = load_tokenizer(pilot)
    prepared = prepare_data(pilot, tok, enforce_leakage=False)
    fmt = formatter_for(pilot, tok)
    recs = prepared.splits.get(split) or []
    sample = sample_per_category(recs, per_category, seed)
    views = []
    for rec in sample:
        enc = encode_records(fmt, spec.task, [rec], prepared.answer_budget)[0]
        views.append(example_view(fmt, rec, enc, split))
    return {
        "ok": all(v["match"] for v in views),
        "version": prepared.version,
        "split": split,
        "categories": sorted({r.category for r in recs}),
        "examples": views,
    }
