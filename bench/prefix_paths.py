"""The shared-prefix paths against the plain ones at real model sizes, without model files.

    .venv/bin/python bench/prefix_paths.py [--shapes 135m,1.7b,8b] [--cases ticket,long]
        [--steps 8] [--repeat 2] [--eval-prompts 64] [--checkpointing] [--rows N] [--json]

Why: `train.shared_prefix: auto` and evaluation's prefix cache compute the prompt prefix the
rows share once. On CPUs that is 1.2-5x faster; on a GPU with the 135M default model both
were slower (launch-bound, bench/README.md "On a GPU"). Users adapt 1-8B models on GPUs, so
the question is where the crossover lies. Timing does not depend on the weights' values, so
each shape is a randomly initialised Llama-architecture model built from its config on the
device (SmolLM2-135M, SmolLM2-1.7B and Llama-3.1-8B dimensions), with lorapilot's LoRA (r 16,
all-linear, `adapter.build_adapter`) and, by default, its frozen linears held in the compute
dtype as lorapilot's trainer holds them (`--base-dtype float32`: the fp32 base).

Cases (synthetic token ids, shapes measured on the real pilots): `ticket` is
examples/ticket-triage (8 rows, 38 shared prefix tokens, 45-80 tokens of their own, a 3-token
answer); `long` is bench/many_labels.py's 77-label prompt (8 rows, 450 shared, 30-60 own).

Per shape and case: the median time of `train.step.train_step` (bf16 autocast where the device
has it, else fp32; gradient clipping, AdamW) with `causal_lm_loss_sum` (unshared) and
`shared_prefix_loss_sum` (shared), sides alternating for `--repeat` rounds of `--steps`
timed steps after one warm-up each, with the peak memory of each side on a GPU; then label
scoring (`evaluate.predict.score_labels`, every label, batch 32, the model cast to the eval
dtype as `evaluate.runner.cast_for_eval` does) of `--eval-prompts` prompts with and without
the prefix cache. `ratio` = unshared time / shared time (above 1: sharing is faster);
`auto_s` times `train.shared_prefix: auto` (the loss as the loop takes it) and `auto_path`
says which path it took on that batch. `--eval-prompts 0` times training only.
`--checkpointing` also times training with activation checkpointing on (`adapter.set_checkpointing`,
as the loop sets it), under `train_checkpointing`. `--rows N` sets the rows of every case's
micro-batch (default 8, the pilots' `micro_batch`).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                 tie_word_embeddings=True),
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                 tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                 num_attention_heads=32, num_key_value_heads=32, vocab_size=49152,
                 tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               tie_word_embeddings=False),
}  # fmt: skip
CASES = {
    "ticket": dict(rows=8, prefix=38, own=(45, 80), answer=3),
    "long": dict(rows=8, prefix=450, own=(30, 60), answer=3),
}
N_LABELS, LABEL_TOKENS = 6, (1, 3)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def build(shape: str, device, held: str | None = None):
    """A random Llama of `shape` on `device` (fp32), with lorapilot's LoRA attached; `held`
    ("bfloat16"): its frozen linears then held in that dtype, as lorapilot's trainer does
    under `model.dtype: auto` (`precision.hold_frozen`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lorapilot.base.adapter import build_adapter
    from lorapilot.spec import AdapterSpec

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048)
    config._attn_implementation = "sdpa"
    with device:
        model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    model, _ = build_adapter(model, AdapterSpec(r=16, alpha=32, dropout=0.0), seed=0)
    if held:
        from lorapilot.base.precision import hold_frozen

        hold_frozen(model, held)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return model.train(), n_params


