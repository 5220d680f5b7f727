"""Throughput of one decoder linear layer (SmolLM2-135M's MLP, 576 -> 1536) by row count and
dtype on this machine: why a prompt pass (thousands of rows) runs near the CPU's matmul peak
while a decode step (one row per sequence) does not.

    .venv/bin/python bench/matmul_shapes.py [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(1536, 576, dtype=dtype)
        for m in (1, 16, 32, 256, 2000):
            x = torch.randn(m, 576, dtype=dtype)
            for _ in range(5):
                F.linear(x, w)
            n = 200 if m <= 32 else 20
            t0 = time.perf_counter()
            for _ in range(n):
                F.linear(x, w)
            dt = (time.perf_counter() - t0) / n
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "rows": m,
                    "us": round(dt * 1e6, 1),
                    "gflop_per_s": round(2 * m * 1536 * 576 / dt / 1e9, 1),
                }
            )
    out = {"threads": torch.get_num_threads(), "shape": [1536, 576], "results": rows}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for r in rows:
            print(
                f"{r['dtype']:>9} rows {r['rows']:>5}: {r['us']:>8.1f} us  "
                f"{r['gflop_per_s']:>6.1f} GFLOP/s"
            )


if __name__ == "__main__":
    main()
