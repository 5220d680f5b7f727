"""The training loop, readable top to bottom: batches, loss, step, `train`.

Shape of one optimizer step::

    grad_accum micro-batches  ->  loss_sum / target tokens of the WHOLE step  ->  backward
    -> clip -> optimizer.step -> scheduler.step -> zero_grad

Devices and DDP come from accelerate's `Accelerator`; mixed precision does not. Our loss
calls the decoder and the LM head separately (so the head runs only where there is a
target), which bypasses the `model.forward` that accelerate wraps in autocast; and
accelerate's state is process-global, so a second Accelerator with another precision in the
same process is refused. We therefore always ask accelerate for `mixed_precision="no"` and
enter `torch.autocast(device_type)` ourselves, which works the same on CUDA and on CPUs.
FSDP (`train.distributed: fsdp`) is torch's fully_shard, applied by `train.fsdp` at the
points marked FSDP below: shard, validate, gather for saving, load on resume.

The pieces: `train.batches` (collation, length-grouped micro-batches), `train.loss` (the
loss, shared prefix included), `train.step` (the one `train_step` shared with the probe and
the audit), `train.distributed` (launchers, process groups), `train.checkpoint` (atomic,
checksummed checkpoints). This module is the loop.

On disk, a run folder gets::

    steps.jsonl        one line per optimizer step
    val.jsonl          validation loss at step 0, every eval_every steps and at the end
    checkpoints/       step-N/ (weights, optimizer.safetensors, state.json, checksums.json)
                       and latest.json; the last 2 are kept; with train.early_stopping
                       also best-step-N/ (the best validation point's weights)
    adapter/           the final adapter (peft save_pretrained), or the full model

Checkpoints and the final adapter are written and read by `train.checkpoint` (atomic,
checksummed, resumable bit for bit). Nothing is pickled: tensors go to safetensors,
everything else to JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lorapilot.base.adapter import set_checkpointing
from lorapilot.base.precision import resolve
from lorapilot.base.quantize import is_quantized
from lorapilot.errors import UsageError
from lorapilot.fsutil import append_jsonl, read_jsonl
from lorapilot.records.environment import cpu_has_fast_bf16
from lorapilot.records.progress import Phase
from lorapilot.records.registry import StoppedByLimit
from lorapilot.spec import TrainSpec
from lorapilot.train import fsdp, lora_forward
from lorapilot.train.batches import MicroBatchStream, category_weights, sampling_summary
from lorapilot.train.checkpoint import (
    Log,
    best_folder,
    best_problems,
    find_checkpoint,
    keep_records_up_to,
    load_checkpoint,
    load_weights,
    param_names,
    prune_best,
    save_best,
    save_checkpoint,
    write_final,
)
from lorapilot.train.compiled import compile_decoder, is_compiled, pad_multiple, uncompile
from lorapilot.train.distributed import accelerator_for, check_distributed
from lorapilot.train.early_stop import EarlyStop
from lorapilot.train.examples import TrainingSet, as_training_set, padded_to
from lorapilot.train.loss import LossModule, call_module, prefix_decision
from lorapilot.train.meter import PeakMemory
from lorapilot.train.step import (
    make_optimizer,
    make_scheduler,
    optimizer_record,
    train_step,
    validation_loss,
)


@dataclasses.dataclass
class TrainResult:
    """What `train` returns and the run record keeps under `result.train`."""

    steps: int  # optimizer steps done, resumed ones included
    total_steps: int
    warmup_steps: int
    final_loss: float | None  # training loss of the last step
    final_val_loss: float | None
    initial_val_loss: float | None  # at step 0: what "the val loss went down" is judged by
    final_eval: dict | None  # eval_fn's result at the last validation point
    tokens: int  # real (unpadded) tokens seen, all calls (images: images seen)
    target_tokens: int
    wall_s: float  # this call
    train_wall_s: float  # step time of all calls (a resumed run adds up)
    checkpoint: str | None  # the last checkpoint written
    adapter: str  # the final adapter (or full model) folder
    resumed_from: int | None
    padding_efficiency: float
    train_tokens_per_s: float | None  # this call's steps only
    world_size: int
    precision: str  # train.precision as resolved for the device (`auto` never stays)
    # train.shared_prefix: {mode, path: shared | unshared, why, micro_batches,
    # shared_micro_batches, tokens_saved (prefix tokens not recomputed, all calls)}
    prefix: dict | None = None
    unit: str = "tokens"  # what `tokens` counts: tokens, or images
    # train.compile: on: {requested, mode, compiled, seconds | reason} (train/compiled.py)
    compile: dict | None = None
    pad_to_multiple_of: int = 1  # micro-batch widths padded to a multiple of this (tokens)
    # train.lora_forward: {mode, fused_layers, lora_layers} (train/lora_forward.py)
    lora_forward: dict | None = None
    optimizer: dict | None = None  # {name, implementation: fused | foreach | for-loop}
    # train.early_stopping: {patience, min_delta, restore_best, stopped_early, best_step,
    # best_val_loss, last_val_loss, restored, points, bad_points}
    early_stopping: dict | None = None
    # train.category_sampling other than natural: {mode, per_category: {category: {examples,
    # draws_per_epoch, per_example}}}
    sampling: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Loop:
    """Everything a step, a validation point or a checkpoint needs, built by `_setup`."""

    cfg: TrainSpec
    data: TrainingSet
    out_dir: Path
    acc: Any  # accelerate's Accelerator
    model: Any  # the (PEFT) model, unwrapped
    step_model: Any  # what train_step calls: the model, its DDP wrapper or the FSDP module
    loss_fn: Callable
    rank_loss: Callable  # the rank's own loss on the unwrapped model: validation takes it too
    prefix_path: tuple[str, str]  # ("shared" | "unshared", why): train.shared_prefix resolved
    sharded: Any  # the FSDP loss module, or None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    stream: MicroBatchStream
    total_steps: int
    warmup: int
    data_hash: str
    compiled: dict | None = None  # train.compile's record (train/compiled.py)
    pad_multiple: int = 1  # tokens: train.pad_to_multiple_of as resolved (train/compiled.py)
    stopper: EarlyStop | None = None  # train.early_stopping's count (kept in checkpoints)
    totals: dict = dataclasses.field(
        default_factory=lambda: {
            "tokens": 0,
            "padded_tokens": 0,
            "target_tokens": 0,
            "wall_s": 0.0,
            "micro_batches": 0,
            "shared_micro_batches": 0,
            "prefix_tokens_saved": 0,
        }
    )
    unshared_why: str | None = None  # why the last micro-batch off the shared path was off it

    @property
    def main(self) -> bool:
        return self.acc.is_main_process

    @property
    def world(self) -> int:
        return self.acc.num_processes

    @property
    def ckpt_root(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def steps_path(self) -> Path:
        return self.out_dir / "steps.jsonl"

    @property
    def val_path(self) -> Path:
        return self.out_dir / "val.jsonl"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _setup(model, data: TrainingSet, cfg: TrainSpec, out_dir: Path, log: Log) -> _Loop:
    """Devices, seeds, FSDP/DDP wrapping, optimizer, schedule, data order."""
    acc = accelerator_for()
    world, device = acc.num_processes, acc.device
    use_fsdp = cfg.distributed == "fsdp" and world > 1
    if acc.is_main_process and world > 1:
        what = "FSDP (sharded weights)" if use_fsdp else "DDP"
        log(f"{what} over {world} processes ({acc.state.backend}); each takes its slice of a step")
    elif cfg.distributed != "none" and world == 1:
        log(
            f"train.distributed is {cfg.distributed} but one process was launched: "
            "training on one device"
        )
    if device.type == "cpu" and cfg.precision not in ("fp32", "auto") and not cpu_has_fast_bf16():
        log(
            f"warning: train.precision is {cfg.precision} but this CPU has no AMX or "
            "AVX512-BF16: 16-bit matmuls are emulated, often 10-100x slower than fp32; "
            "set train.precision: auto or fp32 (and eval.precision) on this machine"
        )
    # `auto` becomes this device's precision; the checkpoints and the record hold it.
    cfg = cfg.model_copy(update={"precision": resolve(cfg.precision, device.type)})
    seed_everything(cfg.seed)
    if not use_fsdp and not is_quantized(model):  # a quantized base was loaded on its device
        model.to(device)  # FSDP moves each shard to the device as it shards (below)
    if cfg.grad_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad (LoRA's inputs don't).
        set_checkpointing(model, True)
    # the rank's own loss: the shared-prefix path where it applies (inside the module DDP
    # wraps or FSDP shards: the decoder's two passes are then one forward), else the plain one
    rank_loss, prefix_path = data.loss_fn(cfg)
    # widths repeat (CUDA graphs record one per shape); the padding shows in padding_efficiency
    multiple = pad_multiple(cfg, device.type)
    data = padded_to(data, multiple)
    compiled = None
    if cfg.compile == "on" and use_fsdp:
        compiled = {"requested": "on", "compiled": False, "reason": "not with FSDP"}
        log("train.compile: training eagerly: not with FSDP")
    elif cfg.compile == "on":  # before DDP wraps it; tried on the first micro-batch
        first = data.collate(list(range(min(cfg.micro_batch, len(data)))))
        compiled = compile_decoder(
            model, rank_loss, first, cfg.precision, log, cfg.compile_mode, cfg.lora_forward
        )
    # FSDP: shard before the optimizer is built, the parameters become DTensors (train.fsdp).
    sharded = fsdp.shard(LossModule(model, rank_loss), device, world) if use_fsdp else None
    optimizer = make_optimizer(model, cfg)
    per_step = cfg.micro_batch * cfg.grad_accum * world
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(data) / per_step))
    warmup = round(cfg.warmup_ratio * total_steps)
    # fp16 has too few exponent bits for small gradients: scale the loss up, unscale later.
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    if scaler is not None and sharded is not None:
        scaler = fsdp.grad_scaler(device)  # inf checks agree across shards
    if sharded is not None:
        step_model, loss_fn = sharded, call_module
    elif world > 1:
        step_model, loss_fn = acc.prepare(LossModule(model, rank_loss)), call_module
    else:
        step_model, loss_fn = model, rank_loss
    stream = MicroBatchStream(data.lengths, cfg.micro_batch, cfg.seed, _weights(data, cfg))
    es = cfg.early_stopping
    return _Loop(
        cfg=cfg,
        data=data,
        out_dir=out_dir,
        acc=acc,
        model=model,
        step_model=step_model,
        loss_fn=loss_fn,
        rank_loss=rank_loss,
        prefix_path=prefix_path,
        sharded=sharded,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, cfg.schedule, warmup, total_steps),
        scaler=scaler,
        stream=stream,
        total_steps=total_steps,
        warmup=warmup,
        data_hash=data.data_hash(),
        compiled=compiled,
        pad_multiple=multiple,
        stopper=EarlyStop(es.patience, es.min_delta) if es and cfg.eval_every else None,
    )


def _weights(data: TrainingSet, cfg: TrainSpec) -> list[float] | None:
    """train.category_sampling's per-example draw weights (None: each example once an epoch)."""
    if cfg.category_sampling == "natural":
        return None
    categories = getattr(data, "categories", None)
    if categories is None:
        raise UsageError(
            f"train.category_sampling: {cfg.category_sampling} needs the examples' categories, "
            "which this training set does not carry"
        )
    return category_weights(categories, cfg.category_sampling)


