"""Training throughput: lorapilot's loop vs transformers' `Trainer` + PEFT, side by side.

    .venv/bin/python bench/train_throughput.py [--quick] [--json] [--steps N] [--repeat R]
        [--threads N] [--also-sdpa] [--pilot DIR] [--set KEY=VALUE ...] [--long-prompt]

One process, one machine, one base model (the pilot's, by default SmolLM2-135M-Instruct as
`lorapilot.base.models.load_base` loads it), one data set (the pilot's train split from
`prepare_data`, encoded by the pilot's formatter: chat template, completion-only labels),
one LoRA config (the pilot's `adapter`, attached by `lorapilot.base.adapter.build_adapter` with
the same seed, so both sides start from identical weights), the same global batch, number
of optimizer steps, learning rate, warm-up + schedule, AdamW, gradient clipping and
precision (fp32 master weights, bf16 autocast).

(a) lorapilot: the real `lorapilot.train.loop.train` (length-grouped micro-batches, `collate`,
    `train_step` with `causal_lm_loss_sum`, `make_optimizer`, `make_scheduler`), writing
    its run folder to a temporary directory, without validation examples or progress bar.
    `--also-sdpa` adds a third side, the same loop without its CPU switch to eager
    attention (`lorapilot.train.step.short_sequence_attention`): the before/after of that change.
(b) reference: `transformers.Trainer` on a second copy of the base with the same adapter,
    `DataCollatorForSeq2Seq` (pad to the longest example of each batch, labels padded with
    -100; tokenizer padding on the right, as training recipes set it), the Trainer's
    default random sampler and data loader, its default optimizer (`adamw_torch_fused` on
    torch >= 2.8), `bf16=True` (+ `use_cpu=True` on a CPU), `report_to="none"`,
    `save_strategy="no"`, `eval_strategy="no"`, default logging; only the tqdm bar is
    turned off (as lorapilot's is).

`--long-prompt` runs the same comparison a second time on the generated 77-intent pilot of
bench/many_labels.py (the label list in the system prompt: ~450 of ~495 tokens shared by
every example), where lorapilot's shared-prefix step runs the prefix once per micro-batch;
its figures go under `long_prompt` ({ratio, lorapilot, reference, ...}), and both sides
report `tokens_computed_per_example` (padded tokens run, less the prefix tokens not
recomputed).

Timing: wall-clock between consecutive optimizer-step ends (a `TrainerCallback.on_step_end`
for the Trainer, lorapilot's per-step `cost_check` hook, which runs after the step's record
is written), so each interval holds everything a step costs: data, collation, forward,
backward, clipping, optimizer, scheduler, per-step bookkeeping. The first `--warmup` steps
of every run are excluded. Runs alternate a, b, a, b... (`--repeat`), each from the same
initial adapter weights, so machine noise shows as the spread between repeats. Model
loading, data preparation and the FLOP peak measurement are not timed. The process CPU time
of the same intervals is recorded too (`ratio_cpu_time`): a process that other jobs keep
off the cores accrues none, so on a shared machine it is the steadier cross-check.

Reported per side: examples/s, target tokens/s (tokens carrying the loss), real tokens/s,
padding efficiency (real tokens / tokens processed, i.e. batch rows x padded width), mean
training loss over the steps (a sanity check, not a comparison of batches: the two
samplers order the data differently), and MFU. `ratio` is the median over repeats of
lorapilot's examples/s over the reference's in the same repeat.

MFU = achieved model FLOP/s / peak FLOP/s. The peak is measured in the same run: the best
`torch.matmul` FLOP/s on square matrices of the training precision's dtype (bf16), sizes
1024-4096 (and 8192 on a GPU), with the thread count training uses, measured before the
runs and after every repeat; the best of all is used, so a measurement caught by other jobs
on a shared machine does not inflate the MFU. Model FLOPs are counted per *example* from
its real length S (padding is never useful work) and its number of target tokens T, and
are the same for both sides:

    mfu (LoRA-aware, what the step needs):
        S * (4 * N_frozen + 6 * N_lora)     frozen linear weights: forward (2 per weight)
                                            plus input gradient (2); no weight gradient.
                                            LoRA matrices: forward, input and weight grads.
      + 12 * n_layers * d_model * S^2       attention scores and values, forward and
                                            backward (PaLM's 12*L*H*Q*T per token; causal
                                            masking not discounted)
      + 4 * V * d_model * T                 LM head at the target positions only: forward
                                            and input gradient (the head is frozen)
    mfu_6n (the conventional figure, Kaplan et al.):
        6 * N_nonembed * S                  N_nonembed = parameters of the base outside the
                                            embedding / LM head; as for full fine-tuning

Embedding lookups, norms, activations, softmax, the optimizer and the input gradient not
needed at layer 0 are not counted. N_frozen = weights of the base's linear layers inside
the decoder; N_lora = trainable parameters. Because the FLOPs are per example, the MFU
ratio of the two sides equals their examples/s ratio (up to which examples they drew).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

GOALS = {"ratio": 2.5, "long_prompt_ratio": 4.0, "mfu": 0.20, "padding_efficiency": 0.9}


# --------------------------------------------------------------------------- machine


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak(device, dtype_name: str = "bfloat16", reps: int = 3) -> dict[str, float]:
    """Best FLOP/s of `torch.matmul` on square matrices of each size (2*n^3 FLOPs each)."""
    import torch

    dtype = getattr(torch, dtype_name)
    sizes = (1024, 2048, 3072, 4096) + ((8192,) if device.type == "cuda" else ())
    by_size = {}
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        c = torch.matmul(a, b)  # warm-up (and the output buffer)
        best = float("inf")
        for _ in range(reps):
            _sync(device)
            t0 = time.perf_counter()
            torch.matmul(a, b, out=c)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        by_size[str(n)] = 2 * n**3 / best
        del a, b, c
    return by_size


def machine_info(device) -> dict:
    import accelerate
    import peft
    import torch
    import transformers

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "load_avg_1m_at_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "accelerate": accelerate.__version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# --------------------------------------------------------------------------- FLOPs


class FlopCounter:
    """Model FLOPs per example (see the module docstring for the formulas)."""

    def __init__(self, model):
        import torch

        from lorapilot.train.loss import _decoder_and_head

        decoder, head = _decoder_and_head(model)
        if decoder is None:
            raise SystemExit("the bench needs a causal LM with a separable decoder and LM head")
        cfg = model.get_base_model().config if hasattr(model, "get_base_model") else model.config
        self.layers, self.d = cfg.num_hidden_layers, cfg.hidden_size
        self.vocab = head.weight.shape[0]
        self.n_lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.n_frozen = sum(
            m.weight.numel()
            for name, m in decoder.named_modules()
            if isinstance(m, torch.nn.Linear) and "lora_" not in name and not m.weight.requires_grad
        )
        embed = {id(decoder.get_input_embeddings().weight), id(head.weight)}
        self.n_nonembed = sum(
            p.numel()
            for n, p in decoder.named_parameters()
            if not p.requires_grad and id(p) not in embed and "lora_" not in n
        )

    def lora_aware(self, length: int, targets: int) -> float:
        linear = length * (4 * self.n_frozen + 6 * self.n_lora)
        attention = 12 * self.layers * self.d * length * length
        head = 4 * self.vocab * self.d * targets
        return float(linear + attention + head)

    def six_n(self, length: int) -> float:
        return float(6 * self.n_nonembed * length)

    def describe(self) -> dict:
        return {
            "n_frozen_linear": self.n_frozen,
            "n_lora": self.n_lora,
            "n_nonembed": self.n_nonembed,
            "n_layers": self.layers,
            "d_model": self.d,
            "vocab": self.vocab,
            "mfu": "per example: S*(4*N_frozen + 6*N_lora) + 12*L*d*S^2 + 4*V*d*T "
            "(S real tokens, T target tokens)",
            "mfu_6n": "per example: 6*N_nonembed*S",
        }


# --------------------------------------------------------------------------- summaries


def summarise(
    steps: list[dict], seconds: float, cpu_s: float, flops: FlopCounter, saved_per_example=0.0
) -> dict:
    """Throughput over the timed steps. Each step: {examples: [(S, T), ...], padded, loss}.
    `tokens_computed_per_example`: the padded tokens the model ran, less the shared prefix
    tokens it did not recompute (lorapilot's shared-prefix step; 0 for the reference)."""
    ex = [e for s in steps for e in s["examples"]]
    real = sum(length for length, _ in ex)
    targets = sum(t for _, t in ex)
    padded = sum(s["padded"] for s in steps)
    model_flops = sum(flops.lora_aware(length, t) for length, t in ex)
    flops_6n = sum(flops.six_n(length) for length, _ in ex)
    return {
        "steps": len(steps),
        "seconds": round(seconds, 3),
        "step_s": round(seconds / len(steps), 4),
        "cpu_s_per_step": round(cpu_s / len(steps), 4),
        "cpu_s_per_example": round(cpu_s / len(ex), 4),
        "examples_per_s": round(len(ex) / seconds, 3),
        "target_tokens_per_s": round(targets / seconds, 2),
        "tokens_per_s": round(real / seconds, 1),
        "padding_efficiency": round(real / padded, 4),
        "tokens_computed_per_example": round(padded / len(ex) - saved_per_example, 1),
        "model_flops_per_s": round(model_flops / seconds),
        # the same FLOPs scaled to the tokens the model actually ran (padding in, the prefix
        # tokens not recomputed out): approximate, as if every token cost the same, which
        # holds for the linear layers and undercounts the rows' attention over the prefix
        "computed_flops_per_s": round(
            model_flops / seconds * (padded - saved_per_example * len(ex)) / max(real, 1)
        ),
        "flops_6n_per_s": round(flops_6n / seconds),
    }


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


# --------------------------------------------------------------------------- the two sides


def reset_accelerate() -> None:
    """Both sides create an `Accelerator` (lorapilot with mixed_precision="no", the Trainer
    with "bf16"); accelerate's state is process-global, so it is reset between runs."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()


def restore(model, initial: dict) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in initial:
                p.copy_(initial[name])


def run_lorapilot(model, initial, examples, cfg, pad_id, warmup_steps, tmp: Path) -> dict:
    """The real `lorapilot.train.loop.train`, step ends recorded by its `cost_check` hook."""
    from lorapilot.fsutil import read_jsonl
    from lorapilot.train.batches import MicroBatchStream, example_target_tokens
    from lorapilot.train.loop import train

    restore(model, initial)
    reset_accelerate()
    device = next(model.parameters()).device
    ends: list[float] = []

    cpu: list[float] = []

    def on_step(_status: dict) -> None:
        _sync(device)
        ends.append(time.perf_counter())
        cpu.append(time.process_time())

    out = tmp / f"lorapilot-{len(list(tmp.iterdir()))}"
    result = train(
        model,
        examples,
        [],
        cfg,
        out,
        pad_id=pad_id,
        cost_check=on_step,
        progress=False,
        log=lambda _m: None,
    )
    records = read_jsonl(out / "steps.jsonl")
    # The same (seed, epoch) gives the same batches: replay the stream to see the examples.
    stream = MicroBatchStream([e.n_tokens for e in examples], cfg.micro_batch, cfg.seed)
    steps = []
    for rec in records:
        idx = [i for _ in range(cfg.grad_accum) for i in stream.next()]
        pairs = [(examples[i].n_tokens, example_target_tokens(examples[i])) for i in idx]
        assert sum(s for s, _ in pairs) == rec["tokens"]
        steps.append(
            {
                "examples": pairs,
                "padded": round(rec["tokens"] / rec["padding_efficiency"]),
                "loss": rec["loss"],
            }
        )
    # Prefix tokens the shared-prefix step did not recompute, spread over every step's examples
    saved = (result.prefix or {}).get("tokens_saved", 0)
    n_ex = sum(len(st["examples"]) for st in steps)
    return {"ends": ends, "cpu": cpu, "steps": steps, "saved_per_example": saved / max(n_ex, 1)}


class _CountingCollator:
    """The reference's collator, recording what each batch holds (rows, real and padded
    tokens, targets); the counting reads tensors the collator has just built."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        mask, labels = batch["attention_mask"], batch["labels"]
        per_row = [
            (int(mask[r].sum()), int((labels[r, 1:] != -100).sum())) for r in range(mask.shape[0])
        ]
        self.batches.append({"examples": per_row, "padded": mask.numel()})
        return batch


