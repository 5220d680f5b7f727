"""One training step of the default model in fp32 and in bf16 autocast, on this CPU.

    .venv/bin/python bench/precision_cpu.py [--pilot examples/ticket-triage] [--micro-batch 2]
        [--steps 2] [--json]

Why: `precision: auto` trains in fp32 on a CPU without AMX or AVX512-BF16, because bf16 is
emulated there. This measures what that choice is worth on the machine it runs on: the
pilot's base and adapter (`load_base`, `build_adapter`), one micro-batch of the pilot's first
train examples (`prepare_data`, the pilot's formatter), the loop's own `train_step`, one
warm-up step then `--steps` timed steps per precision, fresh AdamW each, median reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lorapilot.base.adapter import build_adapter
from lorapilot.base.models import load_base, pad_id_of
from lorapilot.base.precision import resolve
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.records.environment import cpu_flags, cpu_has_fast_bf16, cpu_model
from lorapilot.spec import load_pilot
from lorapilot.train.batches import collate, count_target_tokens
from lorapilot.train.step import make_optimizer, train_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pilot", default="examples/ticket-triage")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    pilot = load_pilot(args.pilot)
    _, model, tok = load_base(pilot, use="exact")  # fp32 weights, timed under each precision
    model, _ = build_adapter(model, pilot.spec.adapter, seed=0)
    prepared = prepare_data(pilot, tok)
    records = prepared.splits["train"][: args.micro_batch]
    enc = encode_records(
        formatter_for(pilot, tok), pilot.spec.task, records, prepared.answer_budget
    )
    batch = collate(enc, pad_id_of(tok))
    targets = count_target_tokens(batch)
    model.train()
    out: dict = {
        "cpu": cpu_model(),
        "fast_bf16": cpu_has_fast_bf16(),
        "amx": sorted(f for f in cpu_flags() if f.startswith("amx") or f == "avx512_bf16"),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "batch": list(batch["input_ids"].shape),
        "auto_resolves_to": resolve("auto", "cpu"),
        "step_s": {},
    }
    for precision in ("fp32", "bf16"):
        opt = make_optimizer(model, pilot.spec.train)
        times = []
        for i in range(1 + args.steps):
            t0 = time.perf_counter()
            train_step(model, opt, None, [batch], targets, precision, 1.0)
            if i:  # the first step is a warm-up
                times.append(time.perf_counter() - t0)
        out["step_s"][precision] = round(statistics.median(times), 3)
    out["bf16_over_fp32"] = round(out["step_s"]["bf16"] / out["step_s"]["fp32"], 2)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
