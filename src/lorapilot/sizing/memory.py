"""Analytic memory model of one training step (pure arithmetic: no torch, no I/O).

So a user can ask "what about 4096 tokens, or a 7B model?" before renting anything. It is
an *estimate*: `lorapilot probe` measures the real peak on the real machine and reports the
error of this model beside it, and the measurement is what limits are checked against.

Components, in bytes, of the peak of one micro-batch's forward + backward: what of each kind
is alive at the same moment (see `gradients` and `logits` for what is not alive at once):

- weights: the base model, `n_params x weight_dtype_bytes`; for a quantized base (bitsandbytes
  4-bit or 8-bit) its decoder linears take `quantized_bytes_per_param` each, their
  quantization state included (`quantize.weight_bytes_per_param`), the rest (embeddings,
  norms, LM head) `weight_dtype_bytes` (fp32 after peft's k-bit preparation). A base whose
  frozen linears are held in 16 bits (`model.dtype: auto`, `precision.hold_frozen`): the
  decoder linears and an untied LM head `held_linear_bytes`, the rest `weight_dtype_bytes`.
- trainable_master: the trainable parameters in fp32 when they are separate from the
  weights. peft keeps LoRA matrices in fp32 even on a bf16/fp16 base; full fine-tuning
  updates the loaded weights in place (as lorapilot's loop does), so 0 there.
- gradients: one per trainable parameter (fp32 for LoRA, the weights' dtype for full).
  Backward allocates a LoRA layer's gradients as it frees that layer's activations, so
  with one micro-batch per update (`grad_accum` 1) the peak is either when backward starts
  (every activation, no gradient yet) or when it ends (every gradient, one layer's
  activations): the larger moment is counted, its gradients only (usually none). With
  accumulation the earlier micro-batches' gradients are alive throughout: all counted.
- optimizer_states: AdamW keeps 2 tensors like each trainable parameter; SGD none.
- activations: tensors saved for backward (formula in `layer_activation_bytes`).
- logits: the LM head's output where the loss is computed, with its fp32 loss buffers.
  Under activation checkpointing they are freed before the last layer is recomputed, so
  only what exceeds one recomputed layer's activations is added.
- weight_casts: under bf16/fp16 autocast with fp32 weights, every matmul casts its weight
  to 16 bits and autograd keeps that copy for the input gradient. autocast caches casts
  only of leaf tensors that require grad, so a LoRA base's frozen weights are cast anew in
  every forward: one 16-bit copy of every decoder linear and of the LM head is alive when
  backward starts (measured with saved-tensor hooks: 255 MiB for SmolLM2-135M). Weights
  held in the compute dtype are used as they are: no copy (a tied head still is cast).
- dequantize: a quantized linear dequantizes its weight to the compute dtype for every
  matmul (forward, and again for the input gradient in backward) and frees it after; one
  largest linear's copy is counted. 0 for an unquantized base.
- workspace: a stated fraction of the rest, for allocator fragmentation, gradients of
  activations in flight during backward and kernel scratch: 10% with CUDA's caching
  allocator; for a CPU's RSS 50%, 100% with activation checkpointing (measured, see
  CPU_WORKSPACE_FRACTION). Not counted anywhere: the
  CUDA context (~0.3-1 GiB, outside `torch.cuda.max_memory_allocated`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

GIB = 1 << 30
COMPONENTS = (
    "weights",
    "trainable_master",
    "gradients",
    "optimizer_states",
    "activations",
    "logits",
    "weight_casts",
    "dequantize",
    "workspace",
)
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SHAPES = {  # module -> (input width, output width) in terms of ModelShape
    "q_proj": lambda s: (s.hidden, s.q_dim), "k_proj": lambda s: (s.hidden, s.kv_dim),
    "v_proj": lambda s: (s.hidden, s.kv_dim), "o_proj": lambda s: (s.q_dim, s.hidden),
    "gate_proj": lambda s: (s.hidden, s.intermediate),
    "up_proj": lambda s: (s.hidden, s.intermediate),
    "down_proj": lambda s: (s.intermediate, s.hidden),
}  # fmt: skip
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}
DEFAULT_WORKSPACE_FRACTION = 0.10
# CPU: the peak RSS increase of a step was 1.30-1.92x (median 1.48x) the live bytes this
# model counts (saved tensors, weight casts, gradients, optimizer states, logits), over six
# configurations of SmolLM2-135M + LoRA (micro-batch 2-16, 100-174 tokens, checkpointing
# off/on; bench/README.md). glibc keeps freed activation and gradient blocks in its heaps
# instead of returning them, so RSS exceeds what is live; 0.5 is that measured overhead.
CPU_WORKSPACE_FRACTION = 0.50
# With activation checkpointing every layer is recomputed and freed again during backward,
# and the heap churn is larger: 1.9-2.3x the live bytes in the probe's measurements of the
# default model (eager attention, 100 and 174 tokens x 8), hence 1.0.
CPU_WORKSPACE_FRACTION_CHECKPOINTING = 1.0

Precision = Literal["fp32", "bf16", "fp16"]
Attention = Literal["sdpa", "flash", "eager"]


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-style decoder (Llama, Mistral, Qwen2, SmolLM, ...)."""

    n_params: int
    """Base parameters (embeddings and LM head included; a tied head counted once)."""
    n_layers: int
    hidden: int
    intermediate: int
    """Width of the gated MLP (gate/up output, down input)."""
    n_heads: int
    n_kv_heads: int
    """Key/value heads: fewer than n_heads under grouped-query attention."""
    vocab: int
    tied_embeddings: bool
    head_dim: int | None = None
    """Per-head width; None means hidden // n_heads (set in __post_init__)."""

    def __post_init__(self) -> None:
        for name in (
            "n_params",
            "n_layers",
            "hidden",
            "intermediate",
            "n_heads",
            "n_kv_heads",
            "vocab",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelShape.{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)

    @property
    def q_dim(self) -> int:
        return self.n_heads * (self.head_dim or 0)

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * (self.head_dim or 0)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], n_params: int | None = None) -> ModelShape:
        """From a Hugging Face config.json mapping; n_params counted from the shape if not given.

        A multimodal config's `text_config` is used when the top level has no decoder keys.
        """
        if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
            cfg = cfg["text_config"]

        def need(key: str) -> int:
            if key not in cfg:
                raise ValueError(f"config has no {key!r}: not a Llama-style decoder config")
            return cfg[key]

        heads = need("num_attention_heads")
        shape = dict(
            n_layers=need("num_hidden_layers"),
            hidden=need("hidden_size"),
            intermediate=need("intermediate_size"),
            n_heads=heads,
            n_kv_heads=cfg.get("num_key_value_heads") or heads,
            vocab=need("vocab_size"),
            # LlamaConfig's default; SmolLM2 and other small models set it to true
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            head_dim=cfg.get("head_dim"),
        )
        if n_params is None:
            n_params = llama_param_count(**shape)
        return cls(n_params=n_params, **shape)


