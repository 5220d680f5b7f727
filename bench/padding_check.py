"""Does padding a micro-batch to a multiple of N tokens change training? One micro-batch of a
pilot's train split, the loss and the LoRA gradients of one step, padded or not, in fp32 and
in bf16 autocast (the base held in bf16 as the trainer holds it), on both loss paths.

    .venv/bin/python bench/padding_check.py [--pilot DIR] [--multiple 64] [--rows 8] [--json]

`train.pad_to_multiple_of` (64 by default under `train.compile_mode: reduce-overhead` on a GPU)
right-pads batches so that their shapes repeat; padding has no attention and no loss, so only
rounding may differ. The adapter's B matrices (zero at initialisation) are set to small random
values first, so that every LoRA gradient is non-zero; dropout is off.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pilot", type=Path, default=Path("examples/ticket-triage"))
    ap.add_argument("--multiple", type=int, default=64)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from lorapilot.base.adapter import build_adapter
    from lorapilot.base.models import load_base, pad_id_of
    from lorapilot.base.precision import autocast, hold_frozen, resolve
    from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
    from lorapilot.spec import load_pilot
    from lorapilot.train.batches import collate
    from lorapilot.train.loss import causal_lm_loss_sum, shared_prefix_loss_sum

    pilot = load_pilot(args.pilot)
    _, base, tok = load_base(pilot, use="train")
    spec = pilot.spec.adapter.model_copy(update={"dropout": 0.0})
    model, _ = build_adapter(base, spec, seed=0)
    model.train()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.01)
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    examples = encode_records(
        fmt, pilot.spec.task, prepared.splits["train"], prepared.answer_budget
    )
    examples = examples[: args.rows]
    lora = [p for p in model.parameters() if p.requires_grad]

    def step(multiple: int, precision: str, loss_fn):
        model.zero_grad(set_to_none=True)
        batch = collate(examples, pad_id_of(tok), multiple)
        with autocast("cpu", precision):
            loss, n = loss_fn(model, batch)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in lora])
        return int(batch["input_ids"].shape[1]), float(loss.detach() / n), grads

    out: dict = {"pilot": str(args.pilot), "rows": len(examples), "multiple": args.multiple}
    precisions = ["fp32"] + (["bf16"] if resolve("auto", "cpu") == "bf16" else [])
    for precision in precisions:
        if precision == "bf16":
            hold_frozen(model, "bfloat16")
        for path, fn in (("shared", shared_prefix_loss_sum), ("unshared", causal_lm_loss_sum)):
            w1, l1, g1 = step(1, precision, fn)
            w2, l2, g2 = step(args.multiple, precision, fn)
            out[f"{precision}_{path}"] = {
                "width": [w1, w2],
                "loss": [round(l1, 8), round(l2, 8)],
                "loss_abs_diff": abs(l1 - l2),
                "grad_rel_diff": float((g1 - g2).norm() / g1.norm()),
            }
    print(json.dumps(out, indent=2) if args.json else out)


if __name__ == "__main__":
    main()
