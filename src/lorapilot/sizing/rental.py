"""`lorapilot budget PILOT --gpu NAME[,NAME...]|all`: the whole plan set onto GPU classes
before anything is rented, from the base's config.json and tokenizer alone (no weights).

For each class: the micro-batch x grad-accum (the spec's effective batch kept) and the
checkpointing setting that fit its memory, tried in this order: the spec's own settings,
checkpointing switched on, then the micro-batch halved (grad-accum doubled) with each; the
peaks of the training step at the long length and of an evaluation batch from the memory
model (sizing/memory.py, the GPU basis); the step time at the typical length from the time
model (sizing/timemodel.py), then every phase of the plan as `run` does it (baseline, smoke,
one probe per step shape, every variant's train run with its evaluations, checkpoints and
verify, the final test), which of 3/7/30 days it fits, and its cost at the user's price only.

A class fits when the larger peak is within HEADROOM of its memory. The figures are the
time model's extrapolation from the H200 rows it was calibrated on (calibration.json): a
hypothesis until `lorapilot probe` measures the step on the rented machine."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from lorapilot.base.models import load_tokenizer
from lorapilot.base.quantize import weight_bytes_per_param
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.decision.plan import step_shape, variant_pilots
from lorapilot.errors import UsageError
from lorapilot.sizing.budget import (
    RENTAL_DAYS,
    ProbeFigures,
    estimate_run,
    plan_fits,
    smoke_steps_of,
)
from lorapilot.sizing.gpus import calibration
from lorapilot.sizing.memory import (
    GIB,
    ModelShape,
    decoder_linear_params,
    estimate_eval_memory,
    estimate_step_memory,
)
from lorapilot.sizing.probe_plan import (
    held_linear_bytes_of,
    lora_trainable_params,
    quantized_memory,
    target_lengths,
    weight_bytes_of,
)
from lorapilot.sizing.timemodel import GpuClass, StepWork, eval_batch_seconds, step_seconds
from lorapilot.spec import Pilot
from lorapilot.train.batches import example_target_tokens
from lorapilot.train.loss import GPU_MIN_SPARED_WORK

HEADROOM = 0.92  # of a class's memory: the CUDA context, the driver and fragmentation take the rest
DISK_GBS = 1.0  # reading the base from a rented machine's local disk, GB/s (an assumption)
LOAD_FIXED_S = 5.0  # importing torch/transformers/peft and building the model, before the weights
CHECKPOINT_GBS = 0.5  # writing an adapter checkpoint with its optimizer state, GB/s (assumed)
PROBE_STEPS = 6 + 2  # per length: the measured steps and warm-up `run`'s probe takes, rounded up
PROBE_EVAL_EXAMPLES = 32
CALIBRATED = {"h200"}  # classes with measured rows in calibration.json


@dataclass(frozen=True)
class PilotShape:
    """What the plan's arithmetic needs of the pilot, without weights."""

    shape: ModelShape
    typical: int
    long: int
    prefix: int
    """Tokens every training prompt shares (chat header, system prompt, template start)."""
    loss_positions: int
    prompt_typical: int
    prompt_long: int
    answer_max: int
    label_tokens: tuple[int, ...]
    sizes: dict


def _common_prefix(rows: list[list[int]]) -> int:
    if not rows:
        return 0
    first, n = rows[0], min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != first[i] for r in rows):
            return i
    return n


