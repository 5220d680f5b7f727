"""The LoRA linear's forward as a training step runs it: PEFT's arithmetic, fewer kernels.

PEFT's `lora.Linear.forward` casts the layer's input to the LoRA matrices' dtype (fp32)
before the adapter, and under bf16/fp16 autocast the adapter's first matmul casts it back:
with the frozen base held in the compute dtype (`model.dtype: auto`) every adapted linear
makes two full-size copies of its input, keeps the second for backward (7 per decoder
layer where the base keeps none), and backward casts the input gradient down and up
again. It then scales the adapter's output and adds it to the base's in two more kernels.
On a GPU a pilot's step is bound by kernel launches (bench/README.md, "On a GPU"), and the
copies are activation memory.

`fused(model)` gives each plain LoRA linear (one active adapter, no DoRA or other variant,
no LoRA bias, not merged; PEFT's linear or its 4-bit bitsandbytes one) a forward with the
same arithmetic and none of these: an input autocast would cast is cast once, for the base
and every adapter that reads it (q, k and v share one copy, gate and up one), and handed
to each reader through a view whose backward casts that reader's gradient up on its own,
so the input's gradient is summed in its own dtype as before; an input already in the
compute dtype (o's, down's) is used as it is; the scaled add is one `add(alpha=scaling)`.
A 4-bit base reads the input itself (bitsandbytes answers in its input's dtype: fp32 from
the fp32 residual stream); only its adapters share the cast. Without dropout an adapter
keeps that shared tensor for backward. With dropout each adapter masks its own input in
the LoRA matrices' dtype, as PEFT does (the same draws and rounding). In fp32, and in bf16
when the scaling is a power of two (the default alpha/r = 2), losses and gradients are
PEFT's bit for bit (tests/train/test_lora_forward.py); otherwise they differ by one
rounding of the product.

Only the gradient steps run it (the loop's steps, the compile trial, the probe, the update
audit): validation, evaluation, `verify` and exports run PEFT's own forward, so an
adapter's recorded metrics are those of the runtime that reloads it.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F

_BOUND = "_lorapilot_fused_forward"  # the module's bound fused forward, made once


# model -> its PEFT LoRA linears: walking every module costs ~2 ms a step (135M, 2,499
# modules, this CPU); the modules LoRA is attached to do not change during training
_LORA_LINEARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _lora_linear_kinds() -> dict[type, bool]:
    """PEFT's LoRA linear classes `_forward` reproduces -> whether their base may read the
    shared 16-bit cast of the input: a plain linear computes the same from it; a 4-bit
    bitsandbytes linear hands its output back in its input's dtype (fp32 from the fp32
    residual stream), so it reads the input itself."""
    try:
        from peft.tuners.lora.layer import Linear
    except ImportError:  # no peft: nothing LoRA to fuse
        return {}
    kinds = {Linear: True}
    try:
        from peft.tuners.lora.bnb import Linear4bit

        kinds[Linear4bit] = False
    except ImportError:  # no bitsandbytes
        pass
    return kinds


def _plain_lora_linears(model) -> list[torch.nn.Module]:
    """PEFT LoRA linears whose forward `_forward` reproduces (see the module docstring)."""
    linears = _LORA_LINEARS.get(model)
    if linears is None:
        kinds = _lora_linear_kinds()
        linears = _LORA_LINEARS[model] = []
        for m in model.modules():
            reads_cast = kinds.get(type(m))
            if reads_cast is not None and isinstance(m.base_layer, torch.nn.Linear):
                m.__dict__["_lorapilot_base_reads_cast"] = reads_cast
                linears.append(m)
    out = []
    for m in linears:
        if m.merged or m.disable_adapters:
            continue
        active = [a for a in m.active_adapters if a in m.lora_A]
        if len(active) != 1 or active[0] in m.lora_variant or m.lora_bias.get(active[0]):
            continue
        out.append(m)
    return out


class _SharedCast(torch.autograd.Function):
    """`copy` (x cast to the compute dtype, made once) as `n` views, one per reader of x.
    Backward casts each reader's gradient up to x's dtype and sums them there, the last
    reader's first, as autocast's cast per reader and autograd's sum at x do: x's gradient
    is summed in its own dtype as before (a shared 16-bit tensor would sum its readers'
    gradients in 16 bits). One Python call for a group of readers: a call per reader made
    the step's host time 4-13% longer than PEFT's (bench/host_overhead.py)."""

    @staticmethod
    def forward(ctx, x, copy, n):
        ctx.dtype = x.dtype
        ctx.set_materialize_grads(False)
        return tuple(copy.view_as(copy) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):
        total = None
        for g in reversed(grads):
            if g is not None:
                g = g.to(ctx.dtype)
                total = g if total is None else total + g
        return total, None, None


class _Casts:
    """The last input cast for the adapters, by identity: q, k and v (gate and up) take the
    same tensor one after the other; any other input drops it, so the cache keeps no copy
    alive past its layer (autograd keeps what backward needs)."""

    GROUP = 6  # views made at once: q, k and v's base and adapter (gate and up use 4)

    def __init__(self) -> None:
        self.x: weakref.ref | None = None
        self.copy: torch.Tensor | None = None
        self.views: list[torch.Tensor] = []

    def view_of(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """A view of x cast to `dtype` for one reader (None: x is in `dtype` already)."""
        if x.dtype == dtype:
            self.x = self.copy = None
            self.views = []
            return None
        if self.x is None or self.x() is not x or self.copy.dtype != dtype:
            self.x, self.copy, self.views = weakref.ref(x), x.detach().to(dtype), []
        if not self.views:
            self.views = list(_SharedCast.apply(x, self.copy, self.GROUP))
        return self.views.pop(0)


def describe(model, mode: str) -> dict:
    """The run record's entry: `train.lora_forward`, and how many LoRA linears ran fused."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        LoraLayer = ()  # noqa: N806
    lora = sum(isinstance(m, LoraLayer) for m in model.modules()) if LoraLayer else 0
    fused_layers = len(_plain_lora_linears(model)) if mode == "fused" else 0
    return {"mode": mode, "fused_layers": fused_layers, "lora_layers": lora}


