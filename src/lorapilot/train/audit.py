"""The update audit: prove that a real optimizer step touches exactly what it should.

Two questions are answered before a pilot spends hours training:

1. *What is trained?* `build_adapter` attaches LoRA (or unfreezes everything for full
   fine-tuning) and lists the modules that got adapter layers and every trainable tensor.
2. *Does an optimizer step move exactly those tensors?* `run_update_audit` takes a few real
   optimizer steps through the same `train_step` the training loop uses, then checks that
   every trainable tensor changed, that no frozen tensor changed by a single bit, and that
   every loss was finite. It then puts every parameter back, so training starts from the
   spec's initialisation, not from the audit's.

LoRA's B matrix starts at zero, so on the first step A's gradient is exactly zero (it is
multiplied by B) and only B moves; A moves from the second step on. The audit therefore
takes at least 2 optimizer steps: with one, every healthy lora_A would be reported unchanged.

"Changed" alone cannot tell learning from weight decay: with decay, a tensor whose gradient
is blocked still shrinks, so it changes. The audit therefore also records, through
post-accumulate-grad hooks, which trainable tensors received a non-zero gradient in any
step, and fails on those that never did (`no_gradient`).

Names: `target_modules` are module names of the *base* model (what `adapter.target_modules`
refers to, e.g. `model.layers.0.self_attn.q_proj`); tensor names (`trainable_tensors`,
`changed`, ...) are `named_parameters()` names of the model as trained (with PEFT's
`base_model.model.` prefix), the names state dicts and optimizers use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lorapilot.base.quantize import quant_state

MIN_AUDIT_STEPS = 2  # LoRA's zero-initialised B keeps A still on the first step


def snapshot_params(model) -> dict:
    """name -> detached clone of every parameter (trainable and frozen)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _same_bits(a, b) -> bool:
    """Bit-for-bit equality: same dtype, shape and bytes. torch.equal alone would call a
    tensor holding NaN changed, and would compare across dtypes after promotion."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(
        a.detach().contiguous().reshape(-1).view(torch.uint8),
        b.detach().contiguous().reshape(-1).view(torch.uint8),
    )


def update_audit(
    model,
    before: dict,
    after: dict | None = None,
    *,
    steps: int,
    losses: Sequence[float],
    got_gradient: set[str] | None = None,
) -> dict:
    """Compare parameters before and after `steps` optimizer steps.

    ok requires: (a) every trainable tensor changed, (b) no frozen tensor changed by a
    single bit (dtype included), (c) every loss finite, and at least 2 steps (see module doc).
    `after` defaults to the model's current parameters. Trainable means requires_grad now.
    `got_gradient`, when given, names the tensors that received a non-zero gradient; a
    trainable tensor outside it is listed in `no_gradient` and fails the audit.
    """
    current = dict(model.named_parameters())
    after = after if after is not None else {n: p.detach() for n, p in current.items()}
    changed, unchanged_trainable, changed_frozen = [], [], []
    n_trainable = n_frozen = 0
    for name in sorted(before):
        if name not in after:
            raise ValueError(f"parameter {name} disappeared between the snapshots")
        trainable = name in current and current[name].requires_grad
        moved = not _same_bits(before[name], after[name])
        if moved:
            changed.append(name)
        if trainable:
            n_trainable += 1
            if not moved:
                unchanged_trainable.append(name)
        else:
            n_frozen += 1
            if moved:
                changed_frozen.append(name)
    trainable_names = [n for n in sorted(before) if n in current and current[n].requires_grad]
    no_gradient = (
        [n for n in trainable_names if n not in got_gradient] if got_gradient is not None else []
    )
    nonfinite = any(not math.isfinite(x) for x in losses)
    problems = []
    if steps < MIN_AUDIT_STEPS:
        problems.append(
            f"only {steps} optimizer step(s): LoRA's A matrices move from the second step on"
        )
    if unchanged_trainable:
        problems.append(f"{len(unchanged_trainable)} trainable tensor(s) did not change")
    if no_gradient:
        problems.append(f"{len(no_gradient)} trainable tensor(s) never received a gradient")
    if changed_frozen:
        problems.append(f"{len(changed_frozen)} frozen tensor(s) changed")
    if nonfinite:
        problems.append("a loss was not finite")
    if n_trainable == 0:
        problems.append("nothing is trainable")
    return {
        "ok": not problems,
        "steps": steps,
        "losses": [float(x) for x in losses],
        "changed": changed,
        "unchanged_trainable": unchanged_trainable,
        "changed_frozen": changed_frozen,
        "no_gradient": no_gradient,
        "nonfinite_loss": nonfinite,
        "n_trainable": n_trainable,
        "n_frozen": n_frozen,
        "problems": problems,
    }


def quantization_audit(before: dict, after: dict) -> dict:
    """{tensors, changed}: the quantized weights and quantization-state tensors that changed
    (or vanished) between two `quantize.quant_state` snapshots."""
    changed = sorted(n for n in before if n not in after or not _same_bits(before[n], after[n]))
    return {"tensors": len(before), "changed": changed}


def run_update_audit(
    model,
    batches: Sequence,
    make_optimizer: Callable[[Any], Any],
    loss_fn: Callable | None = None,
    steps: int = MIN_AUDIT_STEPS,
    *,
    precision: str = "fp32",
    max_grad_norm: float | None = None,
    lora_forward: str = "fused",
) -> dict:
    """Take `steps` real optimizer steps, audit, then restore every parameter exactly.

    `batches[i]` feeds step i (cycled when shorter): a collated batch dict, or a list of
    them for gradient accumulation. `make_optimizer(model)` builds a throwaway optimizer,
    so the caller's optimizer (if any) never sees the audit. The steps go through
    `train.train_step`, the function training uses, so the audit checks the real update.
    The global RNG is forked, so dropout in the audit does not shift the training's draws.
    A failed audit is `ok: False`; turning it into exit 1 is the caller's job.
    """
    import torch

    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.loss import causal_lm_loss_sum
    from lorapilot.train.step import train_step

    if steps < MIN_AUDIT_STEPS:
        raise ValueError(f"the update audit needs at least {MIN_AUDIT_STEPS} optimizer steps")
    if not batches:
        raise ValueError("the update audit needs at least one batch")
    loss_fn = loss_fn or causal_lm_loss_sum
    before = snapshot_params(model)
    # A quantized base: its packed weights and their quantization state (absmax, quant maps,
    # nested scales, 8-bit row scales) live partly outside the parameters; they must not
    # change by one bit either.
    # The packed weights are parameters, already copied above: reuse those copies rather
    # than holding a second one (on a 7B 4-bit base that would be ~3.5 GB more).
    copied = {p.data_ptr(): before[name] for name, p in model.named_parameters()}
    quant_before = {
        k: copied[v.data_ptr()] if v.data_ptr() in copied else v.detach().clone()
        for k, v in quant_state(model).items()
    }
    was_training = model.training
    device = next(model.parameters()).device
    fork_devices = [device.index or 0] if device.type == "cuda" else []
    losses: list[float] = []
    got_gradient: set[str] = set()

    def gradient_seen(name: str):
        def hook(p) -> None:
            if p.grad is not None and bool(p.grad.ne(0).any()):
                got_gradient.add(name)

        return hook

    hooks = [
        p.register_post_accumulate_grad_hook(gradient_seen(name))
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    try:
        with torch.random.fork_rng(devices=fork_devices):
            optimizer = make_optimizer(model)
            model.train()
            for s in range(steps):
                micro = batches[s % len(batches)]
                micro = [micro] if isinstance(micro, dict) else list(micro)
                total = sum(count_target_tokens(mb) for mb in micro)
                out = train_step(
                    model,
                    optimizer,
                    None,
                    micro,
                    total,
                    precision,
                    max_grad_norm,
                    loss_fn=loss_fn,
                    lora_forward=lora_forward,
                )
                losses.append(out["loss"])
            result = update_audit(
                model, before, steps=steps, losses=losses, got_gradient=got_gradient
            )
            if quant_before:
                q = result["quant_state"] = quantization_audit(quant_before, quant_state(model))
                if q["changed"]:
                    result["ok"] = False
                    result["problems"].append(
                        f"{len(q['changed'])} quantized weight/quantization-state tensor(s) changed"
                    )
            del optimizer
    finally:
        for h in hooks:
            h.remove()
        # Put every parameter back, bit for bit, and drop stray gradients (a parameter
        # outside the optimizer keeps its .grad after zero_grad).
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dtype == before[name].dtype and p.shape == before[name].shape:
                    p.copy_(before[name])
                else:  # a bug recast or reshaped it: put the original tensor back
                    p.data = before[name]
                p.grad = None
        model.train(was_training)
    return result


def audit_batches(data, micro_batch: int, steps: int = 2) -> list:
    """Real batches for the update audit: the first micro-batches of a training set
    (`train.examples`)."""
    n = len(data)
    out = []
    for i in range(steps):
        idx = list(range(i * micro_batch, min((i + 1) * micro_batch, n))) or list(
            range(min(micro_batch, n))
        )
        out.append(data.collate(idx))
    return out
