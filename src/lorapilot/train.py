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
FSDP (`train.distributed: fsdp`) is torch's fully_shard, applied by `lorapilot.fsdp` at the
points marked FSDP below: shard, validate, gather for saving, load on resume.

On disk, a run folder gets::

    steps.jsonl        one line per optimizer step
    val.jsonl          validation loss at step 0, every eval_every steps and at the end
    checkpoints/       step-N/ (weights, optimizer.safetensors, state.json, checksums.json)
                       and latest.json; the last 2 are kept
    adapter/           the final adapter (peft save_pretrained), or the full model

Checkpoints and the final adapter are written and read by `lorapilot.checkpoint` (atomic,
checksummed, resumable bit for bit). Nothing is pickled: tensors go to safetensors,
everything else to JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lorapilot import fsdp
from lorapilot.checkpoint import (
    Log,
    find_checkpoint,
    keep_records_up_to,
    load_checkpoint,
    param_names,
    save_checkpoint,
    write_final,
)
from lorapilot.data.format import IGNORE_INDEX, Encoded
from lorapilot.errors import UsageError
from lorapilot.fsutil import append_jsonl, read_jsonl
from lorapilot.registry import StoppedByLimit
from lorapilot.spec import TrainSpec

MEGA_CHUNK = 50  # micro-batches per length-sorted chunk (the usual group_by_length size)
# Config keys that rescale or transform logits after the LM head. The chunked loss applies
# the head alone, so a model with one of these set takes the full-logits path instead.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")

Batch = dict[str, torch.Tensor]


# --------------------------------------------------------------------------- batches


def collate(examples: Sequence[Encoded], pad_id: int) -> Batch:
    """Right-pad to the longest example; padding gets attention 0 and label -100.

    Padding is marked by position, not by `pad_id`: the pad token is often the
    end-of-turn token, which is also a real, trained label at the end of each answer.
    """
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        labels[row, :n] = torch.tensor(e.labels, dtype=torch.long)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def count_target_tokens(batch: Batch) -> int:
    """Tokens that carry loss: label != -100 after the causal shift (position 0 never does)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def example_target_tokens(e: Encoded) -> int:
    return sum(1 for t in e.labels[1:] if t != IGNORE_INDEX)


def length_grouped_batches(
    lengths: Sequence[int], micro_batch: int, seed: int, epoch: int
) -> list[list[int]]:
    """Indices grouped into micro-batches of similar length, in a per-(seed, epoch) order.

    Shuffle, cut into mega-chunks of 50 micro-batches, sort each chunk by length (so a
    micro-batch pads little), then shuffle the order of the micro-batches (so training does
    not see short examples, then long ones). The batch holding the longest example goes
    first, so an out-of-memory shows at step 1 rather than hours in. The same
    (seed, epoch) always gives the same list, which is what makes resuming exact.
    """
    rng = random.Random(f"lorapilot-batches-{seed}-{epoch}")  # str seeds hash stably
    order = list(range(len(lengths)))
    rng.shuffle(order)
    mega = micro_batch * MEGA_CHUNK
    batches: list[list[int]] = []
    for start in range(0, len(order), mega):
        chunk = sorted(order[start : start + mega], key=lambda i: -lengths[i])
        batches.extend(chunk[j : j + micro_batch] for j in range(0, len(chunk), micro_batch))
    rng.shuffle(batches)
    if batches:
        longest = max(range(len(batches)), key=lambda b: max(lengths[i] for i in batches[b]))
        batches.insert(0, batches.pop(longest))
    return batches


def padding_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Real tokens / padded tokens (1.0 = no padding at all)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return real / padded if padded else 1.0


class MicroBatchStream:
    """Micro-batches epoch after epoch. Its position (epoch, index) is all a checkpoint
    needs: each epoch's batch list is rebuilt from (seed, epoch)."""

    def __init__(self, lengths: Sequence[int], micro_batch: int, seed: int):
        self.lengths, self.micro_batch, self.seed = lengths, micro_batch, seed
        self.epoch, self.index = 0, 0
        self._batches = length_grouped_batches(lengths, micro_batch, seed, 0)

    def next(self) -> list[int]:
        if self.index >= len(self._batches):
            self.epoch, self.index = self.epoch + 1, 0
            self._batches = length_grouped_batches(
                self.lengths, self.micro_batch, self.seed, self.epoch
            )
        self.index += 1
        return self._batches[self.index - 1]

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.index / len(self._batches)

    def seek(self, epoch: int, index: int) -> None:
        self.epoch, self.index = epoch, index
        self._batches = length_grouped_batches(self.lengths, self.micro_batch, self.seed, epoch)


