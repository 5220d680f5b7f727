"""The GPU classes `budget --gpu` plans onto (gpus.json, and `--gpu-spec FILE` for more) and
the time model's calibration (calibration.json), read from the package's data files; and
how a calibration row is predicted, so the bench and the tests check the stored constants
against the measurements they came from."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

from lorapilot.errors import UsageError
from lorapilot.sizing.memory import ModelShape
from lorapilot.sizing.probe_plan import lora_trainable_params
from lorapilot.sizing.timemodel import (
    Calibration,
    GpuClass,
    StepWork,
    eval_batch_seconds,
    step_seconds,
)
from lorapilot.spec import AdapterSpec

_FIELDS = {f.name for f in dataclasses.fields(GpuClass)}
BENCH_ADAPTER = AdapterSpec(r=16, target_modules="all-linear")  # the calibration rows' LoRA


def _data(name: str) -> dict:
    return json.loads(resources.files("lorapilot.sizing").joinpath(name).read_text("utf-8"))


def _classes_from(raw: Any, source: str) -> list[GpuClass]:
    items = raw.get("classes") if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items:
        raise UsageError(f"{source}: expected {{classes: [...]}} or a list of GPU classes")
    out = []
    for i, item in enumerate(items):
        where = f"{source}: classes[{i}]"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected a mapping")
        unknown = sorted(set(item) - _FIELDS)
        if unknown:
            raise UsageError(
                f"{where}: unknown key(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(_FIELDS))})"
            )
        for key in ("name", "memory_gib", "bf16_tflops", "bandwidth_gbs"):
            if key not in item:
                raise UsageError(f"{where}: {key} is required")
        try:
            out.append(GpuClass(**{"label": item["name"], **item}))
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: {e}") from None
    return out


def gpu_classes(spec_file: str | Path | None = None) -> list[GpuClass]:
    """The shipped classes, then those of `spec_file` (a class of the same name replaces the
    shipped one)."""
    classes = {c.name: c for c in _classes_from(_data("gpus.json"), "gpus.json")}
    if spec_file is not None:
        path = Path(spec_file)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(f"--gpu-spec {path}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--gpu-spec {path}: not a JSON file ({e})") from None
        for c in _classes_from(raw, f"--gpu-spec {path}"):
            classes[c.name] = c
    return list(classes.values())


def select(names: str, classes: list[GpuClass]) -> list[GpuClass]:
    """`all`, or comma-separated names (case-insensitive) -> the classes, in the order asked."""
    by_name = {c.name.lower(): c for c in classes}
    if names.strip().lower() == "all":
        return classes
    wanted = [n.strip().lower() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        raise UsageError(
            f"--gpu {names}: unknown GPU class {', '.join(unknown) or '(none given)'}; known: "
            f"{', '.join(by_name)} or all (--gpu-spec FILE adds classes)"
        )
    return [by_name[n] for n in wanted]


def calibration(kind: str = "gpu") -> Calibration:
    raw = _data("calibration.json")["kinds"][kind]
    return Calibration(**{f.name: raw[f.name] for f in dataclasses.fields(Calibration)})


def calibration_rows() -> tuple[list[dict], dict[str, ModelShape]]:
    """The measured rows behind the calibration and the model shapes they name."""
    data = _data("calibration.json")
    shapes = {k: ModelShape.from_config(v) for k, v in data["shapes"].items()}
    return data["rows"], shapes


def predict_row(row: dict, device: GpuClass, cal: Calibration, shape: ModelShape) -> float:
    """The time model's seconds for one calibration row (a training step or an eval batch)."""
    if row["what"] == "train_step":
        work = StepWork(
            rows=row["rows"],
            seq_len=row["seq_len"],
            shared_prefix=row["shared_prefix"],
            loss_positions=row["loss_positions"],
            trainable_params=lora_trainable_params(shape, BENCH_ADAPTER),
            grad_checkpointing=row["grad_checkpointing"],
            weight_bytes=row["weight_bytes"],
        )
        return step_seconds(device, cal, shape, work, row["precision"])["step_s"]
    return eval_batch_seconds(
        device,
        cal,
        shape,
        batch=row["batch"],
        prompt_len=row["prompt_len"],
        scored_tokens=row["scored_tokens"],
        new_tokens=row["new_tokens"],
        precision=row["precision"],
    )
