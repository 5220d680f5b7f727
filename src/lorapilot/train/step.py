"""The one optimizer step, shared by training, the probe, the update audit and step
measurement (so their loops cannot drift apart), with the optimizer and schedule it uses.

Shape of one optimizer step::

    grad_accum micro-batches  ->  loss_sum / target tokens of the WHOLE step  ->  backward
    -> clip -> optimizer.step -> scheduler.step -> zero_grad
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch

from lorapilot.base.precision import autocast
from lorapilot.errors import UsageError
from lorapilot.spec import TrainSpec
from lorapilot.train.batches import Batch, batch_units, batch_width
from lorapilot.train.lora_forward import fused
from lorapilot.train.loss import causal_lm_loss_sum

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
        or width == 0  # no token positions (images)
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
    lora_forward: str = "fused",
) -> dict:
    """One optimizer step over `micro_batches` (gradient accumulation).

    `total_target_tokens` counts the target tokens of the whole step across all
    micro-batches (and all ranks). `loss_fn(model, batch) -> (loss_sum, n_targets)`
    defaults to `causal_lm_loss_sum`. `lora_forward` is `train.lora_forward` (fused: the LoRA
    linears run `lora_forward.fused`'s forward during the step). Returns {loss (mean per
    target token), grad_norm, lr (used by this step), tokens, padded_tokens, target_tokens}.
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
    width = max(batch_width(mb) for mb in micro_batches)
    # CPU and short sequences: eager attention, ~20% faster steps (see the function).
    with short_sequence_attention(model, device.type, width), fused(model, lora_forward):
        for i, mb in enumerate(micro_batches):
            real, room = batch_units(mb)  # counted on the host, before the copy
            tokens, padded = tokens + real, padded + room
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


# Devices with torch's fused AdamW kernel (ROCm builds report "cuda").
FUSED_ADAMW_DEVICES = ("cpu", "cuda", "xpu", "mps")


def make_optimizer(model, cfg: TrainSpec) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only. Weight decay applies to matrices, not to
    norms and biases (decaying a norm's gain towards 0 is not regularisation).

    torch's fused AdamW where the parameters allow it (`adamw_implementation`): one kernel
    over all tensors instead of a dozen foreach launches on a GPU, or a dozen operations per
    tensor on a CPU (420 LoRA tensors at 135M). It is what the Trainer's default
    `adamw_torch_fused` runs; the update is AdamW's, rounded differently (~1e-9 here)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise UsageError("nothing is trainable: check adapter.target_modules")
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    fused = adamw_implementation(trainable) == "fused" or None  # None: torch's default
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused)


def adamw_implementation(params) -> str:
    """Which AdamW `make_optimizer` runs over `params`: fused (all floating point, on one
    device type with the fused kernel; FSDP's DTensors included), else torch's default."""
    params = list(params)
    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= set(FUSED_ADAMW_DEVICES):
        if all(torch.is_floating_point(p) for p in params):
            return "fused"
    return _torch_default(params)


def _torch_default(params) -> str:
    """What torch's optimizers run when told neither: foreach (plain tensors on a GPU),
    else a loop over the tensors."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    _, foreach = _default_to_fused_or_foreach(list(params), differentiable=False, use_fused=False)
    return "foreach" if foreach else "for-loop"


def optimizer_record(optimizer: torch.optim.Optimizer) -> dict:
    """{name, implementation} of the optimizer a run steps with, for its record."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        implementation = "fused"
    elif group.get("foreach"):
        implementation = "foreach"
    else:
        implementation = _torch_default(p for g in optimizer.param_groups for p in g["params"])
    return {"name": type(optimizer).__name__.lower(), "implementation": implementation}


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


@torch.no_grad()
def validation_loss(
    model,
    examples,
    micro_batch: int,
    precision: str,
    accelerator=None,
    loss_fn=None,
) -> float | None:
    """Mean loss per target over a training set (`train.examples`); None when empty.
    `loss_fn`: the loss training takes (the shared-prefix path: the same value, the prefix
    computed once per micro-batch); default the set's plain `loss_sum`."""
    if not len(examples):
        return None
    device = next(model.parameters()).device
    order = sorted(range(len(examples)), key=lambda i: examples.lengths[i])
    chunks = [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]
    world = accelerator.num_processes if accelerator is not None else 1
    if world > 1:
        chunks = chunks[accelerator.process_index :: world]
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for chunk in chunks:
        batch = {k: v.to(device) for k, v in examples.collate(chunk).items()}
        with autocast(device.type, precision):
            loss_sum, n = (loss_fn or examples.loss_sum)(model, batch)
        total += torch.stack([loss_sum.double(), n.double()])
    model.train(was_training)
    if world > 1:
        total = accelerator.reduce(total, reduction="sum")
    return float(total[0] / total[1]) if total[1] > 0 else None
