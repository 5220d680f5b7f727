"""The host's share of a training step: Python and dispatch, with the arithmetic made
negligible. On a GPU the pilots' steps are bound by it (bench/README.md, "On a GPU"): a
kernel launched from Python costs the host microseconds whatever its size. Measured on a
CPU, as a proxy, on a model with the real layer count and LoRA layout but 64 wide, 2 rows
of 8 tokens:

    .venv/bin/python bench/host_overhead.py [--layers 32] [--rounds 40] [--json]
    .venv/bin/python bench/host_overhead.py --profile [--layers 32] [--json]

Each round runs one forward and backward per side (`train.lora_forward`: fused, peft), in
alternating order, under bf16 autocast on the base held in bf16 (as lorapilot trains on a
GPU); the figure is the median of the rounds' process CPU times (one thread), so a busy
machine moves it less than wall time.

`--profile` instead splits the host time of whole `train.step.train_step` calls (forward,
backward, clipping, AdamW as `make_optimizer` builds it; 8 rows) by where it is spent:
Python's profiler's own time per function, summed by package (`torch C++`: time inside
torch's compiled functions, the autograd engine's backward among them), over 10 steps after
3; and the functions with the most own time. Attention stays SDPA, as on a GPU (the CPU's
switch to eager attention for short rows is turned off).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (8B: 32)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true", help="split a whole step's host time")
    args = ap.parse_args()

    import prefix_paths
    import torch

    from lorapilot.base.precision import autocast
    from lorapilot.train.lora_forward import fused
    from lorapilot.train.loss import causal_lm_loss_sum

    torch.set_num_threads(1)
    prefix_paths.SHAPES["narrow"] = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False,
    )  # fmt: skip
    model, _ = prefix_paths.build("narrow", torch.device("cpu"), "bfloat16")
    case = dict(rows=2, prefix=0, own=(6, 6), answer=2)
    batch = prefix_paths.batch_for(case, 1000, random.Random(0))

    if args.profile:
        out = profile_steps(
            model, prefix_paths.batch_for(dict(case, rows=8), 1000, random.Random(0))
        )
        print(json.dumps(out, indent=2) if args.json else out)
        return

    def forward_backward(mode: str) -> float:
        t0 = time.process_time()
        with fused(model, mode), autocast("cpu", "bf16"):
            loss, _ = causal_lm_loss_sum(model, batch)
        loss.backward()
        seconds = time.process_time() - t0
        model.zero_grad(set_to_none=True)
        return seconds

    sides = ("fused", "peft")
    for mode in sides * 3:  # warm-up
        forward_backward(mode)
    times: dict[str, list[float]] = {m: [] for m in sides}
    for r in range(args.rounds):
        for mode in sides if r % 2 == 0 else sides[::-1]:
            times[mode].append(forward_backward(mode))
    out = {
        "layers": args.layers,
        "lora_linears": 7 * args.layers,
        "rounds": args.rounds,
        **{f"{m}_ms": round(1e3 * statistics.median(t), 2) for m, t in times.items()},
    }
    out["fused_over_peft"] = round(out["fused_ms"] / out["peft_ms"], 3)
    print(json.dumps(out, indent=2) if args.json else out)


PACKAGES = (
    "lorapilot",
    "peft",
    "transformers",
    "torch/optim",
    "torch/autograd",
    "torch/nn",
    "torch",
)


def profile_steps(model, batch, steps: int = 10) -> dict:
    """Own time per package of `steps` whole training steps, in ms a step (cProfile)."""
    import collections
    import cProfile
    import pstats

    from lorapilot.spec import TrainSpec
    from lorapilot.train import step as step_module
    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.loss import causal_lm_loss_sum
    from lorapilot.train.step import make_optimizer, optimizer_record, train_step

    optimizer = make_optimizer(model, TrainSpec())
    targets = count_target_tokens(batch)
    # SDPA as on a GPU: no CPU switch to eager attention for short rows (it walks the model's
    # modules twice a step, host time a GPU step does not spend)
    step_module.EAGER_ATTENTION_MAX_WIDTH = 0

    def step():
        train_step(model, optimizer, None, [batch], targets, "bf16", 1.0,
                   loss_fn=causal_lm_loss_sum)  # fmt: skip

    for _ in range(3):
        step()
    t0 = time.process_time()
    for _ in range(steps):
        step()
    cpu_ms = 1e3 * (time.process_time() - t0) / steps
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    by: collections.Counter = collections.Counter()
    top: collections.Counter = collections.Counter()
    for (path, line, name), (_, _, own, _, _) in stats.items():
        key = (
            "torch C++"
            if path == "~"
            else next((k for k in PACKAGES if f"/{k}/" in path), "other Python")
        )
        by[key] += own
        where = name if path == "~" else f"{Path(path).name}:{line}({name})"
        top[where] += own
    total = sum(by.values())
    return {
        "rows": int(batch["input_ids"].shape[0]),
        "optimizer": optimizer_record(optimizer),
        "host_ms_per_step": round(cpu_ms, 2),
        "profiled_ms_per_step": round(1e3 * total / steps, 2),
        "by_package": {k: {"ms": round(1e3 * v / steps, 2), "share": round(v / total, 3)}
                       for k, v in by.most_common()},
        "top_functions_ms": {k: round(1e3 * v / steps, 2) for k, v in top.most_common(8)},
    }  # fmt: skip


if __name__ == "__main__":
    main()
