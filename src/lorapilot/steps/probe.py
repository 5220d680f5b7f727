"""`lorapilot probe`: real training steps at the pilot's typical and long lengths, measured.

Before a pilot rents hours of a machine, the probe answers on that machine: how long does
one step take, how much memory does it peak at, and how far off is the analytic memory
model (`memory.estimate_step_memory`)? It uses the real model, the spec's adapter
(`adapter.build_adapter`), a real AdamW (`train.step.make_optimizer`) and the training loop's
own step (`train.step.train_step`: forward, backward, clip, optimizer update), on batches of REAL
training examples:

- lengths: *typical* = the median (p50) token count of the encoded training examples,
  *long* = their maximum (encoding already caps it at data.max_length). A batch is the
  spec's micro_batch examples whose lengths are closest to the target (ties: data order),
  right-padded to the longest of them by `train.batches.collate`, so `seq_len` is that padded
  width. Nothing is invented: with fewer examples than micro_batch, examples repeat.
- configurations: each length with activation checkpointing off and on (`checkpointing=
  "spec"`, as `run` asks: the spec's setting only, and the other one too when the spec's
  does not fit, out of memory or over limits.memory_gb); `search_batch`
  then doubles the micro-batch at the long length (both checkpointing settings) until a
  peak exceeds limits.memory_gb, a step runs out of memory (recorded as ok=False, the
  probe goes on), the next size would not fit in the memory available at the start
  (CPU: an out-of-memory there kills the process instead of raising), or the micro-batch
  would exceed the number of training examples.
- timing: each configuration gets a fresh optimizer, `warmup` warm-up steps and `steps`
  measured steps; first_step_s is its very first (cold) step, later_step_s the median
  and later_step_max_s the max of the measured ones (on CPU all but the profiled last).
  One step = one micro-batch and one optimizer update.
- memory, CUDA: torch.cuda.max_memory_allocated (and _reserved) after
  reset_peak_memory_stats; compared with the estimate's *total* (weights included).
  CPU: the peak RSS over the RSS just before the configuration's first step (a psutil
  thread samples every 5 ms; freed heap is handed back with malloc_trim first, so one
  configuration's leftovers do not hide the next one's growth). Weights and the
  trainable parameters were loaded (and paged in: `stepmeasure.make_resident`, since safetensors
  are memory-mapped lazily) before, so the RSS increase is compared with the
  estimate *without* its weights and trainable_master components (workspace recomputed
  on the rest, at the CPU's measured allocator overhead): `estimate_basis` says which.
  `peak_total_bytes` is the whole figure
  (CPU: the process's peak RSS; CUDA: max reserved), what a memory limit is checked
  against. estimate_error = (estimate - measured) / measured: positive overestimates.
  CPU, also: the last measured step runs under torch's profiler memory events (and is left
  out of the times): `peak_live_bytes`, what the step's tensors held at once, beside the
  model's `estimated_live_bytes` (`live_estimate_error`). The RSS depends on what glibc's
  heap kept from earlier work; the live bytes are the same every time, as CUDA's are.
- the path: with the shared-prefix path (`prefix_decision`, the loop's), the estimate counts
  it too (`shared_prefix_tokens`).

Besides the steps: the model-load phase (time, peak RSS/VRAM), the memory available at the
start, other processes on the device, the checkpoint save time
(`train.checkpoint.save_checkpoint` into a temp folder of the run, removed), and the evaluation
throughput (the eval protocol on up to 32 validation examples). `estimate_only` loads no
weights: the shape comes from the base folder's config.json and the LoRA parameter count
from the shapes.

This step chooses what to measure and writes the run; what to measure and the memory model's
figure beside it are `sizing`, measuring one configuration (timing, peak memory, out-of-memory,
checkpointing switch, other processes) is `stepmeasure`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

from lorapilot.base.adapter import build_adapter, set_checkpointing
from lorapilot.base.models import load_base, load_tokenizer, pad_id_of
from lorapilot.base.precision import hold_for_training
from lorapilot.base.quantize import is_quantized
from lorapilot.data.dataset import encode_records, formatter_for, max_length_of, prepare_data
from lorapilot.decision.plan import step_shape
from lorapilot.errors import UsageError
from lorapilot.evaluate.runner import evaluate_records, make_protocol
from lorapilot.records.progress import format_gib
from lorapilot.records.steprun import open_run, snapshot
from lorapilot.sizing.measure import (
    CpuLoad,
    checkpoint_seconds,
    make_resident,
    measure,
    other_processes,
)
from lorapilot.sizing.memory import EVAL_LIVE_COMPONENTS, GIB, ModelShape
from lorapilot.sizing.probe_plan import (
    STEP_INCREASE,
    TOTAL,
    attention_kind,
    estimate_row,
    eval_estimate,
    lora_trainable_params,
    pick_examples,
    relative_error,
    target_lengths,
    weight_bytes_of,
)
from lorapilot.spec import Pilot
from lorapilot.train.batches import collate, count_target_tokens, example_target_tokens
from lorapilot.train.compiled import pad_multiple
from lorapilot.train.loop import seed_everything
from lorapilot.train.loss import loss_fn_for, prefix_decision
from lorapilot.train.meter import PeakMemory, live_tensor_peak
from lorapilot.train.step import make_optimizer

MIN_STEPS, MIN_WARMUP = 5, 1
EVAL_EXAMPLES = 32
CPU_SAFE_FRACTION = 0.8  # of the RAM available at the start: the batch search's ceiling on CPU


# --------------------------------------------------------------------------- batches


# --------------------------------------------------------------------------- estimates


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
    checkpointing: str = "both",
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
    if checkpointing not in ("both", "spec"):
        raise UsageError(f"--checkpointing must be both or spec, got {checkpointing!r}")
    env = snapshot(pilot)
    with open_run(pilot, "probe", env=env) as run:
        started = _environment(env)
        run.update(
            estimate_only=estimate_only,
            environment=started,
            variant=pilot.variant,
            step_shape=step_shape(pilot.spec.model_dump(mode="json")),
        )
        if pilot.spec.task.modality == "image":  # one step shape; no memory model yet
            from lorapilot.modality.image_probe import probe_images

            out = probe_images(pilot, run, steps=steps, warmup=warmup, progress=progress, log=log)
        elif estimate_only:
            out = _estimate_only(pilot, run, started, log)
        else:
            out = _measured(
                pilot,
                run,
                started,
                search_batch=search_batch,
                steps=steps,
                warmup=warmup,
                checkpointing=checkpointing,
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
    ckpt = "on" if row["grad_checkpointing"] else "off"
    what = f"{row['length']} {row['seq_len']} tok x {row['micro_batch']}, ckpt {ckpt}"
    if row.get("first_step_s") is None:
        return f"probe: {what}: estimate {format_gib(row['estimated_peak_memory_bytes'])}" + (
            f" ({row['error']})" if row.get("error") else ""
        )
    live = ""
    if row.get("peak_live_bytes"):
        live = (
            f"; tensors live {format_gib(row['peak_live_bytes'])} (estimate "
            f"{format_gib(row['estimated_live_bytes'])})"
        )
    return (
        f"probe: {what}: first {row['first_step_s']:.3f} s, "
        f"later {row['later_step_s'] or 0:.3f} s, "
        f"peak {format_gib(row['peak_memory_bytes'])} (estimate "
        f"{format_gib(row['estimated_peak_memory_bytes'])}){live}"
        + ("" if row["ok"] else f" FAILED {row['error']}")
    )


def _estimate_only(pilot: Pilot, run, started: dict, log) -> dict:
    """Shapes from config.json, lengths from the tokenized data: no weights are loaded."""
    spec = pilot.spec
    resolved, tok = load_tokenizer(pilot)
    config = json.loads((resolved.path / "config.json").read_text(encoding="utf-8"))
    try:
        shape = ModelShape.from_config(config)
    except ValueError as e:
        raise UsageError(f"{resolved.path / 'config.json'}: {e}") from e
    train_ex, _, _ = _encoded_train(pilot, tok)
    lengths = [e.n_tokens for e in train_ex]
    max_length = max_length_of(pilot, tok)
    targets = target_lengths(lengths, max_length)
    if spec.data.max_length != "auto" and max_length > targets["long"]:
        targets["max_length"] = max_length  # the longest input the spec allows
    trainable = lora_trainable_params(shape, spec.adapter)
    weight_bytes = weight_bytes_of(spec)
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
                    attention=attention_kind(config, seq_len, started["accelerator"] == "cpu"),
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


@dataclasses.dataclass
class _Probe:
    """What measuring one configuration needs: the loaded model and the encoded examples."""

    pilot: Pilot
    run: Any
    model: Any
    device: Any
    train_ex: list
    targets: dict[str, int]
    pad_id: int
    shape: ModelShape
    config: dict
    trainable: int
    weight_bytes: int
    steps: int
    warmup: int
    log: Callable[[str], None]
    rows: list[dict] = dataclasses.field(default_factory=list)

    @property
    def lengths(self) -> list[int]:
        return [e.n_tokens for e in self.train_ex]

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"


def _measure_config(pr: _Probe, name: str, mb: int, ckpt: bool, search: bool = False) -> dict:
    """Measure one (length, micro-batch, checkpointing) configuration, put the memory model's
    figure beside it, record the row in the run and return it."""
    tcfg = pr.pilot.spec.train
    idx = pick_examples(pr.lengths, pr.targets[name], mb)
    # padded as training pads it (train.pad_to_multiple_of; 64 under CUDA graphs)
    batch = collate([pr.train_ex[i] for i in idx], pr.pad_id, pad_multiple(tcfg, pr.device.type))
    seq_len = batch["input_ids"].shape[1]
    positions = max(1, math.ceil(count_target_tokens(batch) / mb))
    set_checkpointing(pr.model, ckpt)
    # The path training will take: the shared prefix computed once per micro-batch (with or
    # without checkpointing), unless train.shared_prefix is off.
    loss_fn, path = loss_fn_for(tcfg)
    shared = 0
    if path[0] == "shared":
        decided, why, n = prefix_decision(pr.model, batch, tcfg.shared_prefix)
        path, shared = (decided, why), (n if decided == "shared" else 0)
    m = measure(
        pr.model,
        batch,
        make_opt=lambda: make_optimizer(pr.model, tcfg),
        precision=tcfg.precision,
        max_grad_norm=tcfg.max_grad_norm,
        steps=pr.steps,
        warmup=pr.warmup,
        device=pr.device,
        loss_fn=loss_fn,
        live=pr.on_cpu,
        lora_forward=tcfg.lora_forward,
    )
    del batch
    row = {
        "length": name,
        "target_seq_len": pr.targets[name],
        "seq_len": seq_len,
        "micro_batch": mb,
        "grad_checkpointing": ckpt,
        "measured": True,
        "search": search,
        "loss_positions_per_example": positions,
        "prefix_path": path[0],
        "shared_prefix_tokens": shared,
        **m,
    }
    row.update(
        estimate_row(
            pr.pilot,
            pr.shape,
            trainable=pr.trainable,
            weight_bytes=pr.weight_bytes,
            attention=attention_kind(pr.config, seq_len, pr.on_cpu),
            micro_batch=mb,
            seq_len=seq_len,
            grad_checkpointing=ckpt,
            loss_positions=positions,
            on_cpu=pr.on_cpu,
            basis=STEP_INCREASE if pr.on_cpu else TOTAL,
            shared_prefix=shared,
        )
    )
    row["estimate_error"] = (
        relative_error(row["estimated_peak_memory_bytes"], m["peak_memory_bytes"])
        if m["ok"]
        else None
    )
    row["live_estimate_error"] = (
        relative_error(row["estimated_live_bytes"], m["peak_live_bytes"])
        if m["ok"] and row["estimated_live_bytes"] and m["peak_live_bytes"]
        else None
    )
    pr.rows.append(row)
    pr.run.update(measurements=pr.rows)
    pr.log(_describe(row))
    return row


def _load_phase(pilot: Pilot, device) -> tuple[Any, Any, Any, dict, dict]:
    """Load the base, attach the adapter, move it to the device and page it in, measured on
    its own: (model, tokenizer, adapter info, config, load record)."""
    with PeakMemory(device) as load_mem:
        t0 = time.perf_counter()
        resolved, model, tok = load_base(pilot, use="train")
        quantized = is_quantized(model)
        # A quantized base packs two 4-bit weights in a byte: count its parameters from the
        # config, and its bytes from what is held (quantization state included).
        if quantized:
            base_params, weight_bytes = None, weight_bytes_of(pilot.spec)
            held = {v.data_ptr(): v.nbytes for v in model.state_dict().values()}
            weights_bytes = sum(held.values())  # tied tensors once
        else:
            base_params = sum(p.numel() for p in model.parameters())
            weight_bytes = next(model.parameters()).element_size()
            weights_bytes = base_params * weight_bytes
        config = model.config.to_dict()
        model, info = build_adapter(model, pilot.spec.adapter, seed=pilot.spec.train.seed)
        info.update(hold_for_training(model, pilot.spec))  # as the trainer holds it
        if "frozen_held" in info:
            frozen = {id(p): p.nbytes for p in model.parameters() if not p.requires_grad}
            weights_bytes = sum(frozen.values())
            weight_bytes = weight_bytes_of(pilot.spec)  # the fp32 rest; linears: the estimate's
        if not quantized:  # a quantized base was loaded on its device
            model.to(device)
        make_resident(model)  # part of loading: the weights are in memory before any step
        load_s = time.perf_counter() - t0
    load = {
        "seconds": load_s,
        "peak_rss_bytes": load_mem.rss_peak,
        "rss_increase_bytes": load_mem.increase,
        "cuda_peak_allocated_bytes": load_mem.cuda_allocated,
        "cuda_peak_reserved_bytes": load_mem.cuda_reserved,
        "weights_bytes": weights_bytes,
        "base": str(resolved.path),
        "base_params": base_params,
        "weight_bytes": weight_bytes,
    }
    return model, tok, info, config, load


def _checkpoint_seconds(pr: _Probe) -> float:
    """One checkpoint as the training loop writes it, on a typical micro-batch, timed."""
    tcfg = pr.pilot.spec.train
    idx = pick_examples(pr.lengths, pr.targets["typical"], tcfg.micro_batch)
    batch = collate([pr.train_ex[i] for i in idx], pr.pad_id, pad_multiple(tcfg, pr.device.type))
    return checkpoint_seconds(
        pr.model, batch, tcfg, pr.run.dir / ".probe-checkpoint", tcfg.precision
    )


def _measured(
    pilot: Pilot,
    run,
    started: dict,
    *,
    search_batch: bool,
    steps: int,
    warmup: int,
    checkpointing: str,
    progress: bool,
    log,
) -> dict:
    import torch

    spec, tcfg = pilot.spec, pilot.spec.train
    device = torch.device("cuda" if started["accelerator"] != "cpu" else "cpu")
    seed_everything(tcfg.seed)
    model, tok, info, config, load = _load_phase(pilot, device)
    base_params, weight_bytes = load.pop("base_params"), load.pop("weight_bytes")
    run.update(load=load, trainable_params=info["trainable_params"])
    log(
        f"probe: model loaded in {load['seconds']:.2f} s "
        f"({info['trainable_params']:,} trainable parameters)"
    )

    train_ex, prepared, fmt = _encoded_train(pilot, tok)
    pr = _Probe(
        pilot=pilot,
        run=run,
        model=model,
        device=device,
        train_ex=train_ex,
        targets=target_lengths([e.n_tokens for e in train_ex], fmt.max_length),
        pad_id=pad_id_of(tok),
        shape=ModelShape.from_config(config, n_params=base_params),
        config=config,
        trainable=info["trainable_params"],
        weight_bytes=weight_bytes,
        steps=steps,
        warmup=warmup,
        log=log,
    )
    model.train()
    meter = CpuLoad() if pr.on_cpu else None  # GPUs: other_processes lists their users
    settings = [False, True] if checkpointing == "both" else [tcfg.grad_checkpointing]
    for name in ("typical", "long"):
        for ckpt in settings:
            _measure_config(pr, name, tcfg.micro_batch, ckpt)
    if len(settings) == 1 and not _fits(pr.rows, spec.limits.memory_gb):
        # the spec's step does not fit: measure the other setting, the first fix to try
        settings.append(not settings[0])
        for name in ("typical", "long"):
            _measure_config(pr, name, tcfg.micro_batch, settings[1])
    search = _search(pr, started, settings) if search_batch else None
    load_check = meter.stop(torch.get_num_threads()) if meter is not None else None
    if load_check is not None and load_check["disturbed"]:
        log(
            f"warning: other processes used {load_check['other_cores']:.1f} of "
            f"{load_check['cores']} cores while the probe measured: its step times are "
            "disturbed (load_check.disturbed; `run` measures again instead of reusing it). "
            "Measure on a quiet machine."
        )
    set_checkpointing(model, False)
    checkpoint_s = _checkpoint_seconds(pr)
    log(f"probe: checkpoint saved in {checkpoint_s:.3f} s")

    # -- evaluation throughput with the pilot's protocol (casts the model: done last) ------
    eval_eps, eval_n, eval_peak, eval_est = None, 0, None, None
    records = prepared.splits.get("val", [])[:EVAL_EXAMPLES]
    if records:
        model.eval()
        protocol = make_protocol(spec, tok, prepared)
        ev = evaluate_records(  # with the generation check, as every evaluation runs it
            model, tok, fmt, spec, records, protocol, progress=progress, label="probe eval",
            generation_check=spec.eval.generation_check,
        )  # fmt: skip
        eval_eps, eval_n = ev.examples_per_s, len(records)
        # The evaluation peak at its widest: one batch of the longest validation prompts
        # (the throughput above is the typical one, which the time estimates need).
        val = prepared.splits["val"]
        widths = [len(fmt.encode_prompt(r.text, prepared.answer_budget, r.context)) for r in val]
        order = sorted(range(len(val)), key=lambda i: -widths[i])[: spec.eval.batch_size]
        # On a CPU, also the bytes its tensors held at once (the RSS increase depends on what
        # the heap kept from the training steps before it): what the model is held to.
        chosen = [val[i] for i in order]
        # a profiling window per model call (one decoding step): a long generation of a
        # wide batch must not keep millions of profiler events (24 GiB on GSM8K)
        with live_tensor_peak(model) if pr.on_cpu else contextlib.nullcontext({}) as seen:
            wide = evaluate_records(model, tok, fmt, spec, chosen, protocol, progress=False)
        eval_peak = max(ev.peak_memory_bytes or 0, wide.peak_memory_bytes or 0) or None
        eval_est = _eval_estimate(pr, model, fmt, protocol, [widths[i] for i in order],
                                  chosen, wide, seen.get("peak_bytes"))  # fmt: skip
        live_note = ""
        if "measured_live_bytes" in eval_est:
            case = ", for an unsure model" if "estimate_case" in eval_est else ""
            live_note = (
                f"; tensors live {format_gib(eval_est['measured_live_bytes'])} (estimate "
                f"{format_gib(eval_est['estimated_live_bytes'])}{case})"
            )
        log(
            f"probe: evaluation {eval_eps:.2f} examples/s ({eval_n} validation examples), "
            f"peak {format_gib(eval_peak or 0)} with the {len(order)} longest prompts "
            f"(increase {format_gib(wide.peak_increase_bytes or 0)}, estimate "
            f"{format_gib(eval_est['estimated_peak_memory_bytes'])}){live_note}"
        )
    return {
        "measurements": pr.rows,
        "lengths": pr.targets,
        "load": load,
        "batch_search": search,
        "trainable_params": info["trainable_params"],
        "total_params": info["total_params"],
        "model_shape": dataclasses.asdict(pr.shape),
        "checkpointing_settings": ["on" if c else "off" for c in settings],
        "checkpoint_save_s": checkpoint_s,
        "eval_examples_per_s": eval_eps,
        "eval_examples": eval_n,
        "eval_peak_memory_bytes": eval_peak,
        "eval_estimate": eval_est,
        "step_definition": "one micro-batch forward + backward and one optimizer update",
        "load_check": load_check,
        "disturbed": bool(load_check and load_check["disturbed"]),
    }


def eval_batch_estimate(shape, spec, model, fmt, protocol, records, widths, on_cpu) -> dict:
    """`sizing.eval_estimate` for one evaluation batch of `records` (prompt lengths `widths`)
    under the pilot's protocol: its shared prefix, the labels' trie and the best-first
    search's widest pass, as `evaluate.predict` will run them."""
    from lorapilot.evaluate.predict import (
        shared_prefix_len,
        takes_4d_masks,
        tree_size,
        widest_search_pass,
    )

    budget = protocol["answer_budget"]
    prompts = [fmt.encode_prompt(r.text, budget, r.context) for r in records]
    enc = [fmt.encode("x", lab, budget) for lab in spec.task.labels or ["x"]]
    tree = tree_size([e.input_ids[e.prompt_len :] for e in enc])
    best_first = spec.eval.label_search == "best_first"
    return eval_estimate(
        shape,
        protocol,
        batch_size=len(records),
        prompt_len=max(widths),
        shared_prefix_len=shared_prefix_len(prompts),
        label_tokens=[len(e.input_ids) - e.prompt_len for e in enc],
        tree=takes_4d_masks(model),
        on_cpu=on_cpu,
        tree_tokens=tree,
        pass_tokens=widest_search_pass(len(records), tree) if best_first else None,
    )


