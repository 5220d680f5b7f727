"""What the probe measures and the memory model's figure beside each measurement: the typical
and long lengths, the examples closest to them, the adapter's parameter count from the shapes,
the attention a step really runs, and the estimate on the basis it is compared on. Pure: no
model is loaded here."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from lorapilot.base.precision import base_dtype, held_dtype, resolve
from lorapilot.base.quantize import dequantized_bytes, weight_bytes_per_param
from lorapilot.errors import UsageError
from lorapilot.sizing.memory import (
    CPU_WORKSPACE_FRACTION,
    CPU_WORKSPACE_FRACTION_CHECKPOINTING,
    DEFAULT_WORKSPACE_FRACTION,
    LORA_SHAPES,
    ModelShape,
    estimate_eval_memory,
    estimate_step_memory,
)
from lorapilot.spec import AdapterSpec, Pilot
from lorapilot.train.step import EAGER_ATTENTION_MAX_WIDTH

STEP_INCREASE = "step_increase"  # CPU: estimate without weights and trainable_master


# what a step adds to a process whose weights are already resident (the CPU basis)
STEP_GROWTH = (
    "gradients", "optimizer_states", "activations", "logits", "weight_casts", "dequantize",
)  # fmt: skip


TOTAL = "total"


_ATTENTION_PARENT = {"q_proj", "k_proj", "v_proj", "o_proj"}


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


def lora_trainable_params(shape: ModelShape, adapter: AdapterSpec) -> int:
    """Trainable parameters of the spec's adapter, from the shapes alone: r x (in + out)
    per adapted Linear of every layer (and DoRA's magnitude, one per output), plus full
    copies of `modules_to_save` embeddings or LM head. Module names match peft's rule
    (equal, or ending in "." + the name)."""
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
                n += adapter.r * (d_in + d_out) + (d_out if adapter.dora else 0)
    for m in adapter.modules_to_save:
        if m.rsplit(".", 1)[-1] in ("lm_head", "embed_tokens"):
            n += shape.vocab * shape.hidden
    return n


def attention_kind(config: dict, seq_len: int, on_cpu: bool) -> str:
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
    shared_prefix: int = 0,
) -> dict:
    """The memory model's figure for one configuration, on the basis it is compared on
    (`shared_prefix`: tokens the rows share when the shared-prefix path runs, else 0)."""
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
        precision=resolve(spec.train.precision, "cpu" if on_cpu else "cuda"),
        grad_checkpointing=grad_checkpointing,
        loss_positions_per_example=loss_positions if spec.train.loss_on == "completion" else None,
        attention=attention,
        adapter=spec.adapter.method,
        adapted_modules=spec.adapter.target_modules,
        lora_rank=spec.adapter.r,
        lora_dropout=spec.adapter.dropout,
        dora=spec.adapter.dora,
        dropout_mask_bytes=4 if on_cpu else 1,  # CPUs keep a float mask (see memory.py)
        lora_forward=spec.train.lora_forward,
        workspace_fraction=workspace,
        **quantized_memory(spec.model.quantization),
        shared_prefix_tokens=shared_prefix,
        held_linear_bytes=held_linear_bytes_of(spec, "cpu" if on_cpu else "cuda"),
    )
    grown = sum(est[k] for k in STEP_GROWTH)
    if basis == STEP_INCREASE:
        compared = int(grown * (1 + workspace))
    else:
        compared = est["total"]
    return {
        "estimated_peak_memory_bytes": compared,
        # what the step's own tensors hold at once, no allocator overhead: the CPU probe's
        # peak_live_bytes is measured against it
        "estimated_live_bytes": grown if basis == STEP_INCREASE else None,
        "estimated_total_bytes": est["total"],
        "estimate_basis": basis,
        "estimate_components": est,
    }


def quantized_memory(q) -> dict:
    """estimate_step_memory's arguments for a quantized base ({} for an unquantized one)."""
    if q is None:
        return {}
    return {
        "quantized_bytes_per_param": weight_bytes_per_param(q),
        "dequantize_bytes": dequantized_bytes(q),
    }


def weight_bytes_of(spec) -> int:
    """Bytes per weight of the modules that stay unquantized and are not held in 16 bits:
    the spec's dtype; fp32 for `auto` (the trainer holds only the frozen linears in 16 bits,
    `held_linear_bytes_of`) and for a quantized base (peft's k-bit preparation upcasts
    norms, embeddings and the head)."""
    if spec.model.quantization is not None or spec.model.dtype == "auto":
        return 4
    return {"float32": 4, "bfloat16": 2, "float16": 2}[spec.model.dtype]


def held_linear_bytes_of(spec, device_type: str, train: str | None = None) -> int | None:
    """2 when the trainer holds the frozen linears in 16 bits on `device_type`
    (`precision.base_dtype`), else None. `train`: the training precision already resolved
    (the pre-rental estimate's, for a GPU class this machine does not have)."""
    if train is None:
        held = base_dtype(spec, "train", device_type)
    else:
        evaluated = train if spec.eval.precision == "auto" else spec.eval.precision
        held = held_dtype(
            spec.model.dtype, "train", trained=train, evaluated=evaluated,
            quantized=spec.model.quantization is not None,
            full=spec.adapter.method == "full",
        )  # fmt: skip
    return 2 if spec.model.dtype == "auto" and held != "float32" else None


def relative_error(estimate: float, measured: float | None) -> float | None:
    return (estimate - measured) / measured if measured else None


EVAL_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def eval_estimate(
    shape: ModelShape,
    protocol: dict,
    *,
    batch_size: int,
    prompt_len: int,
    shared_prefix_len: int,
    label_tokens: list[int],
    tree: bool,
    on_cpu: bool,
    tree_tokens: int | None = None,
    pass_tokens: int | None = None,
) -> dict:
    """The memory model's figure for one evaluation batch, on the basis the probe compares it
    on: CPU the working set without the weights (against the RSS increase of the
    evaluation; the weights are resident before it starts), CUDA the total (against max
    allocated)."""
    est = estimate_eval_memory(
        shape,
        batch_size=batch_size,
        prompt_len=prompt_len,
        dtype_bytes=EVAL_DTYPE_BYTES[protocol["precision"]],
        mode=protocol["mode"],
        shared_prefix_len=shared_prefix_len,
        label_tokens=label_tokens,
        tree=tree,
        tree_tokens=tree_tokens,
        pass_tokens=pass_tokens,
        max_new_tokens=protocol.get("max_new_tokens") or 0,
        workspace_fraction=CPU_WORKSPACE_FRACTION if on_cpu else DEFAULT_WORKSPACE_FRACTION,
    )
    compared = est["total"] - est["weights"] if on_cpu else est["total"]
    out = {
        "estimated_peak_memory_bytes": compared,
        "estimate_basis": STEP_INCREASE if on_cpu else TOTAL,
        "estimate_components": est,
        "batch_size": batch_size,
        "prompt_len": prompt_len,
    }
    if protocol["mode"] == "score" and tree:
        # the label tree's logits for every prompt of the batch: what an unsure model (the
        # zero-shot base) costs; a confident adapter's best-first search stops far short
        out["estimate_case"] = "every prompt scored over the whole label tree (an unsure model)"
    return out