# --------------------------------------------------------------------------- loss


def _decoder_and_head(model) -> tuple[Any, Any]:
    """(decoder, lm_head) of a causal LM, plain or PEFT-wrapped; (None, None) if not found."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(base, "base_model_prefix", None)
    decoder = getattr(base, prefix, None) if prefix else None
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if decoder is None or head is None or decoder is base:
        return None, None
    config = getattr(base, "config", None)
    for key in _LOGIT_TRANSFORMS:
        value = getattr(config, key, None)
        if value not in (None, 1, 1.0):
            return None, None
    return decoder, head


def causal_lm_loss_sum(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token cross-entropies in float32, number of target tokens).

    Position t predicts token t+1, so targets are labels shifted left by one. The LM head
    is applied only at positions with a target: for classification that is a handful of
    tokens per example, and the head over a 49k vocabulary at every position would be
    most of the step's compute and memory. Equal to the standard full-logits loss.
    """
    labels = batch["labels"][:, 1:]
    mask = labels != IGNORE_INDEX
    targets = labels[mask]
    decoder, head = _decoder_and_head(model)
    if decoder is None:  # no separable head: full logits, still selected before the upcast
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits
        selected = logits[:, :-1][mask]
    else:
        hidden = decoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).last_hidden_state
        selected = head(hidden[:, :-1][mask])
    loss_sum = F.cross_entropy(selected.float(), targets, reduction="sum")
    return loss_sum, mask.sum()


