"""The recipe: the adapter (LoRA rank, alpha, targets) and training (steps, batch,
learning rate, precision, checkpointing, the shared prefix, distribution)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from lorapilot.spec.common import AutoOnOff, OnOff, _Strict


class AdapterSpec(_Strict):
    """The adapter put on the base: LoRA (rank, alpha, dropout, target modules) or full."""

    method: Literal["lora", "full"] = Field(
        "lora", description="lora: a LoRA adapter on the frozen base; full: every weight trains."
    )
    r: int = Field(16, gt=0, description="LoRA rank: must be a positive integer.")
    alpha: float = Field(32, gt=0, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout on the adapter input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt, or `all-linear`."
    )
    modules_to_save: list[str] = Field(default_factory=list, description="Extra trained modules.")
    rslora: bool = Field(
        False,
        description="Rank-stabilised LoRA (Kalajdzievski 2023; PEFT use_rslora): scale = alpha / "
        "sqrt(r), so ranks compared as variants learn at comparable rates.",
    )
    dora: bool = Field(
        False,
        description="DoRA (Liu et al. 2024; PEFT use_dora): each adapted weight split into a "
        "trained magnitude per output and a LoRA-updated direction. Slower, more memory (the "
        "weight's norm is recomputed every forward); no GGUF LoRA form (export merged).",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {"rslora": (False,), "dora": (False,)}

    @model_validator(mode="after")
    def _lora_options(self) -> AdapterSpec:
        on = [k for k in ("rslora", "dora") if getattr(self, k)]
        if on and self.method != "lora":
            raise ValueError(f"{on[0]} is an option of a LoRA adapter (method: lora)")
        return self


class EarlyStoppingSpec(_Strict):
    """Stop when the validation loss has stopped improving, and keep the best weights."""

    patience: int = Field(
        ...,
        gt=0,
        le=1000,
        description="Validation points (one every train.eval_every steps) in a row without a "
        "better validation loss before training stops.",
    )
    min_delta: float = Field(
        0.0,
        ge=0,
        description="How much lower than the best so far a validation loss must be to count "
        "as better (in loss units per target token).",
    )
    restore_best: bool = Field(
        True,
        description="true: the saved adapter is the weights of the validation point with the "
        "lowest loss (kept under checkpoints/best-step-N), not the last step's; false: the "
        "last step's, training only stops early.",
    )


class TrainSpec(_Strict):
    """The training recipe: duration, optimizer, batch, precision, checkpoints."""

    seed: int = Field(0, description="Seed of initialisation, data order and dropout.")
    epochs: float = Field(
        2,
        gt=0,
        le=1000,
        description="Passes over train (ignored if max_steps is set); at most 1000.",
    )
    max_steps: int | None = Field(
        None, gt=0, le=10_000_000, description="Optimizer steps; overrides epochs."
    )
    lr: float = Field(2e-4, gt=0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        "cosine", description="Learning-rate schedule after the warm-up."
    )
    warmup_ratio: float = Field(
        0.05, ge=0, lt=1, description="Share of the steps spent warming the learning rate up."
    )
    micro_batch: int = Field(8, gt=0, description="Examples per forward/backward.")
    category_sampling: Literal["natural", "sqrt", "balanced"] = Field(
        "natural",
        description="Which training examples an epoch takes. natural: each once. balanced: as "
        "many draws with replacement, each with probability 1/count of its category (the "
        "label; a multi-label example's rarest label; data.category), so every category is "
        "drawn equally often; sqrt: 1/sqrt(count), between the two. The run record's "
        "train.sampling shows each category's draws per epoch.",
    )
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step.")
    grad_checkpointing: bool = Field(
        False, description="Activation checkpointing: less memory, about a third more compute."
    )
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast precision; auto: bf16 on a GPU with bf16 (else fp16) and on CPUs "
        "with AMX/AVX512-BF16, fp32 on other CPUs (bf16 is emulated there).",
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Gradient norm clipping; null: no clipping."
    )
    loss_on: Literal["completion", "all"] = Field(
        "completion", description="Which tokens carry the loss: the answer only, or all."
    )
    eval_every: int | None = Field(None, gt=0, description="Validation every N steps.")
    early_stopping: EarlyStoppingSpec | None = Field(
        None,
        description="Stop once the validation loss (every train.eval_every steps) has not "
        "improved for `patience` points, and save the best point's weights as the adapter "
        "(docs/training.md). null: train every step of epochs / max_steps.",
    )
    save_every: int | None = Field(None, gt=0, description="Checkpoint every N steps.")
    distributed: Literal["none", "ddp", "fsdp"] = Field(
        "none",
        description="Under torchrun or accelerate launch: fsdp shards the weights over the "
        "processes (FSDP2); none or ddp: DDP. One process ignores it (docs/distributed.md).",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch's intra-op CPU threads (default: the cores this process may use, "
        "or OMP_NUM_THREADS); recorded in each run's environment.",
    )
    shared_prefix: AutoOnOff = Field(
        "auto",
        description="on: the prompt prefix the rows of a micro-batch share (chat header, "
        "system prompt) runs once per micro-batch, forward and backward (same loss and "
        "gradients); off: every row computes it; auto: on on a CPU, and on a GPU only for "
        "micro-batches where it saves enough work to pay for its second decoder pass "
        "(measured: bench/README.md). One process, DDP or FSDP, with or without activation "
        "checkpointing; the run record says which path ran and why.",
    )

    compile: OnOff = Field(
        "off",
        description="on: torch.compile the decoder for training (fewer kernel launches and "
        "less Python per step on a GPU); tried on the first micro-batch, forward and "
        "backward, and left eager with the reason in the run record if it fails. Off by "
        "default until measured faster (bench/gpu_shapes.py --compile); the same loss and "
        "gradients as eager within float rounding (tests/train/test_compiled.py).",
    )

    compile_mode: Literal["default", "reduce-overhead"] = Field(
        "default",
        description="With compile: on. reduce-overhead: torch.compile's CUDA-graph mode, which "
        "replays a step's kernels without launching each from Python; shapes must repeat, so "
        "micro-batches are padded to train.pad_to_multiple_of tokens (64 unless set). On a "
        "CPU there are no CUDA graphs: the decoder is compiled as in default, unpadded, and "
        "the run record says so.",
    )
    pad_to_multiple_of: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Right-pad every training and validation micro-batch to a multiple of "
        "this many tokens (padding carries no loss and no attention; the padding it adds "
        "shows in the steps' padding_efficiency). null: to the longest example; 64 under "
        "compile_mode: reduce-overhead on a GPU.",
    )
    lora_forward: Literal["fused", "peft"] = Field(
        "fused",
        description="How a training step runs each plain LoRA linear. fused: PEFT's "
        "arithmetic without its input casts (the input cast to the compute dtype once for "
        "the base and every adapter that reads it, not copied per adapter; the scaled add in "
        "one kernel): less activation memory and fewer kernels, the same losses and "
        "gradients (bit for bit in fp32, and in bf16 when alpha/r is a power of two). peft: "
        "PEFT's own forward. Validation, evaluation and exports always run PEFT's.",
    )

    _omitted_at: ClassVar[dict[str, tuple]] = {
        "shared_prefix": ("auto",),  # same gradients
        "lora_forward": ("fused",),
        "compile": ("off",),  # the default: specs from before it keep their hash
        "compile_mode": ("default",),
        "pad_to_multiple_of": (None,),
        "early_stopping": (None,),
        "category_sampling": ("natural",),
    }

    @model_validator(mode="after")
    def _early_stopping_needs_validation(self) -> TrainSpec:
        if self.early_stopping is not None and not self.eval_every:
            raise ValueError(
                "early_stopping needs validation points: set train.eval_every (e.g. a tenth "
                "of the run's steps), or drop train.early_stopping"
            )
        return self

    @model_validator(mode="after")
    def _mode_needs_compile(self) -> TrainSpec:
        if self.compile_mode != "default" and self.compile != "on":
            raise ValueError(
                f"compile_mode: {self.compile_mode} needs compile: on (set train.compile: on, "
                "or drop train.compile_mode)"
            )
        return self