def _forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    name = self.active_adapters[0]
    weight_a = self.lora_A[name].weight
    casting = torch.is_autocast_enabled(x.device.type)
    # adapter_names and the like, adapters disabled or merged since the region began, or an
    # input autocast will not bring to the adapter's dtype (a 16-bit base trained in fp32):
    # PEFT's own path
    if (
        args
        or kwargs
        or self.disable_adapters
        or self.merged
        or (x.dtype != weight_a.dtype and not casting)
    ):
        return type(self).forward(self, x, *args, **kwargs)
    dropout = self.lora_dropout[name]
    reads_cast = self._lorapilot_base_reads_cast
    if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0 and dropout.training:
        # as PEFT: the mask drawn on the input in the adapter's dtype, autocast then casts
        # the masked input for the matmul. PEFT's 4-bit layer casts only where CUDA's
        # autocast is off (its `torch.is_autocast_enabled()` asks about CUDA): the same here
        result = self.base_layer(x)
        up = reads_cast or not torch.is_autocast_enabled()
        h = F.linear(dropout(x.to(weight_a.dtype) if up else x), weight_a)
    else:
        base_in = None
        if casting and not torch.compiler.is_compiling():  # compiled: inductor shares casts
            dtype = torch.get_autocast_dtype(x.device.type)
            base_in = self._lorapilot_casts.view_of(x, dtype)
        if base_in is None:  # nothing to cast (or compiled): the adapter keeps x itself
            result = self.base_layer(x)
            h = F.linear(x, weight_a)
        else:  # autocast would cast x for each linear: once, for all of them
            result = self.base_layer(base_in if reads_cast else x)
            h = F.linear(self._lorapilot_casts.view_of(x, dtype) if reads_cast else base_in,
                         weight_a)  # fmt: skip
    return torch.add(result, F.linear(h, self.lora_B[name].weight), alpha=self.scaling[name])


@contextlib.contextmanager
def fused(model, mode: str = "fused") -> Iterator[int]:
    """Within, when `mode` (`train.lora_forward`) is "fused": the plain LoRA linears of
    `model` run the fused forward ("peft": PEFT's own, nothing changed). Yields how many."""
    layers = _plain_lora_linears(model) if mode == "fused" else []
    # nested (a step inside a fused region): the outer context installed them and removes them
    mine = [m for m in layers if "_lorapilot_casts" not in m.__dict__]
    casts = _Casts()
    for m in mine:
        m.__dict__["_lorapilot_casts"] = casts
        bound = m.__dict__.get(_BOUND)
        if bound is None:  # one bound method per module: torch.compile's guards see one
            bound = m.__dict__[_BOUND] = types.MethodType(_forward, m)
        m.__dict__["forward"] = bound
    try:
        yield len(layers)
    finally:
        for m in mine:
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_lorapilot_casts", None)