def gather(pilot: Pilot) -> PilotShape:
    """The base's shape from its config.json, the lengths from the pilot's tokenized data."""
    if pilot.spec.task.modality == "image":
        raise UsageError(
            f"{pilot.spec_path}: task.kind: image_classification: budget --gpu plans text "
            "pilots (the image memory model is not written yet); run `lorapilot probe` on the "
            "machine instead"
        )
    resolved, tok = load_tokenizer(pilot, weights=False)
    config_path = resolved.path / "config.json"
    try:
        shape = ModelShape.from_config(json.loads(config_path.read_text(encoding="utf-8")))
    except (ValueError, json.JSONDecodeError) as e:
        raise UsageError(f"{config_path}: {e}") from None
    prepared = prepare_data(pilot, tok, enforce_leakage=False)
    fmt = formatter_for(pilot, tok)
    train = encode_records(fmt, pilot.spec.task, prepared.splits["train"], prepared.answer_budget)
    if not train:
        raise UsageError(f"{pilot.spec_path}: the train split is empty: nothing to plan")
    lengths = [e.n_tokens for e in train]
    targets = target_lengths(lengths, fmt.max_length)
    prompts = sorted(e.prompt_len for e in train)
    answers = [e.n_tokens - e.prompt_len for e in train]
    labels = pilot.spec.task.labels or []
    label_tokens = tuple(len(tok(lab, add_special_tokens=False)["input_ids"]) for lab in labels)
    return PilotShape(
        shape=shape,
        typical=targets["typical"],
        long=targets["long"],
        prefix=_common_prefix([e.input_ids for e in train[:256]]),
        loss_positions=max(1, round(statistics.median(example_target_tokens(e) for e in train))),
        prompt_typical=int(statistics.median(prompts)),
        prompt_long=prompts[-1],
        answer_max=max(answers),
        label_tokens=label_tokens or (1,),
        sizes={s: len(v) for s, v in prepared.splits.items()},
    )


def _precision(spec_value: str) -> str:
    return "bf16" if spec_value == "auto" else spec_value  # every listed class computes in bf16


def _settings(micro_batch: int, grad_accum: int, ckpt: bool) -> list[tuple[int, int, bool]]:
    """(micro_batch, grad_accum, checkpointing) to try, the spec's first, the effective batch
    kept: checkpointing on, then the micro-batch halved while it divides the batch."""
    out, mb, ga = [], micro_batch, grad_accum
    while mb >= 1:
        for c in (ckpt, True):
            if (mb, ga, c) not in out:
                out.append((mb, ga, c))
        if mb % 2:
            break
        mb, ga = mb // 2, ga * 2
    return out


def _shared(ps: PilotShape, rows: int, kind: str, setting: str) -> int:
    """Prefix tokens the step computes once, as `train.shared_prefix` decides on this kind of
    device (train/loss.py's rule)."""
    if setting == "off" or ps.prefix == 0 or rows < 2:
        return 0
    if setting == "on" or kind == "cpu":
        return ps.prefix
    layer = (ps.shape.n_params - ps.shape.vocab * ps.shape.hidden) / ps.shape.n_layers
    return ps.prefix if (rows - 1) * ps.prefix * layer >= GPU_MIN_SPARED_WORK else 0


def _train_peak(ps: PilotShape, spec, mb: int, ckpt: bool, precision: str, shared: int) -> int:
    est = estimate_step_memory(
        ps.shape,
        trainable_params=_trainable(ps.shape, spec),
        weight_dtype_bytes=weight_bytes_of(spec),
        micro_batch=mb,
        seq_len=ps.long,
        precision=precision,
        grad_checkpointing=ckpt,
        loss_positions_per_example=ps.loss_positions
        if spec.train.loss_on == "completion"
        else None,
        adapter=spec.adapter.method,
        adapted_modules=spec.adapter.target_modules,
        lora_rank=spec.adapter.r,
        lora_dropout=spec.adapter.dropout,
        dora=spec.adapter.dora,
        lora_forward=spec.train.lora_forward,
        **quantized_memory(spec.model.quantization),
        shared_prefix_tokens=shared,
        grad_accum=1,
        held_linear_bytes=held_linear_bytes_of(spec, "cuda", train=precision),
    )
    return est["total"]