class _LossModule(torch.nn.Module):
    """DDP only synchronises gradients for work done inside its own forward; the chunked
    loss calls the decoder and the head separately, so under DDP the whole loss is made
    one module's forward and that module is what DDP wraps."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch: Batch):
        return causal_lm_loss_sum(self.model, batch)


def _call_module(module, batch: Batch):
    return module(batch)


def autocast(device_type: str, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


EAGER_ATTENTION_MAX_WIDTH = 256  # CPU: eager attention is faster up to about this width


@contextlib.contextmanager
def short_sequence_attention(model, device_type: str, width: int):
    """On a CPU, switch a model that uses SDPA to transformers' eager attention (two
    batched matmuls and an fp32 softmax) while micro-batches are at most 256 tokens wide.

    torch's SDPA runs a flash-attention kernel on CPUs, which is slow on short sequences,
    backward above all: measured 28 ms vs 10 ms per layer, forward + backward, at 8 x 100
    tokens (SmolLM2-135M, bf16, one thread), which made eager steps ~20% faster overall;
    at 512 tokens and more flash wins. Eager keeps the S^2 attention probabilities for
    backward (6 bytes a score: ~28 MB a layer at 8 x 256 tokens and 9 heads), which the
    probe's measured step memory includes. Same mathematics, different rounding. GPUs and
    other attention settings are untouched; the model is switched back on exit.
    """
    from transformers import PreTrainedModel

    base = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if (
        device_type != "cpu"
        or width > EAGER_ATTENTION_MAX_WIDTH
        or base is None
        or base.config._attn_implementation != "sdpa"
    ):
        yield
        return
    base.set_attn_implementation("eager")
    try:
        yield
    finally:
        base.set_attn_implementation("sdpa")


# --------------------------------------------------------------------------- one step


def train_step(
    model,
    optimizer,
    scheduler,
    micro_batches: Sequence[Batch],
    total_target_tokens: int,
    precision: str,
    max_grad_norm: float | None,
    accelerator=None,
    *,
    loss_fn: Callable | None = None,
    scaler=None,
) -> dict:
    """One optimizer step over `micro_batches` (gradient accumulation).

    `total_target_tokens` counts the target tokens of the whole step across all
    micro-batches (and all ranks). `loss_fn(model, batch) -> (loss_sum, n_targets)`
    defaults to `causal_lm_loss_sum`. Returns {loss (mean per target token), grad_norm,
    lr (used by this step), tokens, padded_tokens, target_tokens}.
    """
    loss_fn = loss_fn or causal_lm_loss_sum
    params = [p for group in optimizer.param_groups for p in group["params"]]
    device = params[0].device
    world = accelerator.num_processes if accelerator is not None else 1
    # Each micro-batch's *summed* loss is divided by the target tokens of the WHOLE step,
    # not by its own: the accumulated gradient is then exactly the gradient of the mean
    # loss over every answer token in the step, as one batch of micro_batch * grad_accum
    # would give. Averaging per-micro-batch means instead over-weights tokens in
    # micro-batches with short answers. Under DDP the gradients are averaged over ranks,
    # so the world size is multiplied back in.
    scale = world / max(int(total_target_tokens), 1)
    lr = optimizer.param_groups[0]["lr"]
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    tokens = padded = 0
    width = max(mb["input_ids"].shape[-1] for mb in micro_batches)
    # CPU and short sequences: eager attention, ~20% faster steps (see the function).
    with short_sequence_attention(model, device.type, width):
        for i, mb in enumerate(micro_batches):
            tokens += int(mb["attention_mask"].sum())  # counted on the host, before the copy
            padded += mb["attention_mask"].numel()
            mb = {k: v.to(device, non_blocking=True) for k, v in mb.items()}
            last = i == len(micro_batches) - 1
            # Skip DDP's all-reduce on all but the last micro-batch: one sync per step.
            sync = (
                contextlib.nullcontext()
                if last or accelerator is None
                else accelerator.no_sync(model)
            )
            with sync:
                with autocast(device.type, precision):
                    mb_loss, _ = loss_fn(model, mb)
                loss = mb_loss * scale
                (scaler.scale(loss) if scaler is not None else loss).backward()
            loss_sum += mb_loss.detach().float()
            del mb_loss, loss  # free the graph now, otherwise the next forward peaks memory
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    clip = torch.nn.utils.clip_grad_norm_
    if accelerator is not None and world > 1:
        clip = accelerator.clip_grad_norm_
    grad_norm = clip(params, max_grad_norm if max_grad_norm is not None else float("inf"))
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if world > 1:
        totals = torch.tensor([float(loss_sum), tokens, padded], device=device)
        totals = accelerator.reduce(totals, reduction="sum")
        loss_sum, tokens, padded = totals[0], int(totals[1]), int(totals[2])
    return {
        "loss": float(loss_sum) / max(int(total_target_tokens), 1),
        "grad_norm": float(grad_norm),
        "lr": lr,
        "tokens": tokens,
        "padded_tokens": padded,
        "target_tokens": int(total_target_tokens),
    }


def make_optimizer(model, cfg: TrainSpec) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only. Weight decay applies to matrices, not to
    norms and biases (decaying a norm's gain towards 0 is not regularisation)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise UsageError("nothing is trainable: check adapter.target_modules")
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


def make_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """Linear warmup then cosine / linear decay to 0, or constant. The first step already
    uses lr/warmup (a schedule starting at lr 0 spends step 1 doing nothing)."""

    def factor(step: int) -> float:  # step = optimizer steps taken so far
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------- validation


@torch.no_grad()
def validation_loss(
    model,
    examples: Sequence[Encoded],
    micro_batch: int,
    pad_id: int,
    precision: str,
    accelerator=None,
) -> float | None:
    """Mean loss per target token over `examples` (None when there are none)."""
    if not examples:
        return None
    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: examples[i].n_tokens)
    chunks = [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]
    world = accelerator.num_processes if accelerator is not None else 1
    if world > 1:
        chunks = chunks[accelerator.process_index :: world]
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for chunk in chunks:
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in chunk], pad_id).items()}
        with autocast(device.type, precision):
            loss_sum, n = causal_lm_loss_sum(model, batch)
        total += torch.stack([loss_sum.double(), n.double()])
    model.train(was_training)
    if world > 1:
        total = accelerator.reduce(total, reduction="sum")
    return float(total[0] / total[1]) if total[1] > 0 else None


# --------------------------------------------------------------------------- helpers


def launched_world_size() -> int:
    """Processes started by the launcher (torchrun / accelerate launch set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _cpu_only_launch() -> bool:
    # DISTRIBUTED FIX: on a machine without GPUs accelerate joins the process group only when
    # asked for cpu=True; otherwise every rank of `torchrun --nproc_per_node N` silently trains
    # alone (world size 1, N run folders, no gradient averaging).
    return launched_world_size() > 1 and not torch.cuda.is_available()


def init_distributed():
    """accelerate's process state: joins the process group (gloo on CPUs, nccl on GPUs) when
    launched with several processes. Safe to call more than once; the state is shared."""
    from accelerate import PartialState

    return PartialState(cpu=_cpu_only_launch())


def check_distributed(cfg: TrainSpec) -> None:
    """Refuse settings the loop cannot honour, before anything is loaded or written.

    `train.distributed: fsdp` is sharded by the loop itself with torch's fully_shard (see
    lorapilot.fsdp); an accelerate FSDP or DeepSpeed launcher config is refused: accelerate
    would then wrap the loss module its own way, which the optimizer, saving and validation
    here do not expect."""
    for var, what in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(var, "false").lower() == "true":
            raise UsageError(
                f"launched with an accelerate {what} config ({var}=true); lorapilot shards the "
                "model itself: launch with torchrun or examples/accelerate/ddp_multi_gpu.yaml and "
                "set train.distributed: fsdp (or ddp), see docs/distributed.md"
            )


def _accelerator():
    from accelerate import Accelerator

    cpu = _cpu_only_launch()  # DISTRIBUTED FIX, see _cpu_only_launch
    try:
        return Accelerator(mixed_precision="no", cpu=cpu)
    except ValueError:  # the process-global state exists with other settings: reuse it
        return Accelerator(cpu=cpu)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _data_hash(examples: Sequence[Encoded]) -> str:
    h = hashlib.sha256()
    for e in examples:
        h.update(np.asarray(e.input_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(e.labels, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


class _PeakMemory:
    """CUDA: max allocated. CPU: the largest RSS seen at a step end (psutil), which is
    what a machine's memory limit is measured against."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def __call__(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        import psutil

        self.peak = max(self.peak, psutil.Process().memory_info().rss)
        return self.peak


def _progress_bar(enabled: bool, total: int, start: int):
    if not enabled:
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )
    bar.start()
    bar.add_task("train", total=total, completed=start, loss="-", tps="-")
    return bar


# --------------------------------------------------------------------------- train


def train(
    model,
    train_examples: list[Encoded],
    val_examples: list[Encoded],
    cfg: TrainSpec,
    out_dir: Path,
    *,
    pad_id: int,
    resume: bool = False,
    eval_fn: Callable[[Any], dict] | None = None,
    deadline: float | None = None,
    cost_check: Callable[[dict], str | None] | None = None,
    progress: bool = True,
    log: Log = print,
) -> dict:
    """Train `model` (already adapted by audit.build_adapter) and write the run folder.

    `deadline` is a time.time() limit and `cost_check(status) -> reason | None` is asked
    after every step (status: step, total_steps, wall_s, total_wall_s, tokens); either one
    stopping the run saves a checkpoint and raises registry.StoppedByLimit, and
    `resume=True` later continues from it bit for bit. `eval_fn(model) -> dict` runs at
    every validation point; its result is logged in val.jsonl under "eval".

    Returns {steps, total_steps, warmup_steps, final_loss, final_val_loss,
    initial_val_loss (step 0), final_eval, tokens, target_tokens, wall_s (this call),
    train_wall_s (all calls), checkpoint, adapter, resumed_from, padding_efficiency,
    train_tokens_per_s, world_size}. Only rank 0 writes files.
    """
    t_call = time.time()
    out_dir = Path(out_dir)
    check_distributed(cfg)
    if not train_examples:
        raise UsageError("no training examples")
    ckpt_root = out_dir / "checkpoints"
    steps_path, val_path = out_dir / "steps.jsonl", out_dir / "val.jsonl"

    # -- setup: devices, seeds, optimizer, schedule -----------------------------------
    acc = _accelerator()
    main, world, rank = acc.is_main_process, acc.num_processes, acc.process_index
    device = acc.device
    use_fsdp = cfg.distributed == "fsdp" and world > 1
    if main and world > 1:
        what = "FSDP (sharded weights)" if use_fsdp else "DDP"
        log(f"{what} over {world} processes ({acc.state.backend}); each takes its slice of a step")
    elif cfg.distributed != "none" and world == 1:
        log(
            f"train.distributed is {cfg.distributed} but one process was launched: training on one device"
        )
    if use_fsdp and eval_fn is not None:
        raise UsageError("train(eval_fn=...) is not supported with train.distributed: fsdp")
    seed_everything(cfg.seed)
    if not use_fsdp:
        model.to(device)  # FSDP moves each shard to the device as it shards (below)
    if cfg.grad_checkpointing:
        # Non-reentrant checkpointing needs no input that requires grad (LoRA's inputs don't).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # FSDP: shard before the optimizer is built, the parameters become DTensors (lorapilot.fsdp).
    sharded = fsdp.shard(_LossModule(model), device, world) if use_fsdp else None
    optimizer = make_optimizer(model, cfg)
    per_step = cfg.micro_batch * cfg.grad_accum * world
    total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(train_examples) / per_step))
    warmup = round(cfg.warmup_ratio * total_steps)
    scheduler = make_scheduler(optimizer, cfg.schedule, warmup, total_steps)
    # fp16 has too few exponent bits for small gradients: scale the loss up, unscale later.
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    if scaler is not None and sharded is not None:
        scaler = fsdp.grad_scaler(device)  # inf checks agree across shards
    if sharded is not None:
        step_model, loss_fn = sharded, _call_module
    elif world > 1:
        step_model, loss_fn = acc.prepare(_LossModule(model)), _call_module
    else:
        step_model, loss_fn = model, causal_lm_loss_sum
    lengths = [e.n_tokens for e in train_examples]
    n_targets = [example_target_tokens(e) for e in train_examples]
    stream = MicroBatchStream(lengths, cfg.micro_batch, cfg.seed)
    data_hash = _data_hash(train_examples)
    totals = {"tokens": 0, "padded_tokens": 0, "target_tokens": 0, "wall_s": 0.0}
    step, resumed_from = 0, None

    # -- resume: weights, optimizer, scheduler, RNG, data position, logs ----------------
    if resume:
        # DISTRIBUTED FIX: find_checkpoint tidies the folder (deletes newer/broken checkpoints,
        # rewrites latest.json), so only rank 0 runs it; the others load what it chose.
        folder = find_checkpoint(ckpt_root, log) if main else None
        if world > 1:
            from accelerate.utils import broadcast_object_list

            folder = broadcast_object_list([folder])[0]
        if folder is None:
            log(f"no usable checkpoint in {ckpt_root}; starting from step 0")
        else:
            saved = load_checkpoint(folder, model, optimizer, scheduler, scaler, sharded)
            if saved.get("data_hash") != data_hash:
                raise UsageError(
                    f"the training data differs from the data checkpoint "
                    f"{folder} was trained on; start a new run"
                )
            if saved.get("total_steps") != total_steps:
                log(f"total steps changed from {saved.get('total_steps')} to {total_steps}")
            step, resumed_from = saved["step"], saved["step"]
            stream.seek(saved["epoch"], saved["batch_index"])
            totals.update(saved["totals"])
            log(f"resumed from {folder} (step {step} of {total_steps})")
        if main:
            keep_records_up_to(steps_path, step)
            keep_records_up_to(val_path, step if step > 0 else -1)
    elif ckpt_root.exists() or steps_path.exists():
        raise UsageError(f"{out_dir} already holds a training run; resume it or use a new folder")
    acc.wait_for_everyone()

    def evaluate(at_step: int) -> dict:
        """Validation loss (+ eval_fn) at `at_step`. The RNG is forked so that evaluation
        never shifts the dropout draws of training (resumed runs must match exactly)."""
        fork = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=fork):
            if sharded is not None:  # every rank must run the same forwards (collectives)
                val = fsdp.validation_loss(
                    sharded, val_examples, cfg.micro_batch, pad_id, cfg.precision, acc
                )
            else:
                val = validation_loss(
                    model, val_examples, cfg.micro_batch, pad_id, cfg.precision, acc
                )
            record = {"step": at_step, "val_loss": val}
            if eval_fn is not None:
                model.eval()
                record["eval"] = eval_fn(model)
                model.train()
        record["time"] = time.time()
        if main:
            append_jsonl(val_path, record)
        return record

    def checkpoint(at_step: int) -> Path:
        state = {
            "step": at_step,
            "total_steps": total_steps,
            "epoch": stream.epoch,
            "batch_index": stream.index,
            "totals": totals,
            "data_hash": data_hash,
            "param_names": param_names(model, optimizer),
            "train_spec": cfg.model_dump(mode="json"),
        }
        path = ckpt_root / f"step-{at_step}"
        # FSDP: every rank takes part in gathering the full weights and optimizer state.
        gathered = None
        if sharded is not None:
            gathered = (fsdp.gather_weights(sharded), fsdp.gather_optimizer(sharded, optimizer))
        if main:
            path = save_checkpoint(
                ckpt_root, at_step, model, optimizer, scheduler, scaler, state, gathered
            )
        acc.wait_for_everyone()
        return path

    val_records = read_jsonl(val_path) if resumed_from is not None else []
    if resumed_from is None:
        val_records.append(evaluate(0))  # the baseline "val loss went down" is judged against
    initial_val = next((r["val_loss"] for r in val_records if r["step"] == 0), None)
    last_saved = resumed_from
    last_ckpt = ckpt_root / f"step-{resumed_from}" if resumed_from else None
    last_record = (read_jsonl(steps_path) or [None])[-1] if resumed_from else None
    peak_memory = _PeakMemory(device)
    bar = _progress_bar(progress and main, total_steps, step)
    call_tokens, call_train_s = 0, 0.0

    # -- the loop -----------------------------------------------------------------------
    model.train()
    try:
        while step < total_steps:
            t0 = time.perf_counter()
            # Every rank draws the same global list of micro-batches and takes its own
            # slice, so ranks see distinct shards and agree on the step's target tokens.
            global_mbs = [stream.next() for _ in range(cfg.grad_accum * world)]
            step_targets = sum(n_targets[i] for mb in global_mbs for i in mb)
            mine = [
                collate([train_examples[i] for i in mb], pad_id) for mb in global_mbs[rank::world]
            ]
            out = train_step(
                step_model,
                optimizer,
                scheduler,
                mine,
                step_targets,
                cfg.precision,
                cfg.max_grad_norm,
                acc,
                loss_fn=loss_fn,
                scaler=scaler,
            )
            step += 1
            dt = time.perf_counter() - t0
            call_tokens += out["tokens"]
            call_train_s += dt
            totals["tokens"] += out["tokens"]
            totals["padded_tokens"] += out["padded_tokens"]
            totals["target_tokens"] += out["target_tokens"]
            totals["wall_s"] += dt
            last_record = {
                "step": step,
                "epoch": round(stream.epoch_float, 6),
                "loss": out["loss"],
                "lr": out["lr"],
                "grad_norm": out["grad_norm"],
                "tokens": out["tokens"],
                "target_tokens": out["target_tokens"],
                "step_time_s": dt,
                "peak_memory_bytes": peak_memory(),
                "padding_efficiency": out["tokens"] / max(out["padded_tokens"], 1),
                "time": time.time(),
            }
            if main:
                append_jsonl(steps_path, last_record)
            if bar is not None:
                bar.update(
                    bar.task_ids[0],
                    completed=step,
                    loss=f"{out['loss']:.4f}",
                    tps=f"{call_tokens / max(call_train_s, 1e-9):,.0f}",
                )
            if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                val_records.append(evaluate(step))
            if cfg.save_every and step % cfg.save_every == 0 and step < total_steps:
                last_ckpt, last_saved = checkpoint(step), step

            # Limits: stop between steps, with a checkpoint to resume from.
            reason = None
            if deadline is not None and time.time() >= deadline:
                reason = "the time limit was reached"
            elif cost_check is not None:
                reason = cost_check(
                    {
                        "step": step,
                        "total_steps": total_steps,
                        "wall_s": time.time() - t_call,
                        "total_wall_s": totals["wall_s"],
                        "tokens": totals["tokens"],
                    }
                )
            if world > 1:  # all ranks must stop at the same step
                flag = acc.reduce(torch.tensor([1.0 if reason else 0.0], device=device), "sum")
                reason = reason or ("another rank hit a limit" if flag.item() > 0 else None)
            if reason:
                if last_saved != step:
                    last_ckpt, last_saved = checkpoint(step), step
                err = StoppedByLimit(
                    f"{reason} after step {step} of {total_steps}; checkpoint "
                    f"{last_ckpt} (continue with resume)"
                )
                err.checkpoint = last_ckpt
                err.step = step
                raise err
    finally:
        if bar is not None:
            bar.stop()

    # -- the end: validation, checkpoint, final adapter ---------------------------------
    if not any(r["step"] == step for r in val_records):
        val_records.append(evaluate(step))
    if last_saved != step:
        last_ckpt = checkpoint(step)
    weights = fsdp.gather_weights(sharded) if sharded is not None else None
    adapter_dir = write_final(model, out_dir, weights) if main else out_dir / "adapter"
    acc.wait_for_everyone()
    final_val = next(r for r in reversed(val_records) if r["step"] == step)
    return {
        "steps": step,
        "total_steps": total_steps,
        "warmup_steps": warmup,
        "final_loss": last_record["loss"] if last_record else None,
        "final_val_loss": final_val["val_loss"],
        "initial_val_loss": initial_val,
        "final_eval": final_val.get("eval"),
        "tokens": totals["tokens"],
        "target_tokens": totals["target_tokens"],
        "wall_s": time.time() - t_call,
        "train_wall_s": totals["wall_s"],
        "checkpoint": str(last_ckpt) if last_ckpt else None,
        "adapter": str(adapter_dir),
        "resumed_from": resumed_from,
        "padding_efficiency": totals["tokens"] / max(totals["padded_tokens"], 1),
        "train_tokens_per_s": call_tokens / call_train_s if call_train_s else None,
        "world_size": world,
    }
