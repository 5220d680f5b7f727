"""The `probe` verb: real training steps at the pilot's typical and long lengths, measured.

Before a pilot rents hours of a machine, the probe answers on that machine: how long does
one step take, how much memory does it peak at, and how far off is the analytic memory
model (`memory.estimate_step_memory`)? It uses the real model, the spec's adapter
(`audit.build_adapter`), a real AdamW (`train.make_optimizer`) and the training loop's own
step (`train.train_step`: forward, backward, clip, optimizer update), on batches of REAL
training examples:

- lengths: *typical* = the median (p50) token count of the encoded training examples,
  *long* = their maximum (encoding already caps it at data.max_length). A batch is the
  spec's micro_batch examples whose lengths are closest to the target (ties: data order),
  right-padded to the longest of them by `train.collate`, so `seq_len` is that padded
  width. Nothing is invented: with fewer examples than micro_batch, examples repeat.
- configurations: each length with activation checkpointing off and on; `search_batch`
  then doubles the micro-batch at the long length (both checkpointing settings) until a
  peak exceeds limits.memory_gb, a step runs out of memory (recorded as ok=False, the
  probe goes on), the next size would not fit in the memory available at the start
  (CPU: an out-of-memory there kills the process instead of raising), or the micro-batch
  would exceed the number of training examples.
- timing: each configuration gets a fresh optimizer, `warmup` warm-up steps and `steps`
  measured steps; first_step_s is its very first (cold) step, later_step_s the median
  and later_step_max_s the max of the measured ones. One step = one micro-batch and one
  optimizer update.
- memory, CUDA: torch.cuda.max_memory_allocated (and _reserved) after
  reset_peak_memory_stats; compared with the estimate's *total* (weights included).
  CPU: the peak RSS over the RSS just before the configuration's first step (a psutil
  thread samples every 5 ms; freed heap is handed back with malloc_trim first, so one
  configuration's leftovers do not hide the next one's growth). Weights and the
  trainable parameters were loaded (and paged in: `stepmeasure.make_resident`, since safetensors
  are memory-mapped lazily) before, so the RSS increase is compared with the
  estimate *without* its weights and trainable_master components (workspace recomputed
  on the rest, at the CPU's measured allocator overhead): `estimate_basis` says which. `peak_total_bytes` is the whole figure
  (CPU: the process's peak RSS; CUDA: max reserved), what a memory limit is checked
  against. estimate_error = (estimate - measured) / measured: positive overestimates.

Besides the steps: the model-load phase (time, peak RSS/VRAM), the memory available at the
start, other processes on the device, the checkpoint save time
(`checkpoint.save_checkpoint` into a temp folder of the run, removed), and the evaluation
throughput (the eval protocol on up to 32 validation examples). `estimate_only` loads no
weights: the shape comes from the base folder's config.json and the LoRA parameter count
from the shapes.

This module chooses what to measure, compares it with the memory model and writes the run;
measuring one configuration (timing, peak memory, out-of-memory, checkpointing switch,
other processes) is `stepmeasure`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from lorapilot import environment, registry
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.errors import UsageError
from lorapilot.memory import (
    CPU_WORKSPACE_FRACTION,
    CPU_WORKSPACE_FRACTION_CHECKPOINTING,
    DEFAULT_WORKSPACE_FRACTION,
    GIB,
    ModelShape,
    estimate_step_memory,
)
from lorapilot.models import pad_id_of
from lorapilot.spec import AdapterSpec, Pilot
from lorapilot.stepmeasure import (
    PeakMemory,
    make_resident,
    measure,
    other_processes,
    set_checkpointing,
)
from lorapilot.train import EAGER_ATTENTION_MAX_WIDTH, collate, count_target_tokens, train_step

MIN_STEPS, MIN_WARMUP = 5, 1
EVAL_EXAMPLES = 32
CPU_SAFE_FRACTION = 0.8  # of the RAM available at the start: the batch search's ceiling on CPU
STEP_INCREASE = "step_increase"  # CPU: estimate without weights and trainable_master
# what a step adds to a process whose weights are already resident (the CPU basis)
STEP_GROWTH = ("gradients", "optimizer_states", "activations", "logits", "weight_casts")
TOTAL = "total"
LORA_SHAPES = {  # module -> (input width, output width) in terms of ModelShape
    "q_proj": lambda s: (s.hidden, s.q_dim), "k_proj": lambda s: (s.hidden, s.kv_dim),
    "v_proj": lambda s: (s.hidden, s.kv_dim), "o_proj": lambda s: (s.q_dim, s.hidden),
    "gate_proj": lambda s: (s.hidden, s.intermediate), "up_proj": lambda s: (s.hidden, s.intermediate),
    "down_proj": lambda s: (s.intermediate, s.hidden),
}  # fmt: skip
_ATTENTION_PARENT = {"q_proj", "k_proj", "v_proj", "o_proj"}


# --------------------------------------------------------------------------- batches


def target_lengths(lengths: Sequence[int], max_length: int) -> dict[str, int]:
    """{"typical": p50, "long": max capped at max_length} of the encoded token counts."""
    if not lengths:
        raise UsageError("no training examples to probe with")
    return {
        "typical": int(round(statistics.median(lengths))),
        "long": min(max(lengths), max_length),
    }


def pick_examples(lengths: Sequence[int], target: int, n: int) -> list[int]:
    """Indices of the n examples whose length is closest to `target` (ties: data order);
    with fewer than n examples they repeat, closest first."""
    order = sorted(range(len(lengths)), key=lambda i: (abs(lengths[i] - target), i))
    return [order[k % len(order)] for k in range(n)]


# --------------------------------------------------------------------------- estimates


def lora_trainable_params(shape: ModelShape, adapter: AdapterSpec) -> int:
    """Trainable parameters of the spec's adapter, from the shapes alone: r x (in + out)
    per adapted Linear of every layer, plus full copies of `modules_to_save` embeddings
    or LM head. Module names match peft's rule (equal, or ending in "." + the name)."""
    if adapter.method == "full":
        return shape.n_params
    n = 0
    for layer in range(shape.n_layers):
        for module, dims in LORA_SHAPES.items():
            parent = "self_attn" if module in _ATTENTION_PARENT else "mlp"
            name = f"model.layers.{layer}.{parent}.{module}"
            targets = adapter.target_modules
            if targets == "all-linear" or any(name == t or name.endswith("." + t) for t in targets):
                d_in, d_out = dims(shape)
                n += adapter.r * (d_in + d_out)
    for m in adapter.modules_to_save:
        if m.rsplit(".", 1)[-1] in ("lm_head", "embed_tokens"):
            n += shape.vocab * shape.hidden
    return n


