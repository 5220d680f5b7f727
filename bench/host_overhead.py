"""The host's share of a training step: Python and dispatch, with the arithmetic made
negligible. On a GPU the pilots' steps are bound by it (bench/README.md, "On a GPU"): a
kernel launched from Python costs the host microseconds whatever its size. Measured on a
CPU, as a proxy, on a model with the real layer count and LoRA layout but 64 wide, 2 rows
of 8 tokens:

    .venv/bin/python bench/host_overhead.py [--layers 32] [--rounds 40] [--json]

Each round runs one forward and backward per side (`train.lora_forward`: fused, peft), in
alternating order, under bf16 autocast on the base held in bf16 (as lorapilot trains on a
GPU); the figure is the median of the rounds' process CPU times (one thread), so a busy
machine moves it less than wall time.
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


if __name__ == "__main__":
    main()
