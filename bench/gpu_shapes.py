"""lorapilot's training step at the pilots' real model sizes against a plain PEFT step, and an
8B step under a 24/40 GiB memory cap, without model files (#36 items 5 and 6).

    .venv/bin/python bench/gpu_shapes.py [--shapes 135m,1.7b,8b] [--cases ticket,long]
        [--steps 4] [--cap-gib 24,40] [--cap-rows 8] [--cap-tokens 512] [--compile]
        [--compile-modes default,reduce-overhead] [--checkpointing] [--peft-forward] [--json]

Per shape and case (random Llama-architecture models and token ids from
`bench/prefix_paths.py`), in one process, sides alternating:
- `lorapilot`: `train.step.train_step` with the loss the loop takes under
  `train.shared_prefix: auto`, on the base as lorapilot's trainer holds it (`model.dtype:
  auto`: frozen linears in the compute dtype, `precision.hold_frozen`);
- `plain_peft`: what a Trainer + PEFT step computes: the same LoRA on an fp32 base under
  autocast, the model's own loss over every position (`model(**batch).loss`), backward,
  clipping, AdamW. The Trainer's own loop (data loader, callbacks) is not in it, so this
  reference is, if anything, faster than the Trainer.
Each reports the median step time, the tokens it computes (padding included; the shared
prefix once), the peak memory on a GPU, and the MFU on computed tokens: the FLOPs of the
linears (4 per frozen and 6 per LoRA weight per token) and of the head at the loss positions
(every position for `plain_peft`), attention not counted, over the device's measured bf16
matmul peak. `ratio` = plain_peft step time / lorapilot step time. `--compile`: lorapilot's
side once more with `train.compile: on` (`lorapilot_compiled`: the trial's seconds, compile
included, then the step time, and the graphs and graph breaks of its trial), to decide whether
it should become the GPU default; with `--compile-modes default,reduce-overhead` also with
`train.compile_mode: reduce-overhead` (`lorapilot_cudagraphs`: CUDA graphs; the bench's
batches repeat their shape, so no padding is needed). `--peft-forward`: lorapilot's side once more
with `train.lora_forward: peft` (`lorapilot_peft_forward`: PEFT's own LoRA forward; the
`lorapilot` side runs the fused one, `train/lora_forward.py`; `plain_peft` runs PEFT's).
`--checkpointing`: every side with
activation checkpointing (`adapter.set_checkpointing`, non-reentrant, as the loop sets it).

`--cap-gib`: for each cap, `torch.cuda.set_per_process_memory_fraction` limits this process to
that many GiB (the model is built first, then held, then capped: a 24 GiB card's user loads
the base on the CPU and moves the held base); one 8B step of `--cap-rows` x `--cap-tokens`
tokens (64 answer tokens each) with activation checkpointing runs under it, against the
memory model's estimate (`sizing.memory.estimate_step_memory`, held base, CUDA basis); with
`--compile` the same step again with the decoder compiled (`compiled`).
Needs a GPU; on a CPU the shapes run and the caps are skipped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from prefix_paths import CASES, SHAPES, batch_for, build, timed_steps  # noqa: E402

ANSWER_TOKENS = 64  # the capped step's loss positions per row
# train.compile_mode -> the entry's key for lorapilot's compiled side
COMPILED_KEYS = {"default": "lorapilot_compiled", "reduce-overhead": "lorapilot_cudagraphs"}


def linear_flops(model) -> tuple[int, int]:
    """(frozen linear weights, LoRA weights) of a PEFT model."""
    import torch

    frozen = sum(
        m.weight.numel()
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and "lora_" not in name and not m.weight.requires_grad
    )
    lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return frozen, lora


def step_flops(model, tokens: int, head_positions: int) -> float:
    """FLOPs of one step on `tokens` computed tokens (see the module docstring)."""
    frozen, lora = linear_flops(model)
    cfg = model.get_base_model().config
    head = cfg.vocab_size * cfg.hidden_size
    # the head is a frozen linear too: counted per loss position, not per token
    return float(tokens * (4 * (frozen - head) + 6 * lora) + 4 * head * head_positions)


def computed_tokens(batch, shared: bool) -> int:
    from lorapilot.train.loss import shared_prefix_len

    rows, width = batch["input_ids"].shape
    n = shared_prefix_len(batch) if shared else 0
    return int(rows * width - (rows - 1) * n)


def plain_peft_loss(model, batch):
    """The model's own loss over every position, as Trainer + PEFT computes it; the mean
    loss, scaled back to a sum so `train_step`'s normalisation gives the same update size."""
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        labels=batch["labels"],
    )  # fmt: skip
    n = (batch["labels"][:, 1:] != -100).sum()
    return out.loss * n, n


