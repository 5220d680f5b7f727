"""Image pilots: the resolved transform pipeline is the preprocessing; the data report adds
the image properties per split and category and the shortcut warnings; `inspect` writes a
contact sheet per category (originals beside what the model sees)."""

from __future__ import annotations

import io
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.base.models import image_processor_config
from lorapilot.data.audit import sample_per_category
from lorapilot.data.dataset import PreparedData, prepare_image_data
from lorapilot.data.images import load_record_image
from lorapilot.data.imagestats import (
    describe_pixel_changes,
    describe_shortcut,
    image_stats,
    pixel_changes,
    shortcut_warnings,
)
from lorapilot.data.shots import refuse_shots_for_images
from lorapilot.data.summary import shared_report
from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_bytes
from lorapilot.modality.image_transforms import ImagePipeline, contact_sheet, resolve_pipeline
from lorapilot.modality.trainee import Loaded, Trainee, training_records
from lorapilot.spec import AdapterSpec, Pilot


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
        pixels = pixel_changes(records)
        notes = [describe_shortcut(w) for w in shortcuts] + describe_pixel_changes(pixels)
        report = shared_report(self.pilot, prepared, notes)
        return report | {
            "images": image_stats(prepared.splits),
            "pixels": pixels,
            "shortcuts": shortcuts,
            "transforms": self.pipeline.to_dict(),
        }

    def failed_check(self, report: dict[str, Any]) -> str | None:
        return None

    def inspect(
        self,
        prepared: PreparedData,
        split: str,
        per_category: int,
        seed: int,
        out: Path | None,
        shots: int = 0,
    ) -> dict[str, Any]:
        """Per category: its image statistics and a contact sheet PNG (`out`, default
        PILOT/inspect/) of sampled examples, original beside transformed."""
        refuse_shots_for_images(self.pilot.spec.task, shots)
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

    def examples(self, records: list, *, augment: bool = False) -> Any:
        """Records as an `ImageExamples` training set through this pilot's pipeline."""
        from lorapilot.modality.image_examples import ImageExamples

        task = self.pilot.spec.task
        assert task.image is not None
        return ImageExamples(
            self.pilot.dir, records, self.pipeline, list(task.labels or []), task.image.max_pixels,
            augment=augment,
        )  # fmt: skip

    def _evaluator(self, prepared: PreparedData, resolved: Any):
        """(model, records, label=, progress=, log=) -> (EvalResult, protocol)."""
        from lorapilot.evaluate.image_predict import evaluate_images, image_protocol

        def evaluate(
            model, records, *, label="eval", progress=True, log=None, plain=False, generation=None
        ):  # generation: a text check, nothing to generate here
            protocol = image_protocol(
                self.pilot.spec, self.pipeline, prepared.version, resolved.weights_sha256
            )
            ev = evaluate_images(
                model, self.examples(records), protocol, progress=progress, label=label, log=log
            )
            return ev, protocol

        return evaluate

    def trainee(
        self, *, adapter: AdapterSpec | None = None, smoke_per_category: int | None = None
    ) -> Trainee:
        """The classifier with a new head (seeded by train.seed), LoRA on the model's default
        targets unless the spec names them, the head always trained and saved."""
        from lorapilot.base.adapter import build_adapter
        from lorapilot.fsutil import sha256_json
        from lorapilot.modality.image_model import load_image_classifier, lora_targets

        pilot, spec = self.pilot, self.pilot.spec
        _refuse_unbuilt(pilot)
        resolved, model = load_image_classifier(pilot)
        prepared = self.prepare()
        train_recs, val_recs = training_records(
            prepared, smoke_per_category, spec.train.seed, spec.smoke
        )
        adapter = adapter or spec.adapter
        if adapter.method == "lora":
            saved = list(dict.fromkeys([*adapter.modules_to_save, model.head_path]))
            adapter = adapter.model_copy(
                update={
                    "target_modules": lora_targets(model, adapter.target_modules),
                    "modules_to_save": saved,
                }
            )
        model, info = build_adapter(model, adapter, seed=spec.train.seed, task_type=None)
        info["head"] = model_head(model)
        pipe = self.pipeline

        evaluate = self._evaluator(prepared, resolved)

        return Trainee(
            resolved=resolved,
            model=model,
            adapter_info=info,
            prepared=prepared,
            train_records=train_recs,
            train_set=self.examples(train_recs, augment=smoke_per_category is None),
            val_set=self.examples(val_recs),
            evaluate=evaluate,
            manifest_hashes={"transforms_sha256": sha256_json(pipe.to_dict())},
        )

    def load(
        self,
        adapter_dir: Path | None = None,
        manifest: dict | None = None,
        resolved: Any = None,
        shots: int = 0,
        linear_probe: bool = False,  # refused before loading: the baseline already is one
    ) -> Loaded:
        """The classifier with a new head, the saved adapter (and its saved head) on top.
        No few-shot prompting: the baseline is a linear probe on the frozen features."""
        refuse_shots_for_images(self.pilot.spec.task, shots)
        from lorapilot.base.models import attach_adapter, is_full_finetune
        from lorapilot.evaluate.image_predict import image_protocol
        from lorapilot.evaluate.image_session import probe_predictions
        from lorapilot.fsutil import sha256_json
        from lorapilot.modality.image_model import load_image_classifier

        pilot, spec, pipe = self.pilot, self.pilot.spec, self.pipeline
        resolved, model = load_image_classifier(pilot, resolved)
        full = adapter_dir is not None and is_full_finetune(Path(adapter_dir))
        problems = []
        if manifest is not None:
            now, then = sha256_json(pipe.to_dict()), manifest.get("transforms_sha256")
            if now != then:
                problems.append(
                    f"image transforms sha256 {now} differ from the ones trained with ({then})"
                )
        if adapter_dir is not None:
            model = attach_adapter(model, Path(adapter_dir))
        prepared = self.prepare()

        evaluate = self._evaluator(prepared, resolved)

        def evaluate_base(
            records, protocol, *, label="baseline", progress=True, log=None, label_issues=False
        ):
            # the probe reads the base's features: an adapter is switched off for them; a full
            # fine-tune replaced the weights, so the base is loaded again beside it
            base = load_image_classifier(pilot, resolved)[1] if full else model
            return probe_predictions(
                base, pilot, prepared, pipe, records, protocol, progress=progress, label=label,
                log=log, issues=label_issues,
            )  # fmt: skip

        protocol = image_protocol(spec, pipe, prepared.version, resolved.weights_sha256)
        return Loaded(resolved, model, prepared, evaluate, evaluate_base, problems, protocol)

    def adapter_problems(self, adapter_dir: Path, manifest: dict) -> list[str]:
        """The head must be in the saved adapter: a head left out is re-initialised at random
        on reload and gives chance accuracy (peft#2171, #577)."""
        head = (manifest.get("adapter") or {}).get("head")
        if manifest.get("method") != "lora":
            return []
        if not head:
            return ["the adapter's manifest names no classification head (adapter.head)"]
        return saved_head_problems(adapter_dir, head)