def _attention_kind(config: dict, seq_len: int, on_cpu: bool) -> str:
    """The attention a training step really runs: on a CPU the loop switches SDPA to eager
    attention for short micro-batches (`train.short_sequence_attention`)."""
    impl = str(config.get("_attn_implementation") or "sdpa")
    if impl == "sdpa" and on_cpu and seq_len <= EAGER_ATTENTION_MAX_WIDTH:
        return "eager"
    return "eager" if impl == "eager" else "flash" if impl.startswith("flash") else "sdpa"


def estimate_row(
    pilot: Pilot,
    shape: ModelShape,
    *,
    trainable: int,
    weight_bytes: float,
    attention: str,
    micro_batch: int,
    seq_len: int,
    grad_checkpointing: bool,
    loss_positions: int,
    on_cpu: bool,
    basis: str,
) -> dict:
    """The memory model's figure for one configuration, on the basis it is compared on."""
    spec = pilot.spec
    workspace = DEFAULT_WORKSPACE_FRACTION
    if on_cpu:
        workspace = (
            CPU_WORKSPACE_FRACTION_CHECKPOINTING if grad_checkpointing else CPU_WORKSPACE_FRACTION
        )
    est = estimate_step_memory(
        shape,
        trainable_params=trainable,
        weight_dtype_bytes=weight_bytes,
        micro_batch=micro_batch,
        seq_len=seq_len,
        precision=spec.train.precision,
        grad_checkpointing=grad_checkpointing,
        loss_positions_per_example=loss_positions if spec.train.loss_on == "completion" else None,
        attention=attention,
        adapter=spec.adapter.method,
        adapted_modules=spec.adapter.target_modules,
        lora_rank=spec.adapter.r,
        lora_dropout=spec.adapter.dropout,
        dropout_mask_bytes=4 if on_cpu else 1,  # CPUs keep a float mask (see memory.py)
        workspace_fraction=workspace,
    )
    if basis == STEP_INCREASE:
        grown = sum(est[k] for k in STEP_GROWTH)
        compared = int(grown * (1 + workspace))
    else:
        compared = est["total"]
    return {
        "estimated_peak_memory_bytes": compared,
        "estimated_total_bytes": est["total"],
        "estimate_basis": basis,
        "estimate_components": est,
    }


def _relative_error(estimate: float, measured: float | None) -> float | None:
    return (estimate - measured) / measured if measured else None