def _sampling(lp: _Loop) -> dict | None:
    """The record of train.category_sampling: what an epoch draws from each category."""
    if lp.cfg.category_sampling == "natural":
        return None
    return {
        "mode": lp.cfg.category_sampling,
        "per_category": sampling_summary(lp.data.categories, lp.stream.weights),
    }


def _resume(lp: _Loop, log: Log) -> int | None:
    """Weights, optimizer, scheduler, RNG, data position and logs from the last good
    checkpoint; the step resumed from, or None when there is none."""
    # DISTRIBUTED FIX: find_checkpoint tidies the folder (deletes newer/broken checkpoints,
    # rewrites latest.json), so only rank 0 runs it; the others load what it chose.
    folder = find_checkpoint(lp.ckpt_root, log) if lp.main else None
    if lp.world > 1:
        from accelerate.utils import broadcast_object_list

        folder = broadcast_object_list([folder])[0]
    step = None
    if folder is None:
        log(f"no usable checkpoint in {lp.ckpt_root}; starting from step 0")
    else:
        saved = load_checkpoint(folder, lp.model, lp.optimizer, lp.scheduler, lp.scaler, lp.sharded)
        if saved.get("data_hash") != lp.data_hash:
            raise UsageError(
                f"the training data differs from the data checkpoint {folder} "
                "was trained on; start a new run"
            )
        if saved.get("total_steps") != lp.total_steps:
            log(f"total steps changed from {saved.get('total_steps')} to {lp.total_steps}")
        step = saved["step"]
        lp.stream.seek(saved["epoch"], saved["batch_index"])
        lp.totals.update(saved["totals"])
        if lp.stopper is not None and saved.get("early_stopping"):
            lp.stopper = EarlyStop.from_dict(saved["early_stopping"])
            _check_best(lp)
        log(f"resumed from {folder} (step {step} of {lp.total_steps})")
    if lp.main:
        keep_records_up_to(lp.steps_path, step or 0)
        keep_records_up_to(lp.val_path, step if step else -1)
    return step


