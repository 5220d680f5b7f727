"""The pre-rental estimate (`lorapilot budget --gpu`) against every measured row there is.

    .venv/bin/python bench/rental_estimate.py [--json]          estimate vs measured, per row
    .venv/bin/python bench/rental_estimate.py --fit [--write]   refit the time model's constants
    .venv/bin/python bench/rental_estimate.py --measure-bandwidth   this CPU's copy bandwidth

The rows live in src/lorapilot/sizing/calibration.json, each with its source: the H200 steps
of bench/prefix_paths.py at 135M, 1.7B and 8B shapes (time and peak memory, the shared and
the plain path), the H200 probe of examples/ticket-triage from scripts/gpu_check.sh, label
scoring batches, and this CPU's probe of ticket-triage. Time: the time model
(sizing/timemodel.py) with the stored constants; memory: the memory model
(sizing/memory.py, GPU settings) at the row's shape, rows, tokens and path. `--fit` searches
the constants that minimise the largest relative time error per device kind (the stored ones
came from it); `--write` stores them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from importlib import resources

from lorapilot.sizing.gpus import (
    BENCH_ADAPTER,
    calibration,
    calibration_rows,
    gpu_classes,
    predict_row,
)
from lorapilot.sizing.memory import GIB, estimate_step_memory
from lorapilot.sizing.probe_plan import lora_trainable_params
from lorapilot.sizing.timemodel import Calibration, GpuClass

CAL_FILE = resources.files("lorapilot.sizing").joinpath("calibration.json")


def devices() -> dict[str, GpuClass]:
    out = {c.name: c for c in gpu_classes()}
    for d in json.loads(CAL_FILE.read_text("utf-8")).get("devices", []):
        fields = {f.name for f in dataclasses.fields(GpuClass)}
        out[d["name"]] = GpuClass(**{k: v for k, v in d.items() if k in fields})
    return out


def memory_estimate(row: dict, shape) -> float:
    est = estimate_step_memory(
        shape,
        trainable_params=lora_trainable_params(shape, BENCH_ADAPTER),
        weight_dtype_bytes=row["weight_bytes"],
        micro_batch=row["rows"],
        seq_len=row["seq_len"],
        precision="bf16",
        grad_checkpointing=row["grad_checkpointing"],
        loss_positions_per_example=row["loss_positions"],
        lora_rank=16,
        shared_prefix_tokens=row["shared_prefix"],
    )
    return est["total"] / GIB


def table(cals: dict[str, Calibration]) -> list[dict]:
    rows, shapes = calibration_rows()
    devs = devices()
    out = []
    for row in rows:
        shape = shapes[row["shape"]]
        est = predict_row(row, devs[row["device"]], cals[row["kind"]], shape)
        item = {
            "device": row["device"],
            "what": row["what"],
            "shape": row["shape"],
            "case": row["case"],
            "rows": row.get("rows") or row.get("batch"),
            "path": ("shared" if row.get("shared_prefix") else "unshared")
            if row["what"] == "train_step"
            else "score",
            "ckpt": row.get("grad_checkpointing", False),
            "measured_s": row["measured_s"],
            "estimated_s": round(est, 4),
            "time_error": round(est / row["measured_s"] - 1, 3),
            "fitted_on": row.get("fit", True),
        }
        if row.get("peak_gib"):
            mem = memory_estimate(row, shape)
            item.update(
                measured_gib=row["peak_gib"],
                estimated_gib=round(mem, 2),
                memory_error=round(mem / row["peak_gib"] - 1, 3),
            )
        out.append(item)
    return out


def fit(kind: str, what: str) -> tuple[float, float, float, float]:
    """(overhead per layer, efficiency, checkpointing overhead, worst |error|) minimising the
    worst relative error of `kind`'s `what` rows over a grid (the checkpointing factor only
    where rows with checkpointing exist)."""
    rows, shapes = calibration_rows()
    devs = devices()
    mine = [r for r in rows if r["kind"] == kind and r["what"] == what and r.get("fit", True)]
    factors = (
        [1 + i / 10 for i in range(0, 13)]
        if any(r.get("grad_checkpointing") for r in mine)
        else [1.0]
    )
    best = (0.0, 0.0, 1.0, float("inf"))
    for ov in [i * 2e-4 for i in range(0, 61)]:
        for eff in [i / 100 for i in range(5, 91)]:
            for factor in factors:
                cal = Calibration(ov, eff, ov, eff, checkpointing_overhead=factor)
                worst = max(
                    abs(
                        predict_row(r, devs[r["device"]], cal, shapes[r["shape"]]) / r["measured_s"]
                        - 1
                    )
                    for r in mine
                )
                if worst < best[3]:
                    best = (ov, eff, factor, worst)
    return best


def measure_bandwidth() -> float:
    """Copy bandwidth (read + write) of a 512 MiB fp32 tensor, best of 5, GB/s."""
    import torch

    a = torch.ones(128 * 1024 * 1024)
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        best = max(best, 2 * a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--fit", action="store_true", help="refit the constants per device kind")
    ap.add_argument(
        "--write", action="store_true", help="with --fit: store them in calibration.json"
    )
    ap.add_argument("--measure-bandwidth", action="store_true", help="this CPU's copy bandwidth")
    args = ap.parse_args()
    if args.measure_bandwidth:
        print(json.dumps({"copy_bandwidth_gbs": round(measure_bandwidth(), 1)}))
        return
    cals = {k: calibration(k) for k in ("gpu", "cpu")}
    if args.fit:
        data = json.loads(CAL_FILE.read_text("utf-8"))
        for kind in ("gpu", "cpu"):
            ov, eff, factor, worst = fit(kind, "train_step")
            eov, eeff, _, eworst = fit(kind, "eval_batch")
            print(
                f"{kind}: train overhead {ov * 1e3:.2f} ms/layer, efficiency {eff:.2f}, "
                f"checkpointing x{factor:.1f} (worst {worst:.1%}); eval overhead "
                f"{eov * 1e3:.2f} ms/layer, efficiency {eeff:.2f} (worst {eworst:.1%})"
            )
            data["kinds"][kind].update(
                overhead_s_per_layer=round(ov, 5),
                efficiency=eff,
                checkpointing_overhead=factor,
                eval_overhead_s_per_layer=round(eov, 5),
                eval_efficiency=eeff,
            )
        if args.write:
            path = str(CAL_FILE)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1)
                f.write("\n")
            print(f"written: {path}")
        return
    rows = table(cals)
    summary = {}
    for kind in ("h200", "zen4-2core"):
        errs = [abs(r["time_error"]) for r in rows if r["device"] == kind]
        mems = [abs(r["memory_error"]) for r in rows if r["device"] == kind and "memory_error" in r]
        summary[kind] = {
            "rows": len(errs),
            "time_error_max": max(errs) if errs else None,
            "time_error_median": statistics.median(errs) if errs else None,
            "memory_rows": len(mems),
            "memory_error_max": max(mems) if mems else None,
        }
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
        return
    head = f"{'device':<11}{'what':<11}{'shape':<6}{'case':<20}{'rows':>5} {'path':<9}{'ckpt':<6}"
    print(head + f"{'meas s':>8}{'est s':>8}{'err':>7}{'meas GiB':>10}{'est GiB':>9}{'err':>7}")
    for r in rows:
        mem = (
            f"{r['measured_gib']:>10.1f}{r['estimated_gib']:>9.1f}{r['memory_error']:>7.0%}"
            if "measured_gib" in r
            else ""
        )
        print(
            f"{r['device']:<11}{r['what']:<11}{r['shape']:<6}{r['case'][:19]:<20}{r['rows']:>5} "
            f"{r['path']:<9}{str(r['ckpt']):<6}{r['measured_s']:>8.3f}{r['estimated_s']:>8.3f}"
            f"{r['time_error']:>7.0%}{mem}"
        )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