def _eval_peak(ps: PilotShape, spec) -> int:
    """An evaluation batch's peak: the model in 16 bits, or a quantized base's decoder linears
    at their quantized size (the rest in 16 bits)."""
    generate = spec.task.kind != "classification" or spec.eval.mode == "generate"
    est = estimate_eval_memory(
        ps.shape,
        batch_size=spec.eval.batch_size,
        prompt_len=ps.prompt_long,
        dtype_bytes=2,
        mode="generate" if generate else "score",
        label_tokens=list(ps.label_tokens),
        max_new_tokens=ps.answer_max + 16 if generate else 0,
    )
    q = spec.model.quantization
    if q is None:
        return est["total"]
    linear = decoder_linear_params(ps.shape)
    quantized = linear * weight_bytes_per_param(q) + (ps.shape.n_params - linear) * 2
    return est["total"] - est["weights"] + int(quantized)


def _trainable(shape: ModelShape, spec) -> int:
    if spec.adapter.method == "full":
        return shape.n_params
    return lora_trainable_params(shape, spec.adapter)


def _step_work(ps: PilotShape, spec, mb: int, ckpt: bool, shared: int) -> StepWork:
    q = spec.model.quantization
    held = held_linear_bytes_of(spec, "cuda", train=_precision(spec.train.precision))
    return StepWork(
        rows=mb,
        seq_len=ps.typical,
        shared_prefix=shared,
        loss_positions=ps.loss_positions,
        trainable_params=_trainable(ps.shape, spec),
        grad_checkpointing=ckpt,
        full_finetune=spec.adapter.method == "full",
        weight_bytes=weight_bytes_per_param(q) if q is not None else held or weight_bytes_of(spec),
        quantized=q is not None,
    )


def _eval_rate(gpu: GpuClass, cal, ps: PilotShape, spec) -> float:
    """Evaluation examples per second with the pilot's protocol."""
    generate = spec.task.kind != "classification" or spec.eval.mode == "generate"
    batch = spec.eval.batch_size
    s = eval_batch_seconds(
        gpu,
        cal,
        ps.shape,
        batch=batch,
        prompt_len=ps.prompt_typical,
        scored_tokens=0 if generate else sum(ps.label_tokens),
        new_tokens=(ps.answer_max + 1) if generate else 0,
        precision="bf16",
    )
    return batch / s


def _variant_on(gpu: GpuClass, cal, ps: PilotShape, vp: Pilot) -> dict:
    """One variant's train run on one class: the first setting that fits, its step time and
    its run time (evaluations, checkpoints, verify and the margin included)."""
    spec = vp.spec
    precision = _precision(spec.train.precision)
    eval_peak = _eval_peak(ps, spec)
    usable = HEADROOM * gpu.memory_gib * GIB
    tried = []
    chosen = None
    for mb, ga, ckpt in _settings(spec.train.micro_batch, spec.train.grad_accum,
                                  spec.train.grad_checkpointing):  # fmt: skip
        shared = _shared(ps, mb, gpu.kind, spec.train.shared_prefix)
        peak = _train_peak(ps, spec, mb, ckpt, precision, shared)
        fits = max(peak, eval_peak) <= usable
        tried.append({
            "micro_batch": mb, "grad_accum": ga, "checkpointing": ckpt,
            "peak_gib": round(peak / GIB, 2), "fits": fits,
        })  # fmt: skip
        if fits and chosen is None:
            chosen = (mb, ga, ckpt, shared, peak)
    out: dict[str, Any] = {
        "name": vp.variant or "--set",
        "step_shape": step_shape(spec.model_dump(mode="json")),
        "peak_gib": {"eval": round(eval_peak / GIB, 2)},
        "options": tried,
    }
    if chosen is None:
        smallest = min(tried, key=lambda t: t["peak_gib"])
        out.update(fits=False, peak_gib={**out["peak_gib"], "train": smallest["peak_gib"]})
        return out
    mb, ga, ckpt, shared, peak = chosen
    if precision == "fp32":
        out["note"] = (
            "train.precision fp32: timed at the class's bf16 peak (fp32 compute is not "
            "modelled), so the step time is optimistic"
        )
    step = step_seconds(gpu, cal, ps.shape, _step_work(ps, spec, mb, ckpt, shared), precision)
    rate = _eval_rate(gpu, cal, ps, spec)
    weights = ps.shape.n_params * (
        0.5 if spec.model.quantization is not None else weight_bytes_of(spec)
    )
    load_s = LOAD_FIXED_S + weights / (DISK_GBS * 1e9)
    save_s = 0.2 + 3 * 4 * _trainable(ps.shape, spec) / (CHECKPOINT_GBS * 1e9)
    figures = ProbeFigures(
        later_step_s=step["step_s"] * ga,
        eval_examples_per_s=rate,
        checkpoint_save_s=save_s,
        model_load_s=load_s,
    )
    run = estimate_run(
        figures,
        n_train=ps.sizes.get("train", 0),
        n_val=ps.sizes.get("val", 0),
        epochs=spec.train.epochs,
        max_steps=spec.train.max_steps,
        micro_batch=mb,
        grad_accum=ga,
        eval_every=spec.train.eval_every,
        save_every=spec.train.save_every,
        margin=spec.limits.margin,
        usd_per_hour=0.0,
    )
    probe_s = load_s + 2 * PROBE_STEPS * step["step_s"] + PROBE_EVAL_EXAMPLES / rate + save_s
    out.update(
        fits=True,
        micro_batch=mb,
        grad_accum=ga,
        checkpointing=ckpt,
        shared_prefix=shared,
        peak_gib={"train": round(peak / GIB, 2), "eval": round(eval_peak / GIB, 2)},
        step_s=step["step_s"] * ga,
        step_parts={k: step[k] * ga for k in ("overhead_s", "compute_s", "bandwidth_s")},
        eval_examples_per_s=rate,
        steps=run["steps"],
        run_s=run["total_s"],
        probe_s=probe_s,
        load_s=load_s,
    )
    return out