def _validate(lp: _Loop, val_set: TrainingSet, eval_fn, at_step: int) -> dict:
    """Validation loss (+ eval_fn) at `at_step`, appended to val.jsonl. The RNG is forked so
    that evaluation never shifts the dropout draws of training (resumes must match exactly)."""
    device, cfg = lp.acc.device, lp.cfg
    fork = [device.index or 0] if device.type == "cuda" else []
    # train.compile: only the steps run compiled; validation without gradients would be
    # another graph to compile (minutes on a CPU), evaluation's shapes do not repeat, and the
    # final adapter is evaluated eagerly as the baseline was (compiled.uncompile)
    eager = torch.compiler.set_stance("force_eager") if is_compiled(lp.model) else None
    with torch.random.fork_rng(devices=fork), eager or contextlib.nullcontext():
        if lp.sharded is not None:  # every rank must run the same forwards (collectives)
            val = fsdp.validation_loss(lp.sharded, val_set, cfg.micro_batch, cfg.precision, lp.acc)
        else:
            val = validation_loss(
                lp.model, val_set, cfg.micro_batch, cfg.precision, lp.acc,
                loss_fn=lp.rank_loss,  # the training path: the prefix once
            )  # fmt: skip
        record = {"step": at_step, "val_loss": val}
        if eval_fn is not None:
            lp.model.eval()
            record["eval"] = eval_fn(lp.model)
            lp.model.train()
    record["time"] = time.time()
    if lp.main:
        append_jsonl(lp.val_path, record)
    return record


