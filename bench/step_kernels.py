"""How many device kernels one training step launches, eager and with `train.compile: on`:
on a GPU the pilots' steps are bound by launches (bench/README.md, "On a GPU"), so the count
is what compile and CUDA graphs cut. Counted on the CPU with torch's profiler, as a proxy:

    .venv/bin/python bench/step_kernels.py [--shape 135m] [--case ticket] [--no-compile] [--json]

One `train.step.train_step` of lorapilot's plain loss (`causal_lm_loss_sum`: the path
`shared_prefix: auto` takes on a GPU at 135M) on a random Llama of the shape
(`bench/prefix_paths.py`), base held in bf16, bf16 autocast. Counted: the profiler's aten
operations and inductor kernels with no such operation beneath them, views, allocations and
host-side scalars (copies and fills of 0-d tensors) left out: each would be one launch on a
GPU. Gradient clipping and the
optimizer are counted apart: on a CPU they run per tensor (420 LoRA tensors at 135M), on a
GPU as a few foreach launches. `eager` runs the LoRA linears as training does
(`train.lora_forward: fused`), `eager_peft_forward` with PEFT's own forward. The compiled
side compiles with inductor (C++ kernels, made to show in the profiler with
TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE): minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

# not launches: views, allocations, host scalars, and composites whose kernels are counted
NOT_LAUNCHES = {
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::t",
    "aten::transpose", "aten::permute", "aten::expand", "aten::as_strided", "aten::slice",
    "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::alias",
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resolve_conj",
    "aten::resolve_neg", "aten::lift_fresh", "aten::split", "aten::chunk", "aten::narrow",
    "aten::unbind", "aten::view_as", "aten::set_", "aten::result_type", "aten::lift",
    "aten::_has_compatible_shallow_copy_type", "aten::_local_scalar_dense", "aten::item",
    "aten::is_nonzero", "aten::_to_copy", "aten::to", "aten::contiguous", "aten::matmul",
    "aten::linear", "aten::dropout", "aten::clone",
}  # fmt: skip


def _is_kernel(event) -> bool:
    name = event.name
    inductor = "fused" in name or name.startswith("cpp_")
    # a copy or fill of a 0-d tensor is a host scalar made for an op (e.g. `grad * alpha`):
    # on a GPU the scalar goes to the kernel as an argument, no launch
    scalar = name in ("aten::copy_", "aten::fill_") and all(
        not shape for shape in event.input_shapes if isinstance(shape, list)
    )
    return inductor or (name.startswith("aten::") and name not in NOT_LAUNCHES and not scalar)


def count_step(step) -> dict:
    """Launch-like operations of one call of `step()` (after two warm-up calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    events = prof.events()
    above_a_kernel = set()
    for e in events:
        if _is_kernel(e):
            p = e.cpu_parent
            while p is not None:
                above_a_kernel.add(id(p))
                p = p.cpu_parent
    by_name: collections.Counter = collections.Counter()
    apart = 0  # clipping and the optimizer
    for e in events:
        if not _is_kernel(e) or id(e) in above_a_kernel:
            continue
        p, per_tensor = e.cpu_parent, False
        while p is not None:
            per_tensor |= p.name.startswith("Optimizer.step") or "clip_grad" in p.name
            p = p.cpu_parent
        if per_tensor:
            apart += 1
        else:
            by_name["inductor kernel" if not e.name.startswith("aten::") else e.name] += 1
    return {
        "kernels": sum(by_name.values()),
        "clip_and_optimizer": apart,
        "step_s": round(seconds, 3),
        "top": dict(by_name.most_common(8)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="135m")
    ap.add_argument("--case", default="ticket")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE"] = "1"

    import torch
    from prefix_paths import CASES, SHAPES, batch_for, build

    from lorapilot.spec import TrainSpec
    from lorapilot.train import compiled
    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.loss import causal_lm_loss_sum
    from lorapilot.train.step import make_optimizer, train_step

    clip = torch.nn.utils.clip_grad_norm_

    def named_clip(*a, **k):  # so that the profiler names clipping's operations
        with torch.profiler.record_function("clip_grad_norm_"):
            return clip(*a, **k)

    torch.nn.utils.clip_grad_norm_ = named_clip
    torch.manual_seed(0)
    model, _ = build(args.shape, torch.device("cpu"), "bfloat16")
    batch = batch_for(dict(CASES[args.case]), SHAPES[args.shape]["vocab_size"], random.Random(1))
    optimizer = make_optimizer(model, TrainSpec())
    targets = count_target_tokens(batch)

    def step(lora_forward="fused"):
        train_step(model, optimizer, None, [batch], targets, "bf16", 1.0,
                   loss_fn=causal_lm_loss_sum, lora_forward=lora_forward)  # fmt: skip

    out: dict = {"shape": args.shape, "case": args.case, "threads": torch.get_num_threads(),
                 "eager": count_step(step),
                 "eager_peft_forward": count_step(lambda: step("peft"))}  # fmt: skip
    print(f"eager: {out['eager']}", file=sys.stderr, flush=True)
    print(f"eager, PEFT's LoRA forward: {out['eager_peft_forward']}", file=sys.stderr, flush=True)
    if not args.no_compile:
        record = compiled.compile_decoder(
            model, causal_lm_loss_sum, batch, "bf16", lambda m: print(m, file=sys.stderr)
        )
        out["compiled"] = {**count_step(step), "compile": record}
    print(json.dumps(out, indent=2) if args.json else out)


if __name__ == "__main__":
    main()