def saved_head_problems(adapter_dir: Path, head: str) -> list[str]:
    """Why the saved adapter would not restore the classification head (empty: it would)."""
    import json

    from safetensors import safe_open

    problems = []
    try:
        config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{adapter_dir / 'adapter_config.json'}: not readable ({e})"]
    saved = config.get("modules_to_save") or []
    if config.get("peft_type") == "LORA" and head not in saved:
        problems.append(
            f"the classification head {head} is not in the adapter's modules_to_save "
            f"({saved}): it would be re-initialised at random on reload"
        )
    weights = adapter_dir / "adapter_model.safetensors"
    if weights.is_file():
        with safe_open(str(weights), "pt") as f:
            keys = list(f.keys())
        if not any(f".{head}." in f".{k}" for k in keys):
            problems.append(
                f"the classification head {head} is missing from {weights.name}: reloaded, it "
                "would be a new random head (chance accuracy)"
            )
    return problems


def _refuse_unbuilt(pilot: Pilot) -> None:
    """Settings an image pilot cannot train with yet: refused up front (exit 2), by key."""
    t = pilot.spec.train
    for key, unbuilt, why in (
        ("train.grad_checkpointing", t.grad_checkpointing, "activation checkpointing"),
        ("train.distributed", t.distributed == "fsdp", "FSDP"),
    ):
        if unbuilt:
            raise UsageError(
                f"{pilot.spec_path}: {key}: {why} is not available for image pilots yet "
                "(LoRA with the head saved, or full fine-tuning, in one process or DDP, is)"
            )


def model_head(model: Any) -> str:
    """The classification head's module path in the base (what verify looks for)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.head_path


def _safe(name: str) -> str:
    """A category as a file name: letters, digits, . _ - kept, the rest as _."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80] or "_"