def _eval_estimate(pr, model, fmt, protocol, widths, records, wide, live=None) -> dict:
    """The memory model's figure for the widest evaluation batch, beside what it measured:
    estimate_error = (estimate - measured) / measured on the basis of `sizing.eval_estimate`;
    with `live` (a CPU's live-tensor peak of the batch) also `live_estimate_error`, against
    the components that live in tensors (EVAL_LIVE_COMPONENTS: the weights were cast before,
    the workspace is the allocator's)."""
    est = eval_batch_estimate(
        pr.shape, pr.pilot.spec, model, fmt, protocol, records, widths, pr.on_cpu
    )
    measured = wide.peak_increase_bytes
    est["measured_peak_memory_bytes"] = measured
    est["estimate_error"] = relative_error(est["estimated_peak_memory_bytes"], measured)
    if live:
        parts = est["estimate_components"]
        estimated_live = sum(parts[k] for k in EVAL_LIVE_COMPONENTS)
        est["measured_live_bytes"], est["estimated_live_bytes"] = live, estimated_live
        est["live_estimate_error"] = relative_error(estimated_live, live)
    return est


def _fits(rows: list[dict], limit_gb: float | None) -> bool:
    """Every measured step ran, and under limits.memory_gb when one is set."""
    limit = limit_gb * GIB if limit_gb else None
    return all(
        r["ok"] and (limit is None or (r.get("peak_total_bytes") or 0) <= limit) for r in rows
    )


def _search(pr: _Probe, started: dict, settings: list[bool]) -> dict:
    """Double the micro-batch at the long length, per checkpointing setting, until a limit."""
    pilot, rows, n_train = pr.pilot, pr.rows, len(pr.train_ex)
    limit_gb = pilot.spec.limits.memory_gb
    limit = limit_gb * GIB if limit_gb else None
    ceiling = CPU_SAFE_FRACTION * started["available_memory_bytes"] if pr.on_cpu else None
    result = {}
    for ckpt in sorted(settings):
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
            last = _measure_config(pr, "long", nxt, ckpt, search=True)
        result["on" if ckpt else "off"] = {"largest_ok_micro_batch": best, "stopped_because": stop}
    return result