def reference_args(cfg, steps: int, warmup: int, out: Path, device):
    from transformers import TrainingArguments

    schedule = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[
        cfg.schedule
    ]
    return TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=cfg.grad_accum,
        max_steps=steps,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type=schedule,
        warmup_steps=warmup,
        max_grad_norm=cfg.max_grad_norm or 0.0,
        bf16=cfg.precision == "bf16",
        fp16=cfg.precision == "fp16",
        use_cpu=device.type == "cpu",
        seed=cfg.seed,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
    )


def run_reference(model, initial, features, tok, cfg, steps: int, warmup: int, tmp: Path) -> dict:
    """`transformers.Trainer` with the documented defaults, step ends from a callback."""
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback

    restore(model, initial)
    reset_accelerate()
    device = next(model.parameters()).device
    ends: list[float] = []
    cpu: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            _sync(device)
            ends.append(time.perf_counter())
            cpu.append(time.process_time())

    tok.padding_side = "right"  # training recipes pad on the right; load_model sets "left"
    collator = _CountingCollator(DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100))
    out = tmp / f"reference-{len(list(tmp.iterdir()))}"
    trainer = Trainer(
        model=model,
        args=reference_args(cfg, steps, warmup, out, device),
        train_dataset=features,
        data_collator=collator,
        callbacks=[StepTimer()],
    )
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its final metrics
        result = trainer.train()
    precision = trainer.accelerator.mixed_precision
    opt = trainer.optimizer
    optim = f"{type(getattr(opt, 'optimizer', opt)).__name__} (fused={opt.defaults.get('fused')})"
    ga = cfg.grad_accum
    batches = collator.batches[: steps * ga]
    per_step = [
        {
            "examples": [e for b in batches[i * ga : (i + 1) * ga] for e in b["examples"]],
            "padded": sum(b["padded"] for b in batches[i * ga : (i + 1) * ga]),
        }
        for i in range(steps)
    ]
    return {
        "ends": ends,
        "cpu": cpu,
        "steps": per_step,
        "mean_loss": result.training_loss,
        "mixed_precision": precision,
        "optimizer": optim,
    }