def _restores_best(lp: _Loop) -> bool:
    es = lp.cfg.early_stopping
    return lp.stopper is not None and es is not None and es.restore_best


def _check_best(lp: _Loop) -> None:
    """A resumed run must be able to restore the best weights its checkpoint names."""
    best = lp.stopper.best_step if lp.stopper else None
    if best is None or not _restores_best(lp):
        return
    problems = best_problems(best_folder(lp.ckpt_root, best))
    if problems:
        raise UsageError(
            f"the best weights of this run (step {best}) cannot be restored: "
            f"{'; '.join(problems)}; start a new run"
        )


def _early_stop(lp: _Loop, at_step: int, val_loss: float | None) -> None:
    """Count the validation point; a new best's weights are saved when they will be
    restored (FSDP: every rank gathers)."""
    if lp.stopper is None or not lp.stopper.observe(at_step, val_loss):
        return
    if not _restores_best(lp):
        return
    weights = fsdp.gather_weights(lp.sharded) if lp.sharded is not None else None
    if lp.main:
        save_best(lp.ckpt_root, at_step, lp.model, weights)
        prune_best(lp.ckpt_root, at_step)
    lp.acc.wait_for_everyone()


def _restore_best(lp: _Loop, step: int, last_val: float | None, log: Log) -> dict | None:
    """At the end of an early-stopping run: the best point's weights back into the model
    (when they are not the last step's), and the record of what happened."""
    if lp.stopper is None:
        return None
    es, st = lp.cfg.early_stopping, lp.stopper
    restored = False
    if _restores_best(lp) and st.best_step is not None and st.best_step != step:
        folder = best_folder(lp.ckpt_root, st.best_step)
        _check_best(lp)
        load_weights(folder, lp.model, lp.sharded)
        restored = True
        if lp.main:
            log(
                f"early stopping: the adapter is step {st.best_step}'s (val loss "
                f"{st.best_val_loss:.4f}), not step {step}'s ({last_val:.4f})"
                if last_val is not None
                else f"early stopping: the adapter is step {st.best_step}'s"
            )
    return {
        "patience": es.patience,
        "min_delta": es.min_delta,
        "restore_best": es.restore_best,
        "stopped_early": step < lp.total_steps and st.exhausted,
        "stopped_at_step": step,
        "best_step": st.best_step,
        "best_val_loss": st.best_val_loss,
        "last_val_loss": last_val,
        "restored": restored,
        "points": st.points,
        "bad_points": st.bad_points,
    }