def time_side(
    model, loss_fn, batch, precision, steps, device, lora_forward="fused"
) -> tuple[list[float], int]:
    import torch

    from lorapilot.spec import TrainSpec
    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.step import make_optimizer

    optimizer = make_optimizer(model, TrainSpec())
    targets = count_target_tokens(batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = timed_steps(model, optimizer, batch, targets, precision, steps, loss_fn, lora_forward)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    del optimizer
    return times, peak


def compare_shape(
    shape,
    cases,
    steps,
    device,
    precision,
    peak_flops,
    compile_modes=(),
    checkpointing=False,
    peft_forward=False,
) -> dict:
    import functools

    import torch

    from lorapilot.base.adapter import set_checkpointing
    from lorapilot.base.precision import TORCH_DTYPE_NAMES
    from lorapilot.train.loss import prefix_path, shared_prefix_loss_sum

    held = TORCH_DTYPE_NAMES[precision] if precision != "fp32" else None
    ours, n_params = build(shape, device, held)
    plain, _ = build(shape, device, None)  # the same seed: the same weights, in fp32
    for model in (ours, plain):
        set_checkpointing(model, checkpointing)
    auto = functools.partial(shared_prefix_loss_sum, setting="auto")
    vocab = SHAPES[shape]["vocab_size"]
    out: dict = {"params": n_params, "base_dtype": held or "float32",
                 "checkpointing": checkpointing, "cases": {}}  # fmt: skip
    for case in cases:
        batch = {
            k: v.to(device) for k, v in batch_for(CASES[case], vocab, random.Random(1)).items()
        }
        path = prefix_path(ours, batch, "auto")[0]
        targets = int((batch["labels"][:, 1:] != -100).sum())
        ours_tokens = computed_tokens(batch, path == "shared")
        # (model, loss, tokens computed, head positions, train.lora_forward)
        sides = {
            "lorapilot": (ours, auto, ours_tokens, targets, "fused"),
            "plain_peft": (plain, plain_peft_loss, computed_tokens(batch, False),
                           batch["input_ids"].numel(), "peft"),
        }  # fmt: skip
        if peft_forward:  # lorapilot's step with PEFT's own LoRA forward (train.lora_forward)
            sides["lorapilot_peft_forward"] = (ours, auto, ours_tokens, targets, "peft")
        times: dict[str, list[float]] = {name: [] for name in sides}
        peaks: dict[str, int] = {}
        for _ in range(2):  # alternate, so a slow moment hits both
            for name, (model, fn, _, _, lora_forward) in sides.items():
                t, p = time_side(model, fn, batch, precision, steps, device, lora_forward)
                times[name] += t
                peaks[name] = max(peaks.get(name, 0), p)
        entry: dict = {"lorapilot_path": path}
        for name, (model, _, tokens, head_positions, _) in sides.items():
            step_s = statistics.median(times[name])
            flops = step_flops(model, tokens, head_positions)
            entry[name] = {
                "step_s": round(step_s, 4),
                "tokens_computed": tokens,
                "mfu_computed": round(flops / step_s / peak_flops, 4) if peak_flops else None,
                **({"peak_gib": round(peaks[name] / 2**30, 2)} if device.type == "cuda" else {}),
            }
        entry["ratio"] = round(entry["plain_peft"]["step_s"] / entry["lorapilot"]["step_s"], 3)
        for mode in compile_modes:
            entry[COMPILED_KEYS[mode]] = compiled_side(
                ours, auto, batch, precision, steps, device, mode
            )
        out["cases"][case] = entry
        print(f"{shape} {case} {entry}", file=sys.stderr, flush=True)
    del ours, plain
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def compiled_side(model, loss_fn, batch, precision, steps, device, mode="default") -> dict:
    """lorapilot's side again with `train.compile: on` and `train.compile_mode: mode`
    (train/compiled.py): the compile's trial, then the median step; the decoder is eager
    again afterwards. dynamo's caches are reset first: every shape, case and mode recompiles
    the same decoder code, which would otherwise reach torch's recompile limit and fall back
    to eager."""
    import torch

    from lorapilot.train import compiled

    torch._dynamo.reset()
    record = compiled.compile_decoder(model, loss_fn, batch, precision, lambda m: None, mode)
    try:
        if not record["compiled"]:
            return record
        times, peak = time_side(model, loss_fn, batch, precision, steps, device)
        return {**record, "step_s": round(statistics.median(times), 4),
                **({"peak_gib": round(peak / 2**30, 2)} if peak else {})}  # fmt: skip
    finally:
        compiled.uncompile(model)


def capped_step(
    cap_gib: float, rows: int, tokens: int, steps: int, device, precision, compile_too=False
) -> dict:
    """One 8B step with checkpointing under a memory cap, against the memory model."""
    import torch

    from lorapilot.base.adapter import set_checkpointing
    from lorapilot.base.precision import TORCH_DTYPE_NAMES
    from lorapilot.sizing.memory import ModelShape, estimate_step_memory

    held = TORCH_DTYPE_NAMES[precision]
    model, n_params = build("8b", device, held)
    set_checkpointing(model, True)
    case = dict(rows=rows, prefix=0, own=(tokens - ANSWER_TOKENS,) * 2, answer=ANSWER_TOKENS)
    batch = {k: v.to(device) for k, v in batch_for(case, 128256, random.Random(3)).items()}
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total), device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    est = estimate_step_memory(
        ModelShape.from_config(SHAPES["8b"], n_params=n_params), trainable_params=trainable,
        weight_dtype_bytes=4, held_linear_bytes=2, micro_batch=rows, seq_len=tokens,
        precision=precision, grad_checkpointing=True, loss_positions_per_example=ANSWER_TOKENS,
        attention="sdpa",
    )  # fmt: skip
    out: dict = {"cap_gib": cap_gib, "rows": rows, "tokens": tokens, "checkpointing": True,
                 "estimated_gib": round(est["total"] / 2**30, 2)}  # fmt: skip
    try:
        from lorapilot.train.loss import causal_lm_loss_sum

        times, peak = time_side(model, causal_lm_loss_sum, batch, precision, steps, device)
        out.update(
            ok=True, step_s=round(statistics.median(times), 4),
            peak_gib=round(peak / 2**30, 2),
            estimate_error=round((est["total"] - peak) / peak, 4),
        )  # fmt: skip
        if compile_too:
            out["compiled"] = compiled_side(model, causal_lm_loss_sum, batch, precision, steps,
                                            device)  # fmt: skip
    except torch.OutOfMemoryError as e:
        out.update(ok=False, error=str(e).splitlines()[0])
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        del model
        torch.cuda.empty_cache()
    print(f"8b capped {out}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="135m,1.7b,8b")
    ap.add_argument("--cases", default="ticket,long")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per side and round")
    ap.add_argument("--cap-gib", default="24,40", help="memory caps for the 8B step ('' none)")
    ap.add_argument("--cap-rows", type=int, default=8)
    ap.add_argument("--cap-tokens", type=int, default=512)
    ap.add_argument(
        "--compile", action="store_true",
        help="also time lorapilot's step with train.compile: on (compile time reported apart)",
    )  # fmt: skip
    ap.add_argument(
        "--compile-modes", default="default",
        help="with --compile: train.compile_mode values to time, comma-separated "
        "(default, reduce-overhead: CUDA graphs)",
    )  # fmt: skip
    ap.add_argument(
        "--checkpointing", action="store_true",
        help="every side with activation checkpointing (the capped 8B step always has it)",
    )  # fmt: skip
    ap.add_argument(
        "--peft-forward", action="store_true",
        help="also time lorapilot's step with train.lora_forward: peft (PEFT's own LoRA "
        "forward; the lorapilot side runs the fused one)",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    from train_throughput import measure_peak

    from lorapilot.base.precision import TORCH_DTYPE_NAMES, resolve

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve("auto", device.type)
    peak = max(measure_peak(device, TORCH_DTYPE_NAMES[precision]).values())
    result: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": precision,
        "matmul_peak_tflops": round(peak / 1e12, 2),
        "shapes": {},
        "capped": [],
    }
    modes = [m for m in args.compile_modes.split(",") if m] if args.compile else []
    if unknown := set(modes) - set(COMPILED_KEYS):
        ap.error(
            f"--compile-modes: unknown mode(s) {sorted(unknown)}; known: {list(COMPILED_KEYS)}"
        )
    for shape in filter(None, args.shapes.split(",")):
        result["shapes"][shape] = compare_shape(
            shape,
            args.cases.split(","),
            args.steps,
            device,
            precision,
            peak,
            modes,
            args.checkpointing,
            args.peft_forward,
        )
    caps = [float(c) for c in args.cap_gib.split(",") if c]
    if caps and device.type != "cuda":
        result["capped_skipped"] = "no GPU: set_per_process_memory_fraction needs CUDA"
    elif caps:
        for cap in caps:
            try:
                row = capped_step(cap, args.cap_rows, args.cap_tokens, 2, device, precision,
                                  args.compile)  # fmt: skip
            except Exception as e:  # a failure of one cap must not lose the figures above
                row = {"cap_gib": cap, "ok": False, "error": f"{type(e).__name__}: {e}"}
            result["capped"].append(row)
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
