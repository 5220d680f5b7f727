"""The `data` and `inspect` verbs: the data report as a run record, and the examples view."""

from __future__ import annotations

import dataclasses
from typing import Any

from lorapilot import environment, registry
from lorapilot.data.audit import example_view, length_stats, mask_audit, sample_per_category
from lorapilot.data.dataset import (
    PreparedData,
    check_leakage,
    encode_records,
    formatter_for,
    prepare_data,
    remaining_leaks,
)
from lorapilot.errors import CheckFailed
from lorapilot.spec import Pilot


def load_tokenizer(pilot: Pilot) -> tuple[Any, Any]:
    """(resolved base, tokenizer) for the pilot's base model, offline."""
    from transformers import AutoTokenizer

    from lorapilot.models import resolve_base

    m = pilot.spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    tok = AutoTokenizer.from_pretrained(
        resolved.path, local_files_only=True, trust_remote_code=m.trust_remote_code
    )
    return resolved, tok


def data_report(pilot: Pilot, prepared: PreparedData, tokenizer: Any) -> dict[str, Any]:
    """Everything the `data` verb writes: the pilot's written data limit and its checks."""
    spec = pilot.spec
    fmt = formatter_for(pilot, tokenizer)
    encoded = {
        s: encode_records(fmt, spec.task, recs, prepared.answer_budget)
        for s, recs in prepared.splits.items()
    }
    counts = prepared.counts()
    per_category: dict[str, dict[str, int]] = {}
    for split, cats in counts.items():
        for cat, n in cats.items():
            per_category.setdefault(cat, {s: 0 for s in counts})[split] = n
    leaks = remaining_leaks(pilot, prepared)
    dups = prepared.duplicates.to_dict()
    dups["cross_split"] = leaks
    dups["n_cross_split"] = len(leaks)
    dups["leakage_policy"] = spec.data.leakage
    dups["dropped_from_train"] = prepared.leak_dropped
    return {
        "version": prepared.version,
        "source": spec.data.source,
        "permission": spec.data.permission,
        "n_examples": sum(len(v) for v in prepared.splits.values()),
        "splits": {s: len(v) for s, v in prepared.splits.items()},
        "per_category": per_category,
        "duplicates": dups,
        "lengths": length_stats(encoded, spec.data.max_length),
        "skipped": [dataclasses.asdict(s) for s in prepared.skipped],
        "dropped_by_cleaning": prepared.dropped,
        "target_excluded": prepared.target_excluded,
        "answer_budget_tokens": prepared.answer_budget,
        "mask_audit": mask_audit(fmt, prepared.splits, encoded, prepared.answer_budget),
    }


def require_permission(pilot: Pilot) -> None:
    d = pilot.spec.data
    missing = [k for k in ("source", "permission") if not (getattr(d, k) or "").strip()]
    if missing:
        from lorapilot.errors import UsageError

        raise UsageError(
            f"{pilot.spec_path}: {', '.join('data.' + k for k in missing)} must be stated: where the data "
            "comes from and the permission to use it (a licence or an internal approval)"
        )


def run_data(pilot: Pilot) -> dict[str, Any]:
    """Load, validate, clean, version, split, find leaks, measure lengths, audit the mask."""
    require_permission(pilot)
    spec = pilot.spec
    with registry.open_run(
        pilot.dir,
        "data",
        spec_hash=spec.spec_hash(),
        config=spec.model_dump(mode="json"),
        environment=environment.snapshot(),
    ) as run:
        _, tok = load_tokenizer(pilot)
        prepared = prepare_data(pilot, tok, enforce_leakage=False)
        report = data_report(pilot, prepared, tok)
        run.record.data_version = prepared.version
        run.update(**report)
        try:
            check_leakage(pilot, prepared)  # the one place the leak message is written
        except CheckFailed as e:
            raise CheckFailed(str(e), {"run_id": run.id, **report}) from None
        if not report["mask_audit"]["ok"]:
            raise CheckFailed(
                "the loss-mask audit failed (see mask_audit)", {"run_id": run.id, **report}
            )
    return {"run_id": run.id, "status": run.record.status, **report}


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
