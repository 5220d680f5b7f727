"""Text pilots: the prompt template, tokenisation and the loss mask (data/format.py) are the
preprocessing; `inspect` shows the tokens that carry the loss and checks they decode to the
answer."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from lorapilot.data.audit import example_view, sample_per_category
from lorapilot.data.dataset import PreparedData, encode_records, formatter_for, prepare_data
from lorapilot.data.summary import data_report
from lorapilot.models import load_tokenizer
from lorapilot.spec import Pilot


class TextModality:
    def __init__(self, pilot: Pilot):
        self.pilot = pilot

    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.pilot)[1]

    def prepare(self, *, enforce_leakage: bool = True) -> PreparedData:
        return prepare_data(self.pilot, self.tokenizer, enforce_leakage=enforce_leakage)

    def data_report(self, prepared: PreparedData) -> dict[str, Any]:
        return data_report(self.pilot, prepared, self.tokenizer)

    def failed_check(self, report: dict[str, Any]) -> str | None:
        return None if report["mask_audit"]["ok"] else "the loss-mask audit failed (see mask_audit)"

    def baseline(self, *, limit: int | None, progress: bool, log: Any) -> dict[str, Any]:
        """The unadapted model on val inside a `baseline` run."""
        from lorapilot.evaluate.session import evaluate_split

        return evaluate_split(
            self.pilot, "baseline", split="val", limit=limit, progress=progress, log=log
        )

    def inspect(
        self, prepared: PreparedData, split: str, per_category: int, seed: int, out: Path | None
    ) -> dict[str, Any]:
        spec = self.pilot.spec
        fmt = formatter_for(self.pilot, self.tokenizer)
        recs = prepared.splits.get(split) or []
        views = []
        for rec in sample_per_category(recs, per_category, seed):
            enc = encode_records(fmt, spec.task, [rec], prepared.answer_budget)[0]
            views.append(example_view(fmt, rec, enc, split))
        return {
            "ok": all(v["match"] for v in views),
            "version": prepared.version,
            "split": split,
            "categories": sorted({r.category for r in recs}),
            "examples": views,
        }