def batch_for(case: dict, vocab: int, rng: random.Random):
    """Right-padded rows [prefix | own tokens | answer], loss on the answer (as `collate`)."""
    import torch

    from lorapilot.data.format import IGNORE_INDEX

    prefix = [rng.randrange(3, vocab) for _ in range(case["prefix"])]
    rows = []
    for _ in range(case["rows"]):
        own = [rng.randrange(3, vocab) for _ in range(rng.randint(*case["own"]))]
        answer = [rng.randrange(3, vocab) for _ in range(case["answer"])]
        rows.append((prefix + own + answer, len(prefix) + len(own)))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (row, prompt_len) in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        labels[r, prompt_len : len(row)] = torch.tensor(row[prompt_len:])
        mask[r, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def timed_steps(
    model, optimizer, batch, targets, precision, steps, loss_fn, lora_forward="fused"
) -> list[float]:
    """Seconds of `steps` calls of `train.step.train_step` after one warm-up, synchronised
    (`lora_forward`: `train.lora_forward`; "peft" for a plain PEFT reference)."""
    from lorapilot.train.step import train_step

    device = batch["input_ids"].device
    times = []
    for i in range(steps + 1):  # the first is a warm-up
        _sync(device)
        t0 = time.perf_counter()
        train_step(model, optimizer, None, [batch], targets, precision, 1.0, loss_fn=loss_fn,
                   lora_forward=lora_forward)  # fmt: skip
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    return times


def time_training(model, batch, precision: str, steps: int, repeat: int, device) -> dict:
    import torch

    from lorapilot.spec import TrainSpec
    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.loss import causal_lm_loss_sum, prefix_path, shared_prefix_loss_sum
    from lorapilot.train.step import make_optimizer

    batch = {k: v.to(device) for k, v in batch.items()}
    targets = count_target_tokens(batch)
    optimizer = make_optimizer(model, TrainSpec())
    sides = {
        "unshared": causal_lm_loss_sum,
        "shared": shared_prefix_loss_sum,
        "auto": functools.partial(shared_prefix_loss_sum, setting="auto"),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    peak: dict[str, int] = {}
    for _ in range(repeat):
        for name, fn in sides.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times[name] += timed_steps(model, optimizer, batch, targets, precision, steps, fn)
            if device.type == "cuda":
                peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())
    out = {f"{name}_s": round(statistics.median(t), 4) for name, t in times.items()}
    out["ratio"] = round(out["unshared_s"] / out["shared_s"], 3)
    out["auto_path"] = prefix_path(model, batch, "auto")[0]  # what `auto` took, timed as auto_s
    if peak:
        out["peak_gib"] = {name: round(b / 2**30, 2) for name, b in peak.items()}
    return out


def time_scoring(model, case: dict, vocab: int, n_prompts: int, precision: str, rng) -> dict:
    from lorapilot.evaluate.predict import score_labels

    prefix = [rng.randrange(3, vocab) for _ in range(case["prefix"])]
    prompts = [
        prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(*case["own"]))]
        for _ in range(n_prompts)
    ]
    labels = [
        [rng.randrange(3, vocab) for _ in range(rng.randint(*LABEL_TOKENS) + 1)]
        for _ in range(N_LABELS)
    ]  # + 1: the end-of-turn token every label ends with
    out, scores = {}, {}
    for name, share in (("unshared", False), ("shared", True), ("unshared", False)):
        t0 = time.perf_counter()  # score_labels returns numpy arrays: synchronised
        scores[name] = score_labels(
            model, prompts, labels, batch_size=32, precision=precision, share_prefix=share
        )
        out[f"{name}_examples_per_s"] = round(n_prompts / (time.perf_counter() - t0), 2)
    out["ratio"] = round(out["shared_examples_per_s"] / out["unshared_examples_per_s"], 3)
    out["same_predictions"] = bool(
        (scores["shared"].argmax(1) == scores["unshared"].argmax(1)).all()
    )
    return out  # the second unshared pass is the one kept: the first warms up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="135m,1.7b,8b")
    ap.add_argument("--cases", default="ticket,long")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-batch (default 8)")
    ap.add_argument(
        "--base-dtype", choices=("auto", "float32"), default="auto",
        help="auto: the frozen linears held in the compute dtype, as lorapilot trains "
        "(model.dtype auto); float32: the fp32 base under autocast",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from lorapilot.base.adapter import set_checkpointing
    from lorapilot.base.precision import TORCH_DTYPE_NAMES, resolve
    from lorapilot.evaluate.runner import cast_for_eval

    if args.rows:
        for case in CASES.values():
            case["rows"] = args.rows
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve("auto", device.type)
    result: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": precision,
        "threads": torch.get_num_threads(),
        "rows": CASES["ticket"]["rows"],
        "shapes": {},
    }
    auto = args.base_dtype == "auto" and precision != "fp32"
    held = TORCH_DTYPE_NAMES[precision] if auto else None
    result["base_dtype"] = held or "float32"
    for shape in args.shapes.split(","):
        t0 = time.perf_counter()
        model, n_params = build(shape, device, held)
        vocab = SHAPES[shape]["vocab_size"]
        entry: dict = {"params": n_params, "train": {}, "score": {}}
        for case in args.cases.split(","):
            batch = batch_for(CASES[case], vocab, random.Random(1))
            entry["train"][case] = time_training(
                model, batch, precision, args.steps, args.repeat, device
            )
            print(f"{shape} {case} train {entry['train'][case]}", file=sys.stderr, flush=True)
        if args.checkpointing:
            set_checkpointing(model, True)
            entry["train_checkpointing"] = {}
            for case in args.cases.split(","):
                batch = batch_for(CASES[case], vocab, random.Random(1))
                entry["train_checkpointing"][case] = res = time_training(
                    model, batch, precision, args.steps, args.repeat, device
                )
                print(f"{shape} {case} train, checkpointing {res}", file=sys.stderr, flush=True)
            set_checkpointing(model, False)
        model = cast_for_eval(model, precision).eval()
        for case in args.cases.split(",") if args.eval_prompts > 0 else ():  # 0: training only
            entry["score"][case] = time_scoring(
                model, CASES[case], vocab, args.eval_prompts, precision, random.Random(2)
            )
            print(f"{shape} {case} score {entry['score'][case]}", file=sys.stderr, flush=True)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        result["shapes"][shape] = entry
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