def llama_param_count(
    *,
    n_layers: int,
    hidden: int,
    intermediate: int,
    n_heads: int,
    n_kv_heads: int,
    vocab: int,
    tied_embeddings: bool,
    head_dim: int | None = None,
) -> int:
    """Parameters of a Llama-style decoder: embeddings, per layer q/k/v/o + gated MLP + 2
    RMSNorms, a final norm, and the LM head unless tied. Biases are ignored (<0.1%)."""
    head_dim = head_dim or hidden // n_heads
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    attention = hidden * q + 2 * hidden * kv + q * hidden
    mlp = 3 * hidden * intermediate
    layer = attention + mlp + 2 * hidden
    embed = vocab * hidden
    return embed + n_layers * layer + hidden + (0 if tied_embeddings else embed)


# --------------------------------------------------------------------------- activations


def _module_inputs(shape: ModelShape) -> dict[str, int]:
    """Input width of each adaptable linear."""
    h, i = shape.hidden, shape.intermediate
    return {
        "q_proj": h, "k_proj": h, "v_proj": h, "o_proj": shape.q_dim,
        "gate_proj": h, "up_proj": h, "down_proj": i,
    }  # fmt: skip


def _module_outputs(shape: ModelShape) -> dict[str, int]:
    """Output width of each adaptable linear."""
    h, i, q, kv = shape.hidden, shape.intermediate, shape.q_dim, shape.kv_dim
    return {
        "q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": h,
        "gate_proj": i, "up_proj": i, "down_proj": h,
    }  # fmt: skip