def plan_on(gpu: GpuClass, ps: PilotShape, pilots: list[Pilot], price: float | None) -> dict:
    """The whole plan on one class -> the `gpus[]` entry of `budget --gpu --json`."""
    cal = calibration(gpu.kind)
    variants = [_variant_on(gpu, cal, ps, vp) for vp in pilots]
    base = variants[0]
    entry: dict[str, Any] = {
        "name": gpu.name,
        "label": gpu.label,
        "memory_gib": gpu.memory_gib,
        "fits": all(v["fits"] for v in variants),
        "micro_batch": base.get("micro_batch"),
        "grad_accum": base.get("grad_accum"),
        "checkpointing": base.get("checkpointing"),
        "peak_gib": base["peak_gib"],
        "step_s": base.get("step_s"),
        "plan_hours": None,
        "fits_days": {str(d): False for d in RENTAL_DAYS},
        "calibration": (
            f"measured: {gpu.name} has calibration rows ({cal.source})"
            if gpu.name in CALIBRATED
            else f"extrapolated: {gpu.name} was never measured; its datasheet peak "
            f"({gpu.bf16_tflops:g} TFLOP/s bf16, {gpu.bandwidth_gbs:g} GB/s) at the efficiency "
            f"and launch overhead fitted on the H200 rows"
        ),
        "variants": variants,
    }
    if price is not None:
        entry["usd_per_hour"] = price
    if not entry["fits"]:
        entry["why_not"] = [
            f"{v['name']}: the smallest training peak tried is {v['peak_gib']['train']} GiB "
            f"(evaluation {v['peak_gib']['eval']} GiB) against {HEADROOM:.0%} of "
            f"{gpu.memory_gib} GiB"
            for v in variants
            if not v["fits"]
        ]
        return entry
    rate = base["eval_examples_per_s"]
    load = base["load_s"]
    probes = {v["step_shape"]: v["probe_s"] for v in variants}
    fixed = {
        "baseline_s": load + ps.sizes.get("val", 0) / rate,
        "smoke_s": load + smoke_steps_of(pilots[0].spec, ps.sizes) * base["step_s"],
        "probe_s": sum(probes.values()),
        "test_s": load + 2 * ps.sizes.get("test", 0) / rate,
    }
    fixed_s = sum(fixed.values())
    runs = [v["run_s"] * vp.spec.selection.seeds for v, vp in zip(variants, pilots, strict=True)]
    fits = {str(d): plan_fits(fixed_s, runs, d) for d in RENTAL_DAYS}
    total_h = (fixed_s + sum(runs)) / 3600
    entry.update(
        phases_s=fixed,
        plan_hours=total_h,
        fits_days={d: f["fits"] for d, f in fits.items()},
    )
    if price is not None:
        entry["cost_usd"] = total_h * price
    return entry


