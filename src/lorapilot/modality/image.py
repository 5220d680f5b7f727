"""Image pilots: the resolved transform pipeline is the preprocessing; the data report adds
the image properties per split and category and the shortcut warnings; `inspect` writes a
contact sheet per category (originals beside what the model sees)."""

from __future__ import annotations

import io
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.data.audit import sample_per_category
from lorapilot.data.dataset import PreparedData, prepare_image_data
from lorapilot.data.images import load_record_image
from lorapilot.data.imagestats import describe_shortcut, image_stats, shortcut_warnings
from lorapilot.data.summary import shared_report
from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_bytes
from lorapilot.modality.image_transforms import ImagePipeline, contact_sheet, resolve_pipeline
from lorapilot.models import image_processor_config
from lorapilot.spec import Pilot


class ImageModality:
    def __init__(self, pilot: Pilot):
        self.pilot = pilot

    @cached_property
    def pipeline(self) -> ImagePipeline:
        spec = self.pilot.spec.task.image
        assert spec is not None
        try:
            processor = image_processor_config(self.pilot)
        except UsageError as e:
            if spec.size is None or (spec.normalize == "from_model" and spec.mean is None):
                raise UsageError(
                    f"{e}; the image transforms are taken from the model where task.image is "
                    "silent (or set task.image.size and .mean/.std)"
                ) from None
            processor = None
        return resolve_pipeline(spec, processor)

    def prepare(self, *, enforce_leakage: bool = True) -> PreparedData:
        return prepare_image_data(
            self.pilot, self.pipeline.to_dict(), enforce_leakage=enforce_leakage
        )

    def data_report(self, prepared: PreparedData) -> dict[str, Any]:
        records = [r for recs in prepared.splits.values() for r in recs]
        shortcuts = shortcut_warnings(records)
        report = shared_report(self.pilot, prepared, [describe_shortcut(w) for w in shortcuts])
        return report | {
            "images": image_stats(prepared.splits),
            "shortcuts": shortcuts,
            "transforms": self.pipeline.to_dict(),
        }

    def failed_check(self, report: dict[str, Any]) -> str | None:
        return None

    def baseline(self, *, limit: int | None, progress: bool, log: Any) -> dict[str, Any]:
        """A `baseline` run: the frozen base with a linear probe fitted on train, on val."""
        from lorapilot.evaluate.image_session import evaluate_image_baseline
        from lorapilot.steprun import open_run

        with open_run(self.pilot, "baseline") as run:
            prepared = self.prepare()
            run.record.data_version = prepared.version
            out = evaluate_image_baseline(
                self.pilot, run, prepared, self.pipeline, limit=limit, progress=progress,
                log=log,
            )  # fmt: skip
            run.update(**out)
        return {"run_id": run.id, "status": run.record.status, **out}

    def inspect(
        self, prepared: PreparedData, split: str, per_category: int, seed: int, out: Path | None
    ) -> dict[str, Any]:
        """Per category: its image statistics and a contact sheet PNG (`out`, default
        PILOT/inspect/) of sampled examples, original beside transformed."""
        pipe = self.pipeline
        recs = prepared.splits.get(split) or []
        out = out or self.pilot.dir / "inspect"
        out.mkdir(parents=True, exist_ok=True)
        expected = [pipe.channels, pipe.size, pipe.size]
        stats = image_stats({split: recs})["per_split"][split]
        rows: dict[str, list] = {}
        examples = []
        for rec in sample_per_category(recs, per_category, seed):
            assert rec.image is not None  # read and checked by `prepare`
            meta = rec.image
            img = load_record_image(self.pilot.dir, rec, self.pilot.spec.task.image.max_pixels)
            x = pipe(img)
            shown = pipe.view(x)
            examples.append(
                {
                    "id": rec.id,
                    "split": split,
                    "category": rec.category,
                    "label": rec.label,
                    "source": rec.source,
                    "original": {
                        k: getattr(meta, k) for k in ("width", "height", "mode", "format")
                    },
                    "transformed": {
                        "shape": list(x.shape),
                        "min": round(float(x.min()), 4),
                        "max": round(float(x.max()), 4),
                        "mean": round(float(x.mean()), 4),
                    },
                    "match": list(x.shape) == expected and bool(np.isfinite(x).all()),
                }
            )
            caption = f"{rec.id[-28:]} {meta.width}x{meta.height} {meta.mode}"
            rows.setdefault(rec.category, []).append((img, shown, caption))
        per_category = {}
        used: set[str] = set()
        for cat, cat_rows in sorted(rows.items()):
            sheet = contact_sheet(cat_rows, f"{cat} ({split}): original | model input")
            name = _safe(cat)
            while name in used:  # two labels with the same file-safe name ("a b", "a_b")
                name += "_"
            used.add(name)
            path = out / f"contact-{name}.png"
            buf = io.BytesIO()
            sheet.save(buf, format="PNG")
            atomic_write_bytes(path, buf.getvalue())
            per_category[cat] = {**stats.get(cat, {}), "contact_sheet": str(path)}
        # the shortcut check looks at every split, as `data` does: a sample is too small
        shortcuts = shortcut_warnings([r for rs in prepared.splits.values() for r in rs])
        return {
            "ok": all(e["match"] for e in examples),
            "version": prepared.version,
            "split": split,
            "categories": sorted({r.category for r in recs}),
            "transforms": pipe.to_dict(),
            "per_category": per_category,
            "examples": examples,
            "warnings": [describe_shortcut(w) for w in shortcuts],
            "shortcuts": shortcuts,
        }


def _safe(name: str) -> str:
    """A category as a file name: letters, digits, . _ - kept, the rest as _."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80] or "_"