def _checkpoint(lp: _Loop, at_step: int) -> Path:
    """Save step `at_step` (FSDP: every rank takes part in gathering the full state)."""
    state = {
        "step": at_step,
        "total_steps": lp.total_steps,
        "epoch": lp.stream.epoch,
        "batch_index": lp.stream.index,
        "totals": lp.totals,
        "data_hash": lp.data_hash,
        "param_names": param_names(lp.model, lp.optimizer),
        "train_spec": lp.cfg.model_dump(mode="json"),
        **({"early_stopping": lp.stopper.to_dict()} if lp.stopper is not None else {}),
    }
    path = lp.ckpt_root / f"step-{at_step}"
    gathered = None
    if lp.sharded is not None:
        gathered = (
            fsdp.gather_weights(lp.sharded),
            fsdp.gather_optimizer(lp.sharded, lp.optimizer),
        )
    if lp.main:
        path = save_checkpoint(
            lp.ckpt_root, at_step, lp.model, lp.optimizer, lp.scheduler, lp.scaler, state, gathered
        )
        if lp.stopper is not None:
            prune_best(lp.ckpt_root, lp.stopper.best_step)
    lp.acc.wait_for_everyone()
    return path


def _limit_reason(lp: _Loop, step: int, deadline, cost_check, t_call: float) -> str | None:
    """Why to stop after this step (time limit, cost cap, another rank), or None."""
    reason = None
    if deadline is not None and time.time() >= deadline:
        reason = "the time limit was reached"
    elif cost_check is not None:
        reason = cost_check(
            {
                "step": step,
                "total_steps": lp.total_steps,
                "wall_s": time.time() - t_call,
                "total_wall_s": lp.totals["wall_s"],
                "tokens": lp.totals["tokens"],
            }
        )
    if lp.world > 1:  # all ranks must stop at the same step
        flag = lp.acc.reduce(torch.tensor([1.0 if reason else 0.0], device=lp.acc.device), "sum")
        reason = reason or ("another rank hit a limit" if flag.item() > 0 else None)
    return reason


# --------------------------------------------------------------------------- train