def _adapted(modules: str | Sequence[str]) -> list[str]:
    """'all-linear' -> every decoder linear (peft leaves the LM head out); else the known
    names among `modules`, matched on the last dotted part (others are not modelled)."""
    if modules == "all-linear":
        return list(LINEAR_MODULES)
    names = {str(m).rsplit(".", 1)[-1] for m in modules}
    return [m for m in LINEAR_MODULES if m in names]


def residual_bytes(weight_dtype_bytes: float) -> int:
    """Bytes of the residual stream: fp32 weights keep it fp32 even under autocast (fp32 +
    bf16 adds to fp32); 16-bit and quantized models carry it in 16 bits."""
    return 4 if weight_dtype_bytes >= 4 else 2


def compute_bytes(precision: Precision, weight_dtype_bytes: float) -> int:
    """Bytes of a matmul output: the autocast dtype, else the weights' dtype (4-bit and 8-bit
    weights compute in a 16-bit dtype)."""
    if precision in ("bf16", "fp16"):
        return 2
    if precision != "fp32":
        raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
    return 4 if weight_dtype_bytes >= 4 else 2


def layer_activation_bytes(
    shape: ModelShape,
    *,
    micro_batch: int,
    seq_len: int,
    precision: Precision,
    weight_dtype_bytes: float,
    attention: Attention = "sdpa",
    adapter: Literal["lora", "full"] = "lora",
    adapted_modules: str | Sequence[str] = "all-linear",
    lora_rank: int = 16,
    lora_dropout: float = 0.0,
    dropout_mask_bytes: float = 1.0,
    quantized: bool = False,
    lora_forward: str = "fused",
    dora: bool = False,
) -> dict[str, int]:
    """Bytes one decoder layer saves for backward, by part (and "total").

    Method of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models" (arXiv:2205.05198), who count every tensor autograd saves: for a
    GPT layer in fp16 with dropout, a 4h MLP and eager attention, sbh(34 + 5as/h) bytes (s
    tokens, b batch, h hidden, a heads), the 5as/h term being the attention probabilities
    and their dropout; sdpa/flash kernels recompute the probabilities in backward and
    remove it. The same count redone for a Llama-style layer as transformers + peft run
    it, per token, with p the compute dtype's bytes, i the MLP width, kv the key/value
    width, r the LoRA rank:

    - norms: 2 x 4h (each RMSNorm saves its input upcast to fp32);
    - attention, sdpa/flash: p(h + 2kv) for q, k, v, p h for the output, 4a for the fp32
      log-sum-exp; no `s` term. Under SDPA, transformers repeats k and v to every head
      (`repeat_kv`) whenever it passes an attention mask (padded rows; the shared prefix's
      rows), so SDPA keeps them at the query width: p(h + 2h) instead, as counted here (a
      micro-batch of rows of different lengths has a mask; `kv_saved_width`); flash
      attention takes grouped k and v as they are. Eager: 3p h for q and k, v repeated to
      every head, plus
      the probabilities, a s x (4 bytes of fp32 softmax + p for their cast; 4 under fp32);
    - mlp: 3p i (SiLU input, SiLU output, up output); on a `quantized` base 3 x residual
      bytes x i: a bitsandbytes linear computes in its compute dtype but hands its output
      back in its input's dtype, the residual stream's (fp32 when the modules it does not
      quantize are fp32: on the default model in NF4 the three are fp32, 422 MiB saved by
      a forward of 8 x 100 tokens against 385 MiB of bf16 ones unquantized);
    - adapter, LoRA (matrices in fp32, so the adapter computes in p under autocast, else
      in 4 bytes): its rank-r output, and the input its first matmul keeps, d_in bytes-of-
      adapter. Without dropout, one such tensor per distinct input (q, k and v share one,
      gate and up one; o's is attention's output, kept already under sdpa) when nothing is
      cast (fp32 weights, no autocast) or under `lora_forward` "fused" (train/lora_forward.py:
      the input cast once for all its readers, 4-bit bases included); with PEFT's forward
      under autocast each adapted linear keeps its own cast copy. With dropout each keeps
      its own masked input and a mask of dropout_mask_bytes x d_in (1 on CUDA; CPUs save a
      float mask of the fp32 input: pass 4). DoRA (`dora`): PEFT's forward (the fused
      one leaves DoRA layers alone), and per adapted linear its base output and its LoRA
      output, d_out bytes-of-adapter each, kept to scale them by the magnitude (the weight
      norm is detached; on the default model 0.33 GiB more for 8 x 65 tokens, 0.37 GiB
      counted; 0.58 for 8 x 92, 0.52 counted). Full fine-tuning:
      the two norm outputs for the norms' weight gradients and each linear's input (one
      per distinct input; one per linear when autocast casts fp32 activations).

    Checked against the tensors autograd saves in a 1-layer model (CPU, torch 2.13,
    transformers 5.23, peft 0.21): within 0.5% for LoRA and full fine-tuning, fp32 and bf16,
    sdpa and eager.
    """
    if micro_batch <= 0 or seq_len <= 0:
        raise ValueError("micro_batch and seq_len must be positive")
    p = compute_bytes(precision, weight_dtype_bytes)
    autocast = precision in ("bf16", "fp16")
    residual = residual_bytes(weight_dtype_bytes)
    h, i, a = shape.hidden, shape.intermediate, shape.n_heads
    tokens = micro_batch * seq_len
    parts: dict[str, float] = {"norms": 2 * 4 * h}
    if attention in ("sdpa", "flash"):
        kv = kv_saved_width(shape, attention)
        parts["attention"] = p * (shape.q_dim + 2 * kv) + p * shape.q_dim + 4 * a
    elif attention == "eager":
        prob_bytes = 4 + (p if p < 4 else 0)
        parts["attention"] = p * 3 * shape.q_dim + prob_bytes * a * seq_len
    else:
        raise ValueError(f"attention must be sdpa, flash or eager, got {attention!r}")
    parts["mlp"] = 3 * (residual if quantized else p) * i
    widths = _module_inputs(shape)
    if adapter == "lora":
        ad = p if autocast else 4  # the adapter's compute bytes
        adapted = _adapted(adapted_modules)
        fused = lora_forward == "fused" and not dora and (autocast or weight_dtype_bytes >= 4)
        if lora_dropout > 0:
            inputs = sum((ad + dropout_mask_bytes) * widths[m] for m in adapted)
        elif (autocast or weight_dtype_bytes < 4) and not fused:  # each casts its own copy
            inputs = sum(ad * widths[m] for m in adapted)
        else:  # one tensor per distinct input (o's input is sdpa's output)
            groups = [("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("down_proj",)]
            if attention == "eager":
                groups.append(("o_proj",))
            inputs = sum(ad * widths[g[0]] for g in groups if any(m in adapted for m in g))
        parts["adapter"] = inputs + len(adapted) * ad * lora_rank
        if dora:
            outputs = _module_outputs(shape)
            parts["adapter"] += sum(2 * ad * outputs[m] for m in adapted)
    elif adapter == "full":
        norm_outputs = 2 * residual * h
        if autocast and weight_dtype_bytes >= 4:  # each linear casts the fp32 input itself
            inputs = 5 * p * h
        else:
            inputs = 2 * residual * h
        inputs += p * i + (p * shape.q_dim if attention == "eager" else 0)
        parts["adapter"] = norm_outputs + inputs
    else:
        raise ValueError(f"adapter must be lora or full, got {adapter!r}")
    out = {k: int(math.ceil(v * tokens)) for k, v in parts.items()}
    out["total"] = sum(out.values())
    return out


def kv_saved_width(shape: ModelShape, attention: Attention) -> int:
    """The width of the keys and values attention keeps for backward: grouped (kv) for flash
    attention, repeated to every head (q) for eager attention and for SDPA under a mask
    (measured on the 77-label pilot, 596 tokens x 8, SDPA: two (8, 9, 596, 64) bf16 tensors
    a layer, 330 MB of the step's 1.14 GB live, where the grouped width counted a third)."""
    return shape.kv_dim if attention == "flash" else shape.q_dim


def decoder_linear_params(shape: ModelShape) -> int:
    """Weights of every decoder layer's linears (q, k, v, o, gate, up, down)."""
    attention = 2 * shape.hidden * shape.q_dim + 2 * shape.hidden * shape.kv_dim
    return shape.n_layers * (attention + 3 * shape.hidden * shape.intermediate)


def weight_cast_bytes(
    shape: ModelShape,
    *,
    precision: Precision,
    weight_dtype_bytes: float,
    grad_checkpointing: bool,
    trainable_params: int = 0,
    quantized: bool = False,
    decoder_passes: int = 1,
    held: bool = False,
) -> int:
    """16-bit copies of fp32 weights that autocast makes and autograd keeps for backward.

    Only when fp32 weights meet bf16/fp16 autocast (16-bit or quantized weights are used
    as they are). Without checkpointing, every decoder linear's copy, the LM head's and the
    adapter's are alive when backward starts; with it, a layer's copies live only while
    that layer is recomputed, so one layer's worth plus the head's.

    `decoder_passes`: the shared-prefix path runs the decoder twice (the prefix, then the
    rows) and autocast casts the frozen weights anew in each pass, so without checkpointing
    two copies of every decoder linear are kept (the adapter's casts are cached: leaves that
    require grad; the head runs once). Measured with saved-tensor hooks on a tiny Llama and
    seen on an H200 as the probe's -13% before this term (bench/README.md).

    `held`: the frozen linears (and an untied head) are held in the compute dtype: only the
    adapter's casts and a tied head's (the fp32 embedding matrix) remain.
    """
    cast = _cast_params(shape, precision, weight_dtype_bytes, quantized, held)
    if cast is None:
        return 0
    linears, head = cast
    if grad_checkpointing:
        return 2 * ((linears + trainable_params) // shape.n_layers + head)
    return 2 * (linears * max(1, decoder_passes) + head + trainable_params)


def checkpointed_cast_moments(
    shape: ModelShape,
    *,
    precision: Precision,
    weight_dtype_bytes: float,
    trainable_params: int = 0,
    quantized: bool = False,
    held: bool = False,
) -> tuple[int, int]:
    """Under checkpointing, the 16-bit weight copies alive at the two moments a step can peak:
    (at the forward's end, while a layer is recomputed in backward). At the forward's end the
    head's copy and every adapter copy (autocast caches the casts of leaves that require
    grad for the whole forward); during a recompute, that layer's frozen linears' and
    adapter's copies. Measured on SmolLM2-135M with the profiler's allocation tree: 56.6 MB of
    tied-head copy and 9.8 MB of adapter copies at the forward's end (bench/README.md)."""
    cast = _cast_params(shape, precision, weight_dtype_bytes, quantized, held)
    if cast is None:
        return 0, 0
    linears, head = cast
    return 2 * (head + trainable_params), 2 * ((linears + trainable_params) // shape.n_layers)


def _cast_params(
    shape: ModelShape, precision: Precision, weight_dtype_bytes: float, quantized: bool, held: bool
) -> tuple[int, int] | None:
    """(frozen decoder-linear parameters, head parameters) that autocast copies to 16 bits,
    or None when nothing is cast (fp32 compute, or weights already 16-bit or narrower)."""
    if precision not in ("bf16", "fp16") or weight_dtype_bytes < 4:
        return None
    # A quantized base's linears dequantize themselves (component `dequantize`): no cast.
    linears = 0 if quantized or held else decoder_linear_params(shape)
    head = 0 if held and not shape.tied_embeddings else shape.vocab * shape.hidden
    return linears, head


# --------------------------------------------------------------------------- one step


def estimate_step_memory(
    shape: ModelShape,
    *,
    trainable_params: int,
    weight_dtype_bytes: float,
    micro_batch: int,
    seq_len: int,
    precision: Precision,
    grad_checkpointing: bool,
    optimizer: str = "adamw",
    loss_positions_per_example: int | None = None,
    attention: Attention = "sdpa",
    adapter: Literal["lora", "full"] = "lora",
    adapted_modules: str | Sequence[str] = "all-linear",
    lora_rank: int = 16,
    lora_dropout: float = 0.0,
    dropout_mask_bytes: float = 1.0,
    lora_forward: str = "fused",
    dora: bool = False,
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
    quantized_bytes_per_param: float | None = None,
    dequantize_bytes: int = 2,
    shared_prefix_tokens: int = 0,
    grad_accum: int = 1,
    held_linear_bytes: float | None = None,
) -> dict[str, int]:
    """Estimated peak bytes of one micro-batch step, by component (COMPONENTS) and "total".

    `held_linear_bytes` (2): the frozen decoder linears and an untied LM head are held in
    the 16-bit compute dtype, the rest in `weight_dtype_bytes` (`precision.hold_frozen`).
    Activations are those of the fp32 base under autocast (the residual stream stays fp32).

    `shared_prefix_tokens` > 0: the shared-prefix path (train/loss.py), where the rows'
    common prefix runs once and each row only its own tokens: a layer saves activations
    for n + micro_batch x (seq_len - n) tokens (per-token bytes as in the unshared step:
    exact for sdpa, approximate for eager attention's probabilities), plus, per row, the keys
    and values of the prefix, which the rows' attention concatenates with their own; under
    checkpointing every layer also keeps the prefix's keys (in the residual stream's dtype,
    as RoPE leaves them) and values (once) for the rows.
    `grad_accum`: micro-batches per optimizer update (the probe measures 1).

    An estimate, to be compared with the probe's measurement (the probe reports the
    error). Activations: every layer's saved tensors (`layer_activation_bytes`) plus the
    final norm's fp32 input; with gradient checkpointing only each layer's input is kept
    (in the residual stream's dtype: fp32 when the weights are fp32, even under autocast)
    plus one layer's activations while it is recomputed. Logits: the head's output at the
    loss positions (`loss_positions_per_example`; None = every position: full logits),
    costed at its backward peak: 3 x 4 bytes per logit, the fp32 log-probabilities kept for
    backward plus, in log_softmax's backward, the fp32 gradients of its output and its
    input (the head's 16-bit output is freed by then).
    """
    if trainable_params < 0 or weight_dtype_bytes <= 0:
        raise ValueError("trainable_params must be >= 0 and weight_dtype_bytes > 0")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    if not 0 <= workspace_fraction <= 4:  # CPU heaps measured up to ~1x the live bytes
        raise ValueError("workspace_fraction must be in [0, 4]")
    if loss_positions_per_example is not None and loss_positions_per_example <= 0:
        raise ValueError("loss_positions_per_example must be positive (None = every position)")
    tokens = micro_batch * seq_len
    n_prefix = min(max(shared_prefix_tokens, 0), seq_len)
    computed = tokens - (micro_batch - 1) * n_prefix  # the prefix once, every row's rest
    layer = layer_activation_bytes(
        shape,
        micro_batch=micro_batch,
        seq_len=seq_len,
        precision=precision,
        weight_dtype_bytes=weight_dtype_bytes,
        attention=attention,
        adapter=adapter,
        adapted_modules=adapted_modules,
        lora_rank=lora_rank,
        lora_dropout=lora_dropout,
        dropout_mask_bytes=dropout_mask_bytes,
        quantized=quantized_bytes_per_param is not None,
        lora_forward=lora_forward,
        dora=dora,
    )["total"]
    # one token's keys and values in one layer, in the compute dtype: as the rows' attention
    # keeps them (repeated to every head but under flash), and as the prefix pass captured them
    p = compute_bytes(precision, weight_dtype_bytes)
    prefix_kv = p * 2 * kv_saved_width(shape, attention)
    if computed < tokens:
        layer = math.ceil(layer * computed / tokens + prefix_kv * (tokens - computed))
    final_norm = 4 * shape.hidden * computed
    if grad_checkpointing:
        kept = shape.n_layers * residual_bytes(weight_dtype_bytes) * shape.hidden * computed
        if computed < tokens:  # and every layer's prefix keys and values, which the rows read:
            # the keys after RoPE, whose cos and sin are in the residual stream's dtype
            # (fp32 over fp32 embeddings: measured), the values in the compute dtype
            key_bytes = residual_bytes(weight_dtype_bytes)
            kept += shape.n_layers * (key_bytes + p) * shape.kv_dim * n_prefix
        activations = kept + layer + final_norm
    else:
        activations = shape.n_layers * layer + final_norm

    positions = min(loss_positions_per_example or seq_len, seq_len)
    logits = micro_batch * positions * shape.vocab * 3 * 4
    quantized = quantized_bytes_per_param is not None
    held = held_linear_bytes is not None and not quantized and adapter == "lora"
    casts = weight_cast_bytes(
        shape, precision=precision, weight_dtype_bytes=weight_dtype_bytes,
        grad_checkpointing=grad_checkpointing, trainable_params=trainable_params,
        quantized=quantized, decoder_passes=2 if computed < tokens else 1, held=held,
    )  # fmt: skip
    weights = shape.n_params * weight_dtype_bytes
    dequantize = 0
    if held:
        head = 0 if shape.tied_embeddings else shape.vocab * shape.hidden
        weights += (decoder_linear_params(shape) + head) * (held_linear_bytes - weight_dtype_bytes)
    if quantized:
        linears = decoder_linear_params(shape)
        weights += linears * (quantized_bytes_per_param - weight_dtype_bytes)
        largest = shape.hidden * max(shape.intermediate, shape.q_dim, shape.kv_dim)
        dequantize = largest * dequantize_bytes

    if adapter == "lora":  # peft keeps the adapter in fp32, beside the base weights
        master, state_bytes = 4 * trainable_params, 4
    else:  # full: the loaded weights are the trainable parameters, updated in place
        master, state_bytes = 0, max(2, math.ceil(weight_dtype_bytes))
    gradients = state_bytes * trainable_params
    if adapter == "lora" and grad_accum == 1:
        if grad_checkpointing:  # the forward's end (the head, its logits and weight copy) or
            # a layer's recompute in backward, whichever holds more: they never coexist
            at_head, in_layer = checkpointed_cast_moments(
                shape, precision=precision, weight_dtype_bytes=weight_dtype_bytes,
                trainable_params=trainable_params, quantized=quantized, held=held,
            )  # fmt: skip
            if logits + at_head > layer + in_layer:
                activations, casts = activations - layer, at_head
            else:
                logits, casts = 0, in_layer
        start = activations + logits  # backward starts: no gradient allocated yet
        end = layer + gradients  # backward ends: every gradient, one layer's activations
        if end > start:
            activations, logits = layer, 0
        else:
            gradients = 0
    out = {
        "weights": int(math.ceil(weights)),
        "trainable_master": master,
        "gradients": gradients,
        "optimizer_states": OPTIMIZER_STATES[optimizer] * state_bytes * trainable_params,
        "activations": activations,
        "logits": logits,
        "weight_casts": casts,
        "dequantize": dequantize,
    }
    out["workspace"] = int(workspace_fraction * sum(out.values()))
    out["total"] = sum(out[k] for k in COMPONENTS)
    return out


EVAL_COMPONENTS = ("weights", "kv_cache", "logits", "activations", "masks", "workspace")
# The components held in tensors the evaluation allocates (the weights are there before it,
# the workspace is the allocator's): what a CPU's live-tensor peak is compared with.
EVAL_LIVE_COMPONENTS = ("kv_cache", "logits", "activations", "masks")


def estimate_eval_memory(
    shape: ModelShape,
    *,
    batch_size: int,
    prompt_len: int,
    dtype_bytes: int,
    mode: Literal["score", "generate"],
    shared_prefix_len: int = 0,
    label_tokens: Sequence[int] = (1,),
    tree: bool = True,
    tree_tokens: int | None = None,
    pass_tokens: int | None = None,
    max_new_tokens: int = 0,
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
) -> dict[str, int]:
    """Estimated peak bytes of one evaluation batch (`evaluate.predict`), by component
    (EVAL_COMPONENTS) and "total". No gradients: the peak is the KV cache of the batch plus
    the largest transient of one forward pass.

    - weights: the whole model in the protocol's dtype (evaluation casts it once);
    - kv_cache: keys and values of every layer for each row's context: the prompt (the shared
      prefix is copied into every row's cache) plus, when scoring, the labels' continuation
      packed side by side (`tree`: `tree_tokens` per row, the label trie's nodes with
      children; default sum of label lengths - 1, the count without shared beginnings) or,
      without 4D masks, the cache repeated once per label; when generating, max_new_tokens
      more;
    - logits: the head's output where it is read, in the model dtype plus its fp32 copy and
      fp32 log-probabilities: the prompt's last position; for the packed label tree every
      row's `tree_tokens` x vocab in the model dtype, the fp32 copies one row at a time (the
      figure that grows with the number of labels); for a best-first search also its widest
      pass (`pass_tokens`, `predict.widest_search_pass`) with both fp32 copies; either beside
      the first token's fp32 log-probabilities, which the search keeps throughout;
    - activations: one layer's transient while the prompt's own tokens pass (hidden states,
      then the gated MLP's three intermediate tensors or the attention scores over the
      context, whichever is larger);
    - masks: the tree's 4D attention mask (bool);
    - workspace: a fraction of the rest (allocator, freed blocks).
    """
    if min(batch_size, prompt_len, dtype_bytes) <= 0 or not label_tokens:
        raise ValueError("batch_size, prompt_len, dtype_bytes must be positive; labels given")
    own = max(1, prompt_len - shared_prefix_len)
    b, v = batch_size, shape.vocab
    per_token_kv = shape.n_layers * 2 * shape.kv_dim * dtype_bytes
    head_bytes = dtype_bytes + 4 + 4  # model-dtype logits, .float(), log_softmax
    last_logits = b * v * head_bytes
    masks = 0
    if mode == "score":
        extra = sum(max(0, n - 1) for n in label_tokens) if tree_tokens is None else tree_tokens
        if tree:
            wide = extra if pass_tokens is None else min(pass_tokens, extra)
            kv = b * (prompt_len + extra) * per_token_kv
            # the packed tree (every label, or the prompts a best-first search hands over):
            # the batch's logits in the model dtype, log-probabilities one prompt at a time
            packed = b * extra * v * dtype_bytes + extra * v * 8
            passes = b * wide * v * head_bytes if pass_tokens is not None else 0
            # beside the first token's fp32 log-probabilities, which the search keeps
            logits = max(last_logits, b * v * 4 + max(packed, passes))
            masks = b * wide * (prompt_len + extra)
        else:
            longest = max(label_tokens) - 1
            rows = b * len(label_tokens)
            kv = rows * (prompt_len + longest) * per_token_kv
            logits = max(last_logits, rows * longest * v * head_bytes)
    else:
        kv = b * (prompt_len + max_new_tokens) * per_token_kv
        logits = last_logits
    tokens = b * own
    # within a layer the attention's scores and the MLP's intermediates come one after the
    # other: the larger of the two beside the hidden states (measured on ticket-triage's
    # widest batch: the peak is in the last layer's MLP)
    activations = tokens * 4 * shape.hidden * dtype_bytes + max(
        tokens * 3 * shape.intermediate * dtype_bytes,
        b * shape.n_heads * own * prompt_len * dtype_bytes,  # attention scores
    )
    out = {
        "weights": shape.n_params * dtype_bytes,
        "kv_cache": kv,
        "logits": logits,
        "activations": activations,
        "masks": masks,
    }
    out["workspace"] = int(workspace_fraction * sum(v for k, v in out.items() if k != "weights"))
    out["total"] = sum(out[k] for k in EVAL_COMPONENTS)
    return out


def to_gib(n_bytes: float) -> float:
    """Bytes -> GiB (2^30 bytes: the unit GPU memory sizes are quoted in)."""
    return n_bytes / GIB