# --------------------------------------------------------------------------- environment


def _environment(env: dict) -> dict:
    import psutil
    import torch

    out = {
        "accelerator": env.get("accelerator", "cpu"),
        "available_memory_bytes": psutil.virtual_memory().available,
        "total_memory_bytes": psutil.virtual_memory().total,
    }
    if out["accelerator"] != "cpu":
        free, total = torch.cuda.mem_get_info()
        out.update(available_device_memory_bytes=free, device_memory_bytes=total)
    out["other_processes"] = other_processes(out["accelerator"])
    return out


# --------------------------------------------------------------------------- the verb


def run_probe(
    pilot: Pilot,
    *,
    search_batch: bool = False,
    estimate_only: bool = False,
    steps: int = MIN_STEPS,
    warmup: int = MIN_WARMUP,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Measure (or, with `estimate_only`, only estimate) training steps; see the module doc.

    -> {run_id, status, measurements, load, environment, eval_examples_per_s,
    checkpoint_save_s, estimate_only, lengths, batch_search, trainable_params, ...}.
    """
    if steps < MIN_STEPS or warmup < MIN_WARMUP:
        raise UsageError(
            f"the probe needs at least {MIN_WARMUP} warm-up and {MIN_STEPS} measured steps"
        )
    spec = pilot.spec
    env = environment.snapshot()
    with registry.open_run(
        pilot.dir,
        "probe",
        spec_hash=spec.spec_hash(),
        config=spec.model_dump(mode="json"),
        environment=env,
    ) as run:
        started = _environment(env)
        run.update(estimate_only=estimate_only, environment=started)
        if estimate_only:
            out = _estimate_only(pilot, run, started, log)
        else:
            out = _measured(
                pilot,
                run,
                started,
                search_batch=search_batch,
                steps=steps,
                warmup=warmup,
                progress=progress,
                log=log,
            )
        run.update(**out)
    return {
        "run_id": run.id,
        "status": run.record.status,
        "estimate_only": estimate_only,
        "environment": started,
        **out,
    }


def _encoded_train(pilot: Pilot, tok) -> tuple[list, Any, Any]:
    prepared = prepare_data(pilot, tok, enforce_leakage=False)  # sizes only: leaks do not matter
    fmt = formatter_for(pilot, tok)
    train_ex = encode_records(
        fmt, pilot.spec.task, prepared.splits["train"], prepared.answer_budget
    )
    if not train_ex:
        raise UsageError("the train split is empty: nothing to probe with")
    return train_ex, prepared, fmt


def _describe(row: dict) -> str:
    gib = lambda b: f"{b / GIB:.2f} GiB" if b is not None else "-"  # noqa: E731
    what = f"{row['length']} {row['seq_len']} tok x {row['micro_batch']}, ckpt {'on' if row['grad_checkpointing'] else 'off'}"
    if row.get("first_step_s") is None:
        return f"probe: {what}: estimate {gib(row['estimated_peak_memory_bytes'])}" + (
            f" ({row['error']})" if row.get("error") else ""
        )
    return (
        f"probe: {what}: first {row['first_step_s']:.3f} s, later {row['later_step_s'] or 0:.3f} s, "
        f"peak {gib(row['peak_memory_bytes'])} (estimate {gib(row['estimated_peak_memory_bytes'])})"
        + ("" if row["ok"] else f" FAILED {row['error']}")
    )


def _estimate_only(pilot: Pilot, run, started: dict, log) -> dict:
    """Shapes from config.json, lengths from the tokenized data: no weights are loaded."""
    from lorapilot.data.stage import load_tokenizer
    from lorapilot.train import example_target_tokens

    spec = pilot.spec
    resolved, tok = load_tokenizer(pilot)
    config = json.loads((resolved.path / "config.json").read_text(encoding="utf-8"))
    try:
        shape = ModelShape.from_config(config)
    except ValueError as e:
        raise UsageError(f"{resolved.path / 'config.json'}: {e}") from e
    train_ex, _, _ = _encoded_train(pilot, tok)
    lengths = [e.n_tokens for e in train_ex]
    targets = target_lengths(lengths, spec.data.max_length)
    if spec.data.max_length > targets["long"]:
        targets["max_length"] = spec.data.max_length  # the longest input the spec allows
    trainable = lora_trainable_params(shape, spec.adapter)
    weight_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[spec.model.dtype]
    mb = spec.train.micro_batch
    rows = []
    for name, target in targets.items():
        idx = pick_examples(lengths, target, mb)
        seq_len = target if name == "max_length" else max(lengths[i] for i in idx)
        positions = max(1, math.ceil(sum(example_target_tokens(train_ex[i]) for i in idx) / mb))
        for ckpt in (False, True):
            row = {
                "length": name,
                "target_seq_len": target,
                "seq_len": seq_len,
                "micro_batch": mb,
                "grad_checkpointing": ckpt,
                "measured": False,
                "search": False,
                "first_step_s": None,
                "later_step_s": None,
                "later_step_max_s": None,
                "peak_memory_bytes": None,
                "estimate_error": None,
                "tokens_per_s": None,
                "ok": None,
                "error": None,
                "loss_positions_per_example": positions,
            }
            row.update(
                estimate_row(
                    pilot,
                    shape,
                    trainable=trainable,
                    weight_bytes=weight_bytes,
                    attention=_attention_kind(config, seq_len, started["accelerator"] == "cpu"),
                    micro_batch=mb,
                    seq_len=seq_len,
                    grad_checkpointing=ckpt,
                    loss_positions=positions,
                    on_cpu=started["accelerator"] == "cpu",
                    basis=TOTAL,
                )
            )
            rows.append(row)
            log(_describe(row))
    return {
        "measurements": rows,
        "lengths": targets,
        "trainable_params": trainable,
        "trainable_params_source": "analytic (r x (in + out) per adapted Linear)",
        "model_shape": dataclasses.asdict(shape),
        "base": str(resolved.path),
        "load": None,
        "eval_examples_per_s": None,
        "checkpoint_save_s": None,
        "batch_search": None,
    }


def _measured(
    pilot: Pilot,
    run,
    started: dict,
    *,
    search_batch: bool,
    steps: int,
    warmup: int,
    progress: bool,
    log,
) -> dict:
    import torch

    from lorapilot.audit import build_adapter
    from lorapilot.checkpoint import save_checkpoint
    from lorapilot.evaluate.runner import evaluate_records, make_protocol
    from lorapilot.evaluate.stage import load_base
    from lorapilot.train import make_optimizer, make_scheduler, seed_everything

    spec, tcfg = pilot.spec, pilot.spec.train
    accel = started["accelerator"]
    device = torch.device("cuda" if accel != "cpu" else "cpu")
    on_cpu = device.type == "cpu"
    seed_everything(tcfg.seed)

    # -- the model-load phase on its own: load, adapter, move to the device -----------------
    with PeakMemory(device) as load_mem:
        t0 = time.perf_counter()
        resolved, model, tok = load_base(pilot)
        base_params = sum(p.numel() for p in model.parameters())
        weight_bytes = next(model.parameters()).element_size()
        config = model.config.to_dict()
        model, info = build_adapter(model, spec.adapter, seed=tcfg.seed)
        model.to(device)
        make_resident(model)  # part of loading: the weights are in memory before any step
        load_s = time.perf_counter() - t0
    load = {
        "seconds": load_s,
        "peak_rss_bytes": load_mem.rss_peak,
        "rss_increase_bytes": load_mem.increase,
        "cuda_peak_allocated_bytes": load_mem.cuda_allocated,
        "cuda_peak_reserved_bytes": load_mem.cuda_reserved,
        "weights_bytes": base_params * weight_bytes,
        "base": str(resolved.path),
    }
    run.update(load=load, trainable_params=info["trainable_params"])
    log(
        f"probe: model loaded in {load_s:.2f} s ({info['trainable_params']:,} trainable parameters)"
    )

    shape = ModelShape.from_config(config, n_params=base_params)
    train_ex, prepared, fmt = _encoded_train(pilot, tok)
    lengths = [e.n_tokens for e in train_ex]
    targets = target_lengths(lengths, spec.data.max_length)
    pad_id = pad_id_of(tok)
    basis = STEP_INCREASE if on_cpu else TOTAL
    rows: list[dict] = []
    model.train()

    def one(name: str, mb: int, ckpt: bool, search: bool = False) -> dict:
        idx = pick_examples(lengths, targets[name], mb)
        batch = collate([train_ex[i] for i in idx], pad_id)
        seq_len = batch["input_ids"].shape[1]
        positions = max(1, math.ceil(count_target_tokens(batch) / mb))
        set_checkpointing(model, ckpt)
        m = measure(
            model,
            batch,
            make_opt=lambda: make_optimizer(model, tcfg),
            precision=tcfg.precision,
            max_grad_norm=tcfg.max_grad_norm,
            steps=steps,
            warmup=warmup,
            device=device,
        )
        del batch
        row = {
            "length": name,
            "target_seq_len": targets[name],
            "seq_len": seq_len,
            "micro_batch": mb,
            "grad_checkpointing": ckpt,
            "measured": True,
            "search": search,
            "loss_positions_per_example": positions,
            **m,
        }
        row.update(
            estimate_row(
                pilot,
                shape,
                trainable=info["trainable_params"],
                weight_bytes=weight_bytes,
                attention=_attention_kind(config, seq_len, on_cpu),
                micro_batch=mb,
                seq_len=seq_len,
                grad_checkpointing=ckpt,
                loss_positions=positions,
                on_cpu=on_cpu,
                basis=basis,
            )
        )
        row["estimate_error"] = (
            _relative_error(row["estimated_peak_memory_bytes"], m["peak_memory_bytes"])
            if m["ok"]
            else None
        )
        rows.append(row)
        run.update(measurements=rows)
        log(_describe(row))
        return row

    for name in ("typical", "long"):
        for ckpt in (False, True):
            one(name, tcfg.micro_batch, ckpt)
    search = (
        _search(one, rows, pilot, started, n_train=len(train_ex), on_cpu=on_cpu)
        if search_batch
        else None
    )
    set_checkpointing(model, False)

    # -- one checkpoint as the training loop writes it (weights, optimizer, RNG), timed ------
    optimizer = make_optimizer(model, tcfg)
    batch = collate(
        [train_ex[i] for i in pick_examples(lengths, targets["typical"], tcfg.micro_batch)], pad_id
    )
    train_step(
        model,
        optimizer,
        None,
        [batch],
        count_target_tokens(batch),
        tcfg.precision,
        tcfg.max_grad_norm,
    )
    scheduler = make_scheduler(optimizer, "constant", 0, 1)
    root = run.dir / ".probe-checkpoint"
    try:
        t0 = time.perf_counter()
        save_checkpoint(root, 1, model, optimizer, scheduler, None, {"step": 1, "probe": True})
        checkpoint_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    del optimizer, scheduler, batch
    log(f"probe: checkpoint saved in {checkpoint_s:.3f} s")

    # -- evaluation throughput with the pilot's protocol (casts the model: done last) ------
    eval_eps, eval_n = None, 0
    records = prepared.splits.get("val", [])[:EVAL_EXAMPLES]
    if records:
        model.eval()
        protocol = make_protocol(spec, tok, prepared)
        ev = evaluate_records(
            model, tok, fmt, spec, records, protocol, progress=progress, label="probe eval"
        )
        eval_eps, eval_n = ev.examples_per_s, len(records)
        log(f"probe: evaluation {eval_eps:.2f} examples/s ({eval_n} validation examples)")
    return {
        "measurements": rows,
        "lengths": targets,
        "load": load,
        "batch_search": search,
        "trainable_params": info["trainable_params"],
        "total_params": info["total_params"],
        "model_shape": dataclasses.asdict(shape),
        "checkpoint_save_s": checkpoint_s,
        "eval_examples_per_s": eval_eps,
        "eval_examples": eval_n,
        "step_definition": "one micro-batch forward + backward and one optimizer update",
    }


def _search(
    one, rows: list[dict], pilot: Pilot, started: dict, *, n_train: int, on_cpu: bool
) -> dict:
    """Double the micro-batch at the long length, per checkpointing setting, until a limit."""
    limit_gb = pilot.spec.limits.memory_gb
    limit = limit_gb * GIB if limit_gb else None
    ceiling = CPU_SAFE_FRACTION * started["available_memory_bytes"] if on_cpu else None
    result = {}
    for ckpt in (False, True):
        last = next(
            r
            for r in rows
            if r["length"] == "long" and r["grad_checkpointing"] == ckpt and not r["search"]
        )
        best, stop = None, None
        while True:
            if not last["ok"]:
                stop = "out of memory"
                break
            if limit is not None and last["peak_total_bytes"] > limit:
                stop = "limits.memory_gb exceeded"
                break
            best = last["micro_batch"]
            nxt = 2 * best
            if nxt > max(n_train, pilot.spec.train.micro_batch):
                stop = "micro-batch would exceed the number of training examples"
                break
            if (
                ceiling is not None
                and last["rss_before_bytes"] + 2.2 * last["peak_memory_bytes"] > ceiling
            ):
                stop = "the next size would not fit in the memory available at the start"
                break
            last = one("long", nxt, ckpt, search=True)
        result["on" if ckpt else "off"] = {"largest_ok_micro_batch": best, "stopped_because": stop}
    return result
