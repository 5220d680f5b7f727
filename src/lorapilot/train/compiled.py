"""`train.compile: on`: the decoder's forward under torch.compile, tried once, else eager.

On a GPU a LoRA step of a 1-8B model at the pilots' micro-batches is bound by kernel
launches and Python (bench/README.md, "On a GPU"): ~220 LoRA layers, each a handful of small
kernels per pass. torch.compile fuses them and removes the per-module Python. It is opt-in
until measured (bench/gpu_shapes.py --compile): a compiled path that is not faster only
costs its compile time.

Only the decoder is compiled (`loss._decoder_and_head`): both loss paths call it (the
shared-prefix path twice, with a cache) and keep the head and the loss at the answer
positions in eager code. Shapes vary with every micro-batch, so it is compiled with dynamic
shapes. The trial runs one forward and backward of the first micro-batch as a step runs it
(training mode, the step's attention and autocast: dynamo guards on each, and another would
compile again), with the RNG forked and the gradients dropped after it, so that training is
the eager training's step for step; a failure (no compiler, an unsupported op, a graph the
backend refuses) restores the eager forward and the reason goes in the run record.
Inductor draws random numbers with torch's own generator (`fallback_random`): LoRA dropout
then masks exactly as in eager training, so a compiled run is the eager run within float
rounding (with its own generator the masks differ and losses agree only statistically).

`train.compile_mode: reduce-overhead` asks for CUDA graphs: the compiled step's kernels are
recorded once per shape and replayed, not launched one by one from Python, which is what
a launch-bound step spends its time on. A graph is recorded per new shape, so micro-batches
are padded to a multiple of 64 tokens (`pad_multiple`) and widths repeat. Replayed graphs
reuse their output memory, which a gradient kept across micro-batches (accumulation) must
not alias: the trial runs the first micro-batch three times (warm-up, record, replay) with
the same RNG state and keeps CUDA graphs only if the accumulated gradients are three times
the first's. On a CPU there are no CUDA graphs: the decoder is compiled as in `default`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lorapilot.base.precision import autocast
from lorapilot.train.batches import batch_width
from lorapilot.train.lora_forward import fused
from lorapilot.train.loss import _decoder_and_head
from lorapilot.train.step import short_sequence_attention

# torch.compile's backend: inductor (Triton kernels on a GPU, C++ on a CPU). The tests set
# "aot_eager" where they check the graphs lorapilot's decoder calls produce (the same
# capture and autograd, without code generation, which takes minutes on 2 cores).
BACKEND = "inductor"
CUDAGRAPH_PAD_MULTIPLE = 64  # tokens: at most 8 widths up to 512, at most 63 pad tokens a row
REPLAY_TOLERANCE = 1e-3  # relative: accumulated gradients vs 3 x the first's (bf16 kernels)


def replays_graphs(mode: str, device_type: str) -> bool:
    """Whether `train.compile_mode: mode` replays CUDA graphs on this device."""
    return mode == "reduce-overhead" and device_type == "cuda"


def pad_multiple(cfg: Any, device_type: str) -> int:
    """Tokens a micro-batch's width is a multiple of: `train.pad_to_multiple_of`, else 64
    where CUDA graphs are replayed (each new width records a graph), else 1 (no padding)."""
    if cfg.pad_to_multiple_of:
        return cfg.pad_to_multiple_of
    replays = cfg.compile == "on" and replays_graphs(cfg.compile_mode, device_type)
    return CUDAGRAPH_PAD_MULTIPLE if replays else 1


def compile_decoder(
    model: Any,
    loss_fn: Callable,
    batch: dict,
    precision: str,
    log: Callable[[str], None],
    mode: str = "default",
    lora_forward: str = "fused",
) -> dict[str, Any]:
    """Compile `model`'s decoder in place and try it on `batch`; the run record's entry:
    {requested, mode, compiled, cudagraphs, seconds (the trial, compile included), graphs,
    graph_breaks, reason (when eager), cudagraphs_reason (when asked for and not used)}."""
    decoder, _ = _decoder_and_head(model)
    if decoder is None:
        return _eager("the model has no separable decoder and head to compile", log, mode)
    device = next(model.parameters()).device
    cudagraphs = replays_graphs(mode, device.type)
    options = {}
    if BACKEND == "inductor":  # ("reduce-overhead" is inductor's mode for these options)
        options = {"options": {"fallback_random": True, "triton.cudagraphs": cudagraphs}}
    eager_forward = decoder.forward
    decoder.__dict__["_lorapilot_eager_forward"] = (eager_forward, "forward" in decoder.__dict__)
    decoder.forward = torch.compile(eager_forward, dynamic=True, backend=BACKEND, **options)
    batch = {k: v.to(device) for k, v in batch.items()}
    t0 = time.perf_counter()
    graphs, breaks = _dynamo_counts()
    try:
        with fused(model, lora_forward):  # the forward the steps run (guards)
            replay_error = _trial(model, loss_fn, batch, precision, device, 3 if cudagraphs else 1)
    except Exception as e:  # any compiler failure: train eagerly, say why
        uncompile(model)
        why = f"torch.compile failed: {type(e).__name__}: {_first_line_of(str(e))}"
        return _eager(why, log, mode)
    finally:
        model.zero_grad(set_to_none=True)
    if replay_error is not None and replay_error > REPLAY_TOLERANCE:
        uncompile(model)
        why = (
            "CUDA graphs: gradients accumulated over three replays were not three times the "
            f"first's (relative error {replay_error:.2g}); replayed memory would corrupt "
            "gradient accumulation"
        )
        return _eager(why, log, mode)
    seconds = time.perf_counter() - t0
    graphs_after, breaks_after = _dynamo_counts()
    record = {
        "requested": "on",
        "mode": mode,
        "compiled": True,
        "cudagraphs": cudagraphs,
        "seconds": round(seconds, 3),
        "graphs": graphs_after - graphs,
        "graph_breaks": sum(breaks_after.values()) - sum(breaks.values()),
    }
    if mode == "reduce-overhead" and not cudagraphs:
        record["cudagraphs_reason"] = f"CUDA graphs need a CUDA device (this is {device.type})"
        log(f"train.compile: {record['cudagraphs_reason']}: compiled without them")
    log(
        f"train.compile: the decoder is compiled ({seconds:.1f} s for the first step's compile, "
        f"{record['graphs']} graph(s), {record['graph_breaks']} graph break(s)"
        f"{', CUDA graphs' if cudagraphs else ''})"
    )
    new_reasons = [r for r in breaks_after if breaks_after[r] > breaks.get(r, 0)]
    if new_reasons:  # parts of the decoder run eagerly: say which, so a user can see why
        record["graph_break_reasons"] = [_first_line_of(r) for r in new_reasons[:3]]
        log(f"train.compile: graph break: {record['graph_break_reasons'][0]}")
    return record


def uncompile(model: Any) -> None:
    """The decoder's eager forward again (a no-op where it was not compiled): training
    compiles it, evaluation never runs it compiled (the adapter is evaluated as the baseline
    was, and evaluation's shapes and caches do not repeat: each would compile again, and
    under CUDA graphs record again)."""
    decoder, _ = _decoder_and_head(model)
    saved = decoder.__dict__.pop("_lorapilot_eager_forward", None) if decoder is not None else None
    if saved is None:
        return
    eager_forward, was_own = saved
    if was_own:
        decoder.forward = eager_forward
    else:
        del decoder.__dict__["forward"]  # the class's own forward again


def is_compiled(model: Any) -> bool:
    decoder, _ = _decoder_and_head(model)
    return decoder is not None and "_lorapilot_eager_forward" in decoder.__dict__


def _trial(model, loss_fn, batch, precision, device, iterations: int) -> float | None:
    """Forward and backward of `batch` `iterations` times in training mode, each from the
    same RNG state (dropout), the gradients accumulating; the RNG and the model's mode are as
    before afterwards. For more than one iteration, the relative difference between the
    accumulated gradients and `iterations` x the first's (None for one)."""
    params = [p for p in model.parameters() if p.requires_grad]
    first: list[torch.Tensor] = []
    was_training = model.training
    model.train()  # the mode training compiles in (dynamo guards on it: eval would recompile)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            state = torch.random.get_rng_state()
            cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
            for i in range(iterations):
                torch.random.set_rng_state(state)
                if cuda_state is not None:
                    torch.cuda.set_rng_state(cuda_state, device)
                # the attention the steps take (a CPU runs short batches in eager attention):
                # another attention implementation would be another graph, compiled again
                with short_sequence_attention(model, device.type, batch_width(batch)):
                    with autocast(device.type, precision):
                        loss, _ = loss_fn(model, batch)
                    loss.backward()
                del loss
                if i == 0 and iterations > 1:
                    first = [_grad(p).clone() for p in params]
    finally:
        model.train(was_training)
    if iterations == 1:
        return None
    expected = torch.cat([g.flatten() * iterations for g in first])
    got = torch.cat([_grad(p).flatten() for p in params])
    return float((got - expected).norm() / expected.norm().clamp_min(1e-30))


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)


def _dynamo_counts() -> tuple[int, dict[str, int]]:
    """(graphs compiled so far, graph breaks so far by reason) in this process: the trial's
    are the difference (a graph break leaves part of the decoder eager, silently otherwise)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), dict(counters["graph_break"])


def _eager(reason: str, log: Callable[[str], None], mode: str = "default") -> dict[str, Any]:
    log(f"train.compile: training eagerly: {reason}")
    return {"requested": "on", "mode": mode, "compiled": False, "reason": reason}


def _first_line_of(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:300] if text else ""
