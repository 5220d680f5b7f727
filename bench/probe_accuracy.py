"""How good are `probe` + `budget` at forecasting a real run? (default model, ticket-triage)

On a temporary copy of examples/ticket-triage with the default base model:

1. `probe` (full steps at the typical and long lengths, checkpointing off and on);
2. `budget` for a run of --steps steps (`--set train.max_steps=N`): the forecast;
3. a real train run with the same `--set train.max_steps=N`;
4. `budget` again, which now sets the estimate beside that run (same number of steps,
   without the verify evaluation, which is a separate run).

Prints the forecast total vs the train run's wall time (its record's duration_s), the
like-for-like comparison per part, and the memory model vs the probe's measured peaks
(CPU: peak RSS increase during the steps vs the estimate without weights and trainable
parameters; CUDA: max allocated vs the whole estimate), plus the train run's own peak
(steps.jsonl peak_memory_bytes: CPU peak RSS of the process, CUDA max allocated) vs the
estimate's total. Error = (estimate - actual) / actual: positive means overestimated.

    .venv/bin/python bench/probe_accuracy.py [--steps 30] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def pct(estimate: float | None, actual: float | None) -> str:
    if not estimate or not actual:
        return "-"
    return f"{100 * (estimate - actual) / actual:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of the real train run")
    ap.add_argument(
        "--json", action="store_true", help="also print every figure as one JSON object"
    )
    args = ap.parse_args()

    from lorapilot.base.models import fetch_default_model
    from lorapilot.fsutil import read_jsonl
    from lorapilot.records import environment, registry
    from lorapilot.spec import load_pilot
    from lorapilot.steps.budget import run_budget
    from lorapilot.steps.probe import run_probe
    from lorapilot.steps.train import run_train

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    fetch_default_model()  # reuses a folder that passes its hash check
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="lorapilot-bench-") as tmp:
        pilot = Path(tmp) / "ticket-triage"
        shutil.copytree(
            ROOT / "examples" / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs")
        )
        sets = [f"train.max_steps={args.steps}"]

        t0 = time.time()
        probe = run_probe(load_pilot(pilot), progress=False, log=log)
        probe_s = time.time() - t0
        forecast = run_budget(load_pilot(pilot, sets))
        log(f"bench: forecast for {args.steps} steps: {forecast['estimate']['total_s']:.1f} s")
        train = run_train(load_pilot(pilot, sets), progress=False, log=log)
        after = run_budget(load_pilot(pilot))
        rec = registry.get_run(pilot, train["run_id"])
        steps = read_jsonl(registry.runs_dir(pilot) / train["run_id"] / "steps.jsonl")

    est = forecast["estimate"]
    actual_total = rec.duration_s
    rows = probe["measurements"]
    spec_rows = [r for r in rows if r["micro_batch"] == 8 and not r["grad_checkpointing"]]
    train_peak = max((s["peak_memory_bytes"] for s in steps), default=None)
    env = environment.snapshot()
    print(
        f"# probe accuracy, {dt.date.today()}, {env['cpu']} x{env['cpu_count']} "
        f"(load {probe['environment']['other_processes'].get('load_average', ['?'])[0]:.2f}), "
        f"accelerator {probe['environment']['accelerator']}, torch threads "
        f"{env['torch_num_threads']}"
    )
    print(f"probe: {probe_s:.0f} s; train run {train['run_id']}: {len(steps)} steps")
    print()
    print("time                         estimate     actual    error")
    print(
        f"forecast total (budget)   {est['total_s']:9.1f} s {actual_total:9.1f} s  "
        f"{pct(est['total_s'], actual_total)}"
        "   (forecast includes the verify evaluation and the 20% margin)"
    )
    for key, e in (after.get("errors") or {}).items():
        if key == "steps":
            continue
        print(
            f"same-steps {key:<14} {e['estimate']:9.1f} s {e['actual']:9.1f} s  "
            f"{pct(e['estimate'], e['actual'])}"
        )
    print()
    print("memory (probe)               measured   estimate    error   basis")
    for r in rows:
        ckpt = "on " if r["grad_checkpointing"] else "off"
        what = f"{r['length']:<7} {r['seq_len']:>4} x {r['micro_batch']:<3} ckpt {ckpt}"
        print(
            f"{what}  {r['peak_memory_bytes'] / GIB:7.3f} GiB "
            f"{r['estimated_peak_memory_bytes'] / GIB:7.3f} GiB "
            f"{pct(r['estimated_peak_memory_bytes'], r['peak_memory_bytes']):>8}   "
            f"{r['estimate_basis']}"
        )
    if train_peak:
        for r in spec_rows:
            print(
                f"train run peak vs estimate total ({r['length']}): {train_peak / GIB:.3f} GiB vs "
                f"{r['estimated_total_bytes'] / GIB:.3f} GiB  "
                f"{pct(r['estimated_total_bytes'], train_peak)}"
            )
    print(f"bench wall time: {time.time() - started:.0f} s")
    if args.json:
        print(
            json.dumps(
                {
                    "probe": probe,
                    "forecast": forecast,
                    "after": after,
                    "train": train,
                    "train_duration_s": actual_total,
                    "train_peak_bytes": train_peak,
                },
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
