"""The pre-rental time model (pure): how long a training step and an evaluation batch take on a
class of GPU that has never run this pilot, from the step's arithmetic and the class's
datasheet, scaled by constants calibrated on measured steps.

    step_s = layers x overhead_per_layer            kernel launches and Python, per decoder pass
           + flops / (peak x efficiency)            the arithmetic at the measured efficiency
           + bytes_moved / bandwidth                what is bandwidth-bound: dequantizing 4-bit
                                                    weights, casting fp32 weights to 16 bits,
                                                    the optimizer over the trainable weights

FLOPs are those of the tokens the step computes: every row whole, or with the shared prefix
once and each row's own tokens (the path `train.shared_prefix: auto` takes; a second decoder
pass costs a second round of launches). Frozen linears cost 2 (forward) + 2 (input gradient)
FLOPs per weight and token, trainable ones 2 more for their weight gradient, checkpointing a
second forward; attention 4 x context x head width per token and layer per pass; the LM head
runs only at the loss positions. The constants (`Calibration`) come from calibration.json,
fitted on the H200 rows of bench/README.md; a class never measured is an extrapolation (its
datasheet peak times the calibrated efficiency), and `budget --gpu` says so. The estimate is
a hypothesis until `lorapilot probe` measures the real step on the rented machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from lorapilot.sizing.memory import ModelShape, decoder_linear_params


@dataclass(frozen=True)
class GpuClass:
    """One row of gpus.json (or of a `--gpu-spec` file)."""

    name: str
    label: str
    memory_gib: float
    bf16_tflops: float
    bandwidth_gbs: float
    fp16_tflops: float | None = None
    vendor: str = ""
    interconnect: str = ""
    source: str = ""
    date: str = ""
    kind: str = "gpu"
    """`gpu`, or `cpu` for a CPU described the same way (the bench's row for this machine)."""

    def __post_init__(self) -> None:
        for key in ("memory_gib", "bf16_tflops", "bandwidth_gbs"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{key} must be a positive number, got {value!r}")

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s in the compute dtype: fp16 where the class states it, else bf16.
        fp32 compute has no figure here and is timed at the bf16 peak (an optimistic step
        time; `budget --gpu` says so in the variant's `note`)."""
        if precision == "fp16" and self.fp16_tflops:
            return self.fp16_tflops * 1e12
        return self.bf16_tflops * 1e12


@dataclass(frozen=True)
class Calibration:
    """The time model's constants for one kind of device, and where they come from."""

    overhead_s_per_layer: float
    """Seconds of launches and Python per decoder layer per training step (one pass)."""
    efficiency: float
    """Share of the dense peak a training step's arithmetic reaches."""
    eval_overhead_s_per_layer: float
    """Seconds of launches per decoder layer per evaluation batch."""
    eval_efficiency: float
    """Share of the dense peak an evaluation batch's arithmetic reaches."""
    checkpointing_overhead: float = 1.0
    """Launch overhead of a step with activation checkpointing, relative to one without (the
    recomputed forward and the checkpoint bookkeeping)."""
    source: str = ""


@dataclass(frozen=True)
class StepWork:
    """What one training micro-batch computes."""

    rows: int
    seq_len: int
    """Tokens per row (the micro-batch is padded to its longest row)."""
    shared_prefix: int = 0
    """Tokens computed once for every row (0: each row whole)."""
    loss_positions: int = 1
    """LM-head positions per row (the answer tokens with `loss_on: completion`)."""
    trainable_params: int = 0
    grad_checkpointing: bool = False
    full_finetune: bool = False
    weight_bytes: float = 4.0
    """Bytes per frozen decoder weight as stored (4: fp32, 2: bf16; 0.5-1 quantized)."""
    quantized: bool = False

    @property
    def tokens(self) -> int:
        """Tokens through the decoder: the prefix once, then each row's own tokens."""
        return self.shared_prefix + self.rows * (self.seq_len - self.shared_prefix)

    @property
    def passes(self) -> int:
        """Decoder passes per step: the shared prefix is a pass of its own."""
        return 2 if self.shared_prefix else 1


def train_step_flops(shape: ModelShape, w: StepWork) -> float:
    linear = decoder_linear_params(shape)
    per_weight_token = (
        4.0 + (2.0 if w.full_finetune else 0.0) + (2.0 if w.grad_checkpointing else 0.0)
    )
    flops = per_weight_token * linear * w.tokens
    flops += 6.0 * w.trainable_params * w.tokens  # LoRA's own matmuls, weight gradients included
    context = w.seq_len  # each token attends to its context: about seq_len / 2 on average
    attention = 4.0 * (context / 2) * shape.q_dim * shape.n_layers * w.tokens
    flops += attention * (3.0 if not w.grad_checkpointing else 4.0)  # forward + 2x backward
    flops += 6.0 * shape.vocab * shape.hidden * w.rows * w.loss_positions  # the LM head
    return flops


def train_step_bytes(shape: ModelShape, w: StepWork, precision: str) -> float:
    """Bytes a step moves that no matmul hides, per frozen decoder weight and decoder pass:
    forward reads it as stored, and where it is cast (fp32 under 16-bit autocast) or
    dequantized (4-bit, 8-bit) writes a 16-bit copy and reads it back; backward reads the
    16-bit copy again; checkpointing repeats the forward. Plus the optimizer's read and write
    of the trainable weights, their gradients and two moments (fp32)."""
    linear = decoder_linear_params(shape)
    converted = w.quantized or (precision in ("bf16", "fp16") and w.weight_bytes > 2)
    forward = w.weight_bytes + (2 + 2 if converted else 0)
    backward = 2 if converted else w.weight_bytes
    per_pass = forward * (2 if w.grad_checkpointing else 1) + backward
    optimizer = 2 * 4 * 4 * w.trainable_params
    return w.passes * per_pass * linear + optimizer


def step_seconds(
    gpu: GpuClass, cal: Calibration, shape: ModelShape, w: StepWork, precision: str
) -> dict:
    """Seconds of one micro-batch step, by part -> {overhead_s, compute_s, bandwidth_s, step_s,
    flops}."""
    flops = train_step_flops(shape, w)
    overhead = cal.overhead_s_per_layer * shape.n_layers * w.passes
    if w.grad_checkpointing:
        overhead *= cal.checkpointing_overhead
    compute = flops / (gpu.peak_flops(precision) * cal.efficiency)
    bandwidth = train_step_bytes(shape, w, precision) / (gpu.bandwidth_gbs * 1e9)
    return {
        "overhead_s": overhead,
        "compute_s": compute,
        "bandwidth_s": bandwidth,
        "step_s": overhead + compute + bandwidth,
        "flops": flops,
    }


def eval_batch_seconds(
    gpu: GpuClass,
    cal: Calibration,
    shape: ModelShape,
    *,
    batch: int,
    prompt_len: int,
    scored_tokens: int,
    new_tokens: int,
    precision: str,
) -> float:
    """One evaluation batch: the prompts' forward pass, the label tokens scored (classification)
    or `new_tokens` greedy decoding steps (generation, one pass of launches each)."""
    linear = decoder_linear_params(shape)
    tokens = batch * (prompt_len + scored_tokens + new_tokens)
    flops = 2.0 * linear * tokens + 2.0 * shape.vocab * shape.hidden * batch * max(1, new_tokens)
    passes = 1 + (1 if scored_tokens else 0) + new_tokens
    weights = linear * 2 * passes  # a 16-bit model read once per pass
    return (
        cal.eval_overhead_s_per_layer * shape.n_layers * passes
        + flops / (gpu.peak_flops(precision) * cal.eval_efficiency)
        + weights / (gpu.bandwidth_gbs * 1e9)
    )