def pre_rental(
    pilot: Pilot, gpus: list[GpuClass], prices: dict[str, float], only: list[str] | None = None
) -> dict:
    """-> {gpus: [...] best value first, inputs: {...}, method: ...}."""
    ps = gather(pilot)
    # `--set` overrides plan that one recipe (as `train --set` trains it); else the whole plan
    pilots = [pilot] if pilot.diff else variant_pilots(pilot, only)
    entries = [plan_on(g, ps, pilots, prices.get(g.name)) for g in gpus]

    def order(e: dict) -> tuple:
        # fitting first; then the cheapest where prices are known, else the fastest
        return (not e["fits"], e.get("cost_usd", math.inf), e["plan_hours"] or math.inf)

    return {
        "gpus": sorted(entries, key=order),
        "inputs": {
            "base_config": ps.shape.__dict__,
            "lengths": {"typical": ps.typical, "long": ps.long, "shared_prefix": ps.prefix},
            "loss_positions": ps.loss_positions,
            "data": ps.sizes,
            "variants": [vp.variant or "--set" for vp in pilots],
        },
        "method": (
            "memory: sizing/memory.py at the long length (training) and the longest prompt "
            f"(evaluation), fit within {HEADROOM:.0%} of the class's memory; time: "
            "sizing/timemodel.py at the typical length, calibrated in sizing/calibration.json; "
            "a hypothesis until `lorapilot probe` measures the rented machine"
        ),
    }


def match_class(device_name: str, classes: list[GpuClass]) -> GpuClass | None:
    """The class a device is (`NVIDIA H100 80GB HBM3` -> h100-80gb): every part of the class
    name found in the device's name, words kept apart or run together (`RTX 4090` is
    rtx4090), and not followed by a digit (so `l4` is not an `L40S`)."""
    spaced = " ".join("".join(ch if ch.isalnum() else " " for ch in device_name.lower()).split())
    squashed = spaced.replace(" ", "")
    for c in classes:
        parts = [p for p in c.name.lower().split("-") if p]
        if parts and all(_has(spaced, p) or _has(squashed, p) for p in parts):
            return c
    return None


def _has(text: str, part: str) -> bool:
    start = text.find(part)
    while start >= 0:
        end = start + len(part)
        if end == len(text) or not text[end].isdigit():
            return True
        start = text.find(part, start + 1)
    return False


def beside_probe(pilot: Pilot, probe_env: dict, measured_step_s: float, measured_peak: int | None,
                 classes: list[GpuClass]) -> dict:  # fmt: skip
    """The pre-rental estimate for the class the probe ran on, beside the probe's figures, so
    the hypothesis can be read against the measurement that replaces it."""
    devices = probe_env.get("devices") or []
    name = devices[0].get("name", "") if devices else ""
    gpu = match_class(name, classes) if name else None
    if gpu is None:
        where = f"a {name}" if name else "the CPU"
        return {"gpu": None, "why": f"the probe ran on {where}, not one of the GPU classes"}
    entry = plan_on(gpu, gather(pilot), [pilot], None)
    est = entry.get("step_s")
    peak = entry["peak_gib"].get("train")
    return {
        "gpu": gpu.name,
        "device": name,
        "estimated_step_s": est,
        "measured_step_s": measured_step_s,
        "step_error": (est / measured_step_s - 1) if est and measured_step_s else None,
        "estimated_peak_gib": peak,
        "measured_peak_gib": measured_peak / GIB if measured_peak else None,
        "calibration": entry["calibration"],
    }
