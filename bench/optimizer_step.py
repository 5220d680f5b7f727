"""One AdamW step over a LoRA adapter's tensors, by implementation: torch's per-tensor loop,
foreach (a dozen launches over all tensors) and fused (one kernel), which is what
`train.step.make_optimizer` now takes where torch has it (the Trainer's default
`adamw_torch_fused` too):

    .venv/bin/python bench/optimizer_step.py [--shapes 135m,8b] [--rank 16] [--steps 12] [--json]

The tensors are the LoRA A and B matrices of every attention and MLP projection of the
shape (bench/prefix_paths.py's SHAPES: 420 tensors at 135M, 448 at 8B), fp32 as training keeps
them, with fresh random gradients each step. Per implementation: the median wall time of a
step (after 2 warm-up steps; the device synchronised around it on a GPU) and its process
CPU time (the host's share, what a launch-bound GPU step pays), and the largest difference of
any parameter from the loop's after all steps (the same update, rounded differently).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

IMPLEMENTATIONS = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def lora_shapes(shape: dict, rank: int) -> list[tuple[int, int]]:
    """(rows, cols) of every LoRA A and B matrix of an all-linear adapter on the shape."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    linears = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]  # q k v o gate up down
    return [
        m
        for _ in range(shape["num_hidden_layers"])
        for o, n in linears
        for m in ((rank, n), (o, rank))
    ]


def run(shapes: list[tuple[int, int]], kind: str, steps: int, device) -> tuple[dict, list]:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    params = [
        torch.nn.Parameter(0.01 * torch.randn(s, generator=gen, device=device)) for s in shapes
    ]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **IMPLEMENTATIONS[kind])
    wall, cpu = [], []
    for _ in range(steps):
        for p in params:
            p.grad = 1e-3 * torch.randn(p.shape, generator=gen, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        optimizer.step()
        c1 = time.process_time()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        cpu.append(c1 - c0)
    figures = {
        "step_ms": round(1e3 * statistics.median(wall[2:]), 3),
        "host_cpu_ms": round(1e3 * statistics.median(cpu[2:]), 3),
    }
    return figures, [p.detach() for p in params]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="135m,8b")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    from prefix_paths import SHAPES

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "threads": torch.get_num_threads(), "rank": args.rank, "shapes": {}}  # fmt: skip
    for name in [s for s in args.shapes.split(",") if s]:
        shapes = lora_shapes(SHAPES[name], args.rank)
        row: dict = {"tensors": len(shapes), "params": sum(a * b for a, b in shapes)}
        results = {k: run(shapes, k, args.steps, device) for k in IMPLEMENTATIONS}
        loop = results["for-loop"][1]
        for kind, (figures, params) in results.items():
            diff = max(float((a - b).abs().max()) for a, b in zip(params, loop, strict=True))
            row[kind] = {**figures, "max_diff_vs_loop": diff}
        row["fused_speedup_vs_torch_default"] = round(
            row["foreach" if device.type == "cuda" else "for-loop"]["step_ms"]
            / row["fused"]["step_ms"],
            2,
        )
        out["shapes"][name] = row
        print(f"{name}: {row}", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2) if args.json else out)


if __name__ == "__main__":
    main()