def timed(run: dict, warmup: int) -> tuple[list[dict], float, float]:
    """(timed steps, wall seconds, process CPU seconds) after the first `warmup` steps."""
    ends, cpu = run["ends"], run["cpu"]
    if len(ends) <= warmup:
        raise SystemExit(f"only {len(ends)} steps recorded; need more than --warmup {warmup}")
    return run["steps"][warmup : len(ends)], ends[-1] - ends[warmup - 1], cpu[-1] - cpu[warmup - 1]


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--pilot", default=str(ROOT / "examples" / "ticket-triage"), help="pilot folder"
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per run (default 32; 8 with --quick)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="first steps of each run not timed (default 3; 2 with --quick)",
    )
    ap.add_argument(
        "--repeat", type=int, default=None, help="a,b pairs (default 2; 1 with --quick)"
    )
    ap.add_argument(
        "--quick", action="store_true", help="a short run (a couple of minutes on 2 CPU cores)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="spec override for both sides, e.g. train.micro_batch=16 (repeatable)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for training and the peak (default: torch's own choice)",
    )
    ap.add_argument(
        "--also-sdpa",
        action="store_true",
        help="also time lorapilot without its CPU eager-attention switch (before/after)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument(
        "--long-prompt",
        action="store_true",
        help="also the 77-intent pilot of bench/many_labels.py (label list in the system "
        "prompt), reported under long_prompt",
    )
    args = ap.parse_args()
    steps = args.steps or (8 if args.quick else 32)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    repeat = args.repeat or (1 if args.quick else 2)
    if warmup < 1 or steps <= warmup + 1:
        raise SystemExit("need --warmup >= 1 and --steps > --warmup + 1")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    result, names = compare(args, args.pilot, steps, warmup, repeat)
    if args.long_prompt:
        from many_labels import write_pilot

        with tempfile.TemporaryDirectory(prefix="lorapilot-long-prompt-") as d:
            long, _ = compare(args, write_pilot(Path(d), per_label=8), steps, warmup, repeat)
        keys = ("pilot", "n_train_examples", "ratio", "ratio_per_repeat", "ratio_cpu_time")
        result["long_prompt"] = {
            **{k: long[k] for k in keys},
            "lorapilot": long["lorapilot"],
            "reference": long["reference"],
            "mfu": long["mfu"],
        }
        result["goals"]["long_prompt_ratio"] = {
            "goal": GOALS["long_prompt_ratio"],
            "value": long["ratio"],
            "met": long["ratio"] >= GOALS["long_prompt_ratio"],
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print_table(result, names)
    if args.long_prompt:
        lp = result["long_prompt"]
        print(
            f"long prompt ({lp['pilot']}): ratio {lp['ratio']} per repeat "
            f"{lp['ratio_per_repeat']}; tokens computed per example: lorapilot "
            f"{lp['lorapilot']['tokens_computed_per_example']}, reference "
            f"{lp['reference']['tokens_computed_per_example']}"
        )


def compare(args, pilot_dir, steps: int, warmup: int, repeat: int) -> tuple[dict, list[str]]:
    """Both sides on one pilot: the result object and the sides' names."""
    import torch

    from lorapilot.base.adapter import build_adapter
    from lorapilot.base.models import load_base, pad_id_of
    from lorapilot.base.precision import hold_for_training, resolve
    from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
    from lorapilot.spec import load_pilot

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    pilot = load_pilot(pilot_dir, args.set)
    spec = pilot.spec
    cfg = spec.train.model_copy(
        update={
            "max_steps": steps,
            "eval_every": None,
            "save_every": None,
            "precision": resolve(spec.train.precision),  # `auto` as this machine runs it
        }
    )
    warmup_sched = round(cfg.warmup_ratio * steps)  # as lorapilot.train.loop.train computes it

    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    log("loading the base twice and preparing the data (not timed)")
    # lorapilot's side as its trainer holds the base (model.dtype auto: frozen linears in the
    # compute dtype); the reference as a plain recipe does: fp32 weights under autocast
    _, model_a, tok = load_base(pilot, use="train")
    _, model_b, _ = load_base(pilot, use="exact")
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    examples = encode_records(fmt, spec.task, prepared.splits["train"], prepared.answer_budget)
    pad_id = pad_id_of(tok)
    features = [
        {"input_ids": e.input_ids, "attention_mask": [1] * e.n_tokens, "labels": e.labels}
        for e in examples
    ]
    model_a, info = build_adapter(model_a, spec.adapter, seed=cfg.seed)
    held = hold_for_training(model_a, spec)
    model_b, _ = build_adapter(model_b, spec.adapter, seed=cfg.seed)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    model_a.to(device)
    model_b.to(device)
    initial_a = {n: p.detach().clone() for n, p in model_a.named_parameters() if p.requires_grad}
    initial_b = {n: p.detach().clone() for n, p in model_b.named_parameters() if p.requires_grad}
    assert initial_a.keys() == initial_b.keys()
    assert all(torch.equal(initial_a[n], initial_b[n]) for n in initial_a), (
        "adapters differ at init"
    )
    flops = FlopCounter(model_a)

    # The peak is measured before the runs and again after each repeat, and the best figure
    # is used for every MFU: on a shared machine one measurement can be caught by other jobs.
    peak_dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[cfg.precision]
    log(f"measuring the {peak_dtype} matmul peak with {torch.get_num_threads()} threads")
    peaks = [measure_peak(device, peak_dtype)]

    import lorapilot.train.step as lp_train

    names = ["lorapilot", "reference"] + (["lorapilot_sdpa"] if args.also_sdpa else [])
    runs: dict[str, list[dict]] = {n: [] for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    ref_meta: dict = {}
    eager_width = lp_train.EAGER_ATTENTION_MAX_WIDTH
    with tempfile.TemporaryDirectory(prefix="lorapilot-bench-") as tmp_s:
        tmp = Path(tmp_s)
        for r in range(repeat):
            for name in names:
                log(f"repeat {r + 1}/{repeat}: {name}, {steps} steps")
                if name == "reference":
                    run = run_reference(
                        model_b, initial_b, features, tok, cfg, steps, warmup_sched, tmp
                    )
                    losses[name].append(run["mean_loss"])
                    ref_meta = {
                        "mixed_precision": run["mixed_precision"],
                        "optimizer": run["optimizer"],
                    }
                else:
                    # lorapilot_sdpa: the loop without its CPU eager-attention switch (before/after)
                    lp_train.EAGER_ATTENTION_MAX_WIDTH = (
                        0 if name == "lorapilot_sdpa" else eager_width
                    )
                    run = run_lorapilot(model_a, initial_a, examples, cfg, pad_id, warmup, tmp)
                    lp_train.EAGER_ATTENTION_MAX_WIDTH = eager_width
                    losses[name].append(statistics.fmean(s["loss"] for s in run["steps"]))
                runs[name].append(
                    summarise(*timed(run, warmup), flops, run.get("saved_per_example", 0.0))
                )
                log(f"  {runs[name][-1]['examples_per_s']} examples/s")
            peaks.append(measure_peak(device, peak_dtype))
    peak_flops = max(f for p in peaks for f in p.values())
    for per_repeat in runs.values():
        for r in per_repeat:
            r["mfu"] = round(r["model_flops_per_s"] / peak_flops, 4)
            r["mfu_6n"] = round(r.pop("flops_6n_per_s") / peak_flops, 4)
            # MFU counts every token's FLOPs; where the shared prefix is computed once it can
            # pass 100%: effective throughput. mfu_computed is the utilisation of the tokens run.
            r["mfu_computed"] = round(r.pop("computed_flops_per_s") / peak_flops, 4)

    def side(name: str) -> dict:
        keys = (
            "examples_per_s",
            "target_tokens_per_s",
            "tokens_per_s",
            "step_s",
            "cpu_s_per_step",
            "cpu_s_per_example",
            "padding_efficiency",
            "model_flops_per_s",
            "mfu",
            "mfu_6n",
            "mfu_computed",
        )
        return {
            **{k: median_of(runs[name], k) for k in keys},
            "mean_train_loss": round(statistics.median(losses[name]), 4),
            "per_repeat": runs[name],
        }

    pairs = list(zip(runs["lorapilot"], runs["reference"], strict=True))
    pair_ratios = [a["examples_per_s"] / b["examples_per_s"] for a, b in pairs]
    # Process CPU time per example: less sensitive than wall time to other jobs on a shared
    # machine (a descheduled process accrues none), a cross-check of the wall-clock ratio.
    cpu_ratios = [b["cpu_s_per_example"] / a["cpu_s_per_example"] for a, b in pairs]
    lp, ref = side("lorapilot"), side("reference")
    ref.update(ref_meta)
    ref["collator"] = "DataCollatorForSeq2Seq(padding=True, label_pad_token_id=-100), right padding"
    lp["loop"] = (
        "lorapilot.train.loop.train: length-grouped micro-batches, LM head at target positions, "
        f"eager attention on CPU up to {eager_width} tokens wide"
    )
    result = {
        "benchmark": "train_throughput",
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["bench/train_throughput.py", *sys.argv[1:]]),
        "machine": {**machine_info(device), "load_avg_1m_at_start": load_start},
        "pilot": spec.name,
        "model": spec.model.base,
        "n_train_examples": len(examples),
        "adapter": {
            "method": spec.adapter.method,
            "r": spec.adapter.r,
            "alpha": spec.adapter.alpha,
            "dropout": spec.adapter.dropout,
            "trainable_params": info["trainable_params"],
        },
        "steps": steps,
        "warmup_steps_excluded": warmup,
        "repeat": repeat,
        "micro_batch": cfg.micro_batch,
        "grad_accum": cfg.grad_accum,
        "global_batch": cfg.micro_batch * cfg.grad_accum,
        "precision": f"{cfg.precision} autocast, fp32 master weights (lorapilot's base held "
        f"in {held['base_dtype']}, the reference's in float32)",
        "lr": cfg.lr,
        "schedule": f"{cfg.schedule}, {warmup_sched} warm-up steps",
        "ratio": round(statistics.median(pair_ratios), 3),
        "ratio_per_repeat": [round(x, 3) for x in pair_ratios],
        "ratio_cpu_time": round(statistics.median(cpu_ratios), 3),
        "lorapilot": lp,
        "reference": ref,
        **(
            {
                "lorapilot_sdpa": side("lorapilot_sdpa"),
                "ratio_sdpa": round(
                    statistics.median(
                        a["examples_per_s"] / b["examples_per_s"]
                        for a, b in zip(runs["lorapilot_sdpa"], runs["reference"], strict=True)
                    ),
                    3,
                ),
            }
            if args.also_sdpa
            else {}
        ),
        "padding_efficiency": {
            "lorapilot": lp["padding_efficiency"],
            "reference": ref["padding_efficiency"],
        },
        "mfu": {"lorapilot": lp["mfu"], "reference": ref["mfu"]},
        "mfu_6n": {"lorapilot": lp["mfu_6n"], "reference": ref["mfu_6n"]},
        "peak_flops": round(peak_flops),
        "peak_flops_measurements": [{k: round(v) for k, v in p.items()} for p in peaks],
        "flops": flops.describe(),
    }
    result["goals"] = {
        "ratio": {
            "goal": GOALS["ratio"],
            "value": result["ratio"],
            "met": result["ratio"] >= GOALS["ratio"],
        },
        "mfu": {"goal": GOALS["mfu"], "value": lp["mfu"], "met": lp["mfu"] >= GOALS["mfu"]},
        "padding_efficiency": {
            "goal": GOALS["padding_efficiency"],
            "value": lp["padding_efficiency"],
            "met": lp["padding_efficiency"] >= GOALS["padding_efficiency"],
        },
    }
    return result, names


def print_table(result: dict, names: list[str]) -> None:
    print(
        f"{result['pilot']}, {result['model']}, {result['steps']} steps x "
        f"{result['global_batch']} examples, {result['precision']}, {result['repeat']} "
        f"repeat(s), first {result['warmup_steps_excluded']} steps not timed"
    )
    print(
        f"peak {result['peak_flops'] / 1e9:.0f} GFLOP/s "
        f"({result['machine']['torch_threads']} threads)"
    )
    print(
        f"{'':15}{'examples/s':>12}{'target tok/s':>14}{'padding eff':>13}"
        f"{'MFU':>8}{'MFU 6N':>8}{'loss':>8}"
    )
    for name in names:
        s = result[name]
        print(
            f"{name:15}{s['examples_per_s']:>12.2f}{s['target_tokens_per_s']:>14.1f}"
            f"{s['padding_efficiency']:>13.3f}{s['mfu']:>8.1%}{s['mfu_6n']:>8.1%}{s['mean_train_loss']:>8.3f}"
        )
    print(
        f"ratio (lorapilot / reference examples/s): {result['ratio']} per repeat "
        f"{result['ratio_per_repeat']}; "
        f"by process CPU time per example: {result['ratio_cpu_time']}"
    )
    if "ratio_sdpa" in result:
        print(f"ratio without the CPU eager-attention switch: {result['ratio_sdpa']}")
    for k, g in result["goals"].items():
        print(f"goal {k} >= {g['goal']}: {g['value']} {'met' if g['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