def train(
    model,
    train_examples: TrainingSet | Sequence,
    val_examples: TrainingSet | Sequence,
    cfg: TrainSpec,
    out_dir: Path,
    *,
    pad_id: int | None = None,
    resume: bool = False,
    eval_fn: Callable[[Any], dict] | None = None,
    deadline: float | None = None,
    cost_check: Callable[[dict], str | None] | None = None,
    stop_when: Callable[[dict], bool] | None = None,
    progress: bool = True,
    log: Log = print,
) -> TrainResult:
    """Train `model` (already adapted by adapter.build_adapter) and write the run folder.

    The data are training sets (`train.examples`: text or images); a list of tokenised
    examples is taken as text with `pad_id`.

    `stop_when(step record) -> bool` ends training early after that step, as if it were the
    last (final validation, checkpoint, adapter): the smoke test stops once it has overfit.

    `deadline` is a time.time() limit and `cost_check(status) -> reason | None` is asked
    after every step (status: step, total_steps, wall_s, total_wall_s, tokens); either one
    stopping the run saves a checkpoint and raises registry.StoppedByLimit, and
    `resume=True` later continues from it bit for bit. `eval_fn(model) -> dict` runs at
    every validation point; its result is logged in val.jsonl under "eval". Only rank 0
    writes files.
    """
    t_call = time.time()
    out_dir = Path(out_dir)
    check_distributed(cfg)
    data = as_training_set(train_examples, pad_id)
    val_set = as_training_set(val_examples, pad_id)
    if not len(data):
        raise UsageError("no training examples")
    lp = _setup(model, data, cfg, out_dir, log)
    cfg, data = lp.cfg, lp.data  # precision resolved for the device; batches padded
    val_set = padded_to(val_set, lp.pad_multiple)
    if lp.sharded is not None and eval_fn is not None:
        raise UsageError("train(eval_fn=...) is not supported with train.distributed: fsdp")
    if not resume and (lp.ckpt_root.exists() or lp.steps_path.exists()):
        raise UsageError(f"{out_dir} already holds a training run; resume it or use a new folder")
    resumed_from = _resume(lp, log) if resume else None
    lp.acc.wait_for_everyone()
    step = resumed_from or 0
    n_targets = data.targets

    def validate(at_step: int) -> dict:
        return _validate(lp, val_set, eval_fn, at_step)

    val_records = read_jsonl(lp.val_path) if resumed_from is not None else [validate(0)]
    initial_val = next((r["val_loss"] for r in val_records if r["step"] == 0), None)
    last_saved = resumed_from
    last_ckpt = lp.ckpt_root / f"step-{resumed_from}" if resumed_from else None
    last_record = (read_jsonl(lp.steps_path) or [None])[-1] if resumed_from else None
    meter = PeakMemory(lp.acc.device, reset_cuda=True)
    phase = Phase(
        "train",
        lp.total_steps,
        start=step,
        bar=progress and lp.main,
        log=log if progress and lp.main else None,
        field_names=("loss", "tps"),
    )
    call_tokens, call_train_s = 0, 0.0
    rate_unit = {"tokens": "tok/s", "images": "img/s"}.get(data.unit, f"{data.unit}/s")
    rank, world = lp.acc.process_index, lp.world

    # -- the loop -----------------------------------------------------------------------
    model.train()
    try:
        while step < lp.total_steps:
            t0 = time.perf_counter()
            # Every rank draws the same global list of micro-batches and takes its own
            # slice, so ranks see distinct shards and agree on the step's target tokens.
            global_mbs = [lp.stream.next() for _ in range(cfg.grad_accum * world)]
            step_targets = sum(n_targets[i] for mb in global_mbs for i in mb)
            mine = [data.collate(mb) for mb in global_mbs[rank::world]]
            if lp.prefix_path[0] == "shared":  # what the shared path spares, for the record
                for mb in mine:
                    path, why, n = prefix_decision(lp.model, mb, cfg.shared_prefix)
                    if path == "shared":
                        lp.totals["shared_micro_batches"] += 1
                        lp.totals["prefix_tokens_saved"] += n * (mb["input_ids"].shape[0] - 1)
                    else:
                        lp.unshared_why = why
            lp.totals["micro_batches"] += len(mine)
            out = train_step(
                lp.step_model,
                lp.optimizer,
                lp.scheduler,
                mine,
                step_targets,
                cfg.precision,
                cfg.max_grad_norm,
                lp.acc,
                loss_fn=lp.loss_fn,
                scaler=lp.scaler,
                lora_forward=cfg.lora_forward,
            )
            step += 1
            dt = time.perf_counter() - t0
            call_tokens, call_train_s = call_tokens + out["tokens"], call_train_s + dt
            for k in ("tokens", "padded_tokens", "target_tokens"):
                lp.totals[k] += out[k]
            lp.totals["wall_s"] += dt
            last_record = {
                "step": step,
                "epoch": round(lp.stream.epoch_float, 6),
                "loss": out["loss"],
                "lr": out["lr"],
                "grad_norm": out["grad_norm"],
                "tokens": out["tokens"],
                "target_tokens": out["target_tokens"],
                "step_time_s": dt,
                "peak_memory_bytes": meter.at_step_end(),
                "padding_efficiency": out["tokens"] / max(out["padded_tokens"], 1),
                "time": time.time(),
            }
            if lp.main:
                append_jsonl(lp.steps_path, last_record)
            phase.advance(
                step,
                loss=f"loss {out['loss']:.4f}",
                tps=f"{call_tokens / max(call_train_s, 1e-9):,.0f} {rate_unit}",
            )
            if cfg.eval_every and step % cfg.eval_every == 0 and step < lp.total_steps:
                val_records.append(validate(step))
                _early_stop(lp, step, val_records[-1]["val_loss"])
            if cfg.save_every and step % cfg.save_every == 0 and step < lp.total_steps:
                last_ckpt, last_saved = _checkpoint(lp, step), step
            if stop_when is not None and stop_when(last_record):
                break
            if lp.stopper is not None and lp.stopper.exhausted:
                log(
                    f"early stopping after step {step} of {lp.total_steps}: no better "
                    f"validation loss in {lp.stopper.bad_points} points (best: step "
                    f"{lp.stopper.best_step})"
                )
                break
            # Limits: stop between steps, with a checkpoint to resume from.
            reason = _limit_reason(lp, step, deadline, cost_check, t_call)
            if reason:
                if last_saved != step:
                    last_ckpt, last_saved = _checkpoint(lp, step), step
                err = StoppedByLimit(
                    f"{reason} after step {step} of {lp.total_steps}; "
                    f"checkpoint {last_ckpt} (continue with resume)"
                )
                err.checkpoint, err.step = last_ckpt, step
                raise err
    finally:
        phase.close()

    # -- the end: validation, checkpoint, final adapter ---------------------------------
    if not any(r["step"] == step for r in val_records):
        val_records.append(validate(step))
        _early_stop(lp, step, val_records[-1]["val_loss"])
    if last_saved != step:
        last_ckpt = _checkpoint(lp, step)
    last_val = next(r for r in reversed(val_records) if r["step"] == step)
    # train.early_stopping: the adapter saved is the best point's (the checkpoint above
    # keeps the last step's, a resume's starting point)
    stopping = _restore_best(lp, step, last_val["val_loss"], log)
    uncompile(model)  # the caller evaluates the adapter eagerly, as the baseline was
    weights = fsdp.gather_weights(lp.sharded) if lp.sharded is not None else None
    adapter_dir = write_final(model, out_dir, weights) if lp.main else out_dir / "adapter"
    lp.acc.wait_for_everyone()
    final_val = last_val
    if stopping and stopping["restored"]:
        final_val = next(r for r in reversed(val_records) if r["step"] == stopping["best_step"])
    return TrainResult(
        steps=step,
        total_steps=lp.total_steps,
        warmup_steps=lp.warmup,
        final_loss=last_record["loss"] if last_record else None,
        final_val_loss=final_val["val_loss"],
        initial_val_loss=initial_val,
        final_eval=final_val.get("eval"),
        tokens=lp.totals["tokens"],
        target_tokens=lp.totals["target_tokens"],
        wall_s=time.time() - t_call,
        train_wall_s=lp.totals["wall_s"],
        checkpoint=str(last_ckpt) if last_ckpt else None,
        adapter=str(adapter_dir),
        resumed_from=resumed_from,
        padding_efficiency=lp.totals["tokens"] / max(lp.totals["padded_tokens"], 1),
        train_tokens_per_s=call_tokens / call_train_s if call_train_s else None,
        world_size=world,
        precision=cfg.precision,
        prefix={
            "mode": cfg.shared_prefix,
            # no micro-batch took the shared path: say why the last one did not
            **(
                {"path": "unshared", "why": lp.unshared_why}
                if lp.unshared_why and not lp.totals.get("shared_micro_batches")
                else {"path": lp.prefix_path[0], "why": lp.prefix_path[1]}
            ),
            "micro_batches": lp.totals.get("micro_batches", 0),
            "shared_micro_batches": lp.totals.get("shared_micro_batches", 0),
            "tokens_saved": lp.totals.get("prefix_tokens_saved", 0),
        },
        unit=data.unit,
        compile=lp.compiled,
        pad_to_multiple_of=lp.pad_multiple,
        lora_forward=lora_forward.describe(model, cfg.lora_forward),
        optimizer=optimizer_record(lp.optimizer),
        early_stopping=stopping,
        sampling=_sampling(lp),
    )
