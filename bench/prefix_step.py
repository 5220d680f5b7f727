"""One training step through the shared prompt prefix vs the unshared step, on a pilot's data.

    .venv/bin/python bench/prefix_step.py [--pilot DIR] [--width N] [--steps N] [--json]

Loads the pilot's base and adapter (`lorapilot.base.models.load_base`, `adapter.build_adapter`),
encodes its train split with the pilot's formatter, takes the `micro_batch` examples whose
lengths are closest to `--width` (default: the median), and times `train.step.train_step` on
that one batch (fp32 on a CPU, the pilot's precision elsewhere) with `causal_lm_loss_sum`
(every row computes the prefix) and with `shared_prefix_loss_sum` (the prefix once per
micro-batch), each with eager and SDPA attention. Reported: the batch's width and shared
prefix length, the median step time of `--steps` steps after one warm-up per side, the
ratio, and the largest relative difference of the two losses at the first step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilot", type=Path, default=Path("examples/invoice-fields"))
    parser.add_argument("--width", type=int, default=None, help="target tokens (default: p50)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from lorapilot.base.adapter import build_adapter
    from lorapilot.base.models import load_base, pad_id_of
    from lorapilot.base.precision import hold_for_training, resolve
    from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
    from lorapilot.spec import load_pilot
    from lorapilot.train.batches import collate, count_target_tokens
    from lorapilot.train.loss import causal_lm_loss_sum, shared_prefix_len, shared_prefix_loss_sum
    from lorapilot.train.step import make_optimizer, train_step

    pilot = load_pilot(args.pilot)
    _, model, tok = load_base(pilot, use="train")
    model, _ = build_adapter(model, pilot.spec.adapter, seed=0)
    hold_for_training(model, pilot.spec)  # as the trainer holds the base
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    precision = resolve(pilot.spec.train.precision, device.type)
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    examples = encode_records(
        fmt, pilot.spec.task, prepared.splits["train"], prepared.answer_budget
    )
    width = args.width or int(statistics.median(e.n_tokens for e in examples))
    examples.sort(key=lambda e: (abs(e.n_tokens - width), e.n_tokens))
    batch = collate(examples[: pilot.spec.train.micro_batch], pad_id_of(tok))
    batch = {k: v.to(device) for k, v in batch.items()}
    targets = count_target_tokens(batch)
    cfg = pilot.spec.train
    base = next(m for m in model.modules() if hasattr(m, "set_attn_implementation"))
    out: dict = {
        "pilot": str(args.pilot),
        "device": str(device),
        "precision": precision,
        "threads": torch.get_num_threads(),
        "rows": int(batch["input_ids"].shape[0]),
        "width": int(batch["input_ids"].shape[1]),
        "shared_prefix_tokens": shared_prefix_len(batch),
        "sides": {},
    }
    for attn in ("eager", "sdpa"):
        base.set_attn_implementation(attn)
        losses = {}
        for name, fn in (("unshared", causal_lm_loss_sum), ("shared", shared_prefix_loss_sum)):
            optimizer = make_optimizer(model, cfg)
            initial = {
                k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad
            }
            times = []
            for i in range(args.steps + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = train_step(
                    model,
                    optimizer,
                    None,
                    [batch],
                    targets,
                    precision,
                    cfg.max_grad_norm,
                    loss_fn=fn,
                )
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                if i == 0:
                    losses[name] = res["loss"]
            with torch.no_grad():  # the next side starts from the same weights
                for k, v in model.named_parameters():
                    if k in initial:
                        v.copy_(initial[k])
            out["sides"][f"{attn}/{name}"] = round(statistics.median(times[1:]), 3)
        a, b = losses["unshared"], losses["shared"]
        out[f"{attn}_first_loss_rel_diff"] = abs(a - b) / max(abs(a), 1e-12)
        out[f"{attn}_ratio"] = round(
            out["sides"][f"{attn}/unshared"] / out["sides"][f"{attn}/shared"], 3
        )
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
