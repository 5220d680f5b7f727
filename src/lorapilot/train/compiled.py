"""`train.compile: on`: the decoder's forward under torch.compile, tried once, else eager.

On a GPU a LoRA step of a 1-8B model at the pilots' micro-batches is bound by kernel
launches and Python (bench/README.md, "On a GPU"): ~220 LoRA layers, each a handful of small
kernels per pass. torch.compile fuses them and removes the per-module Python. It is opt-in
until measured (bench/gpu_shapes.py --compile): a compiled path that is not faster only
costs its compile time.

Only the decoder is compiled (`loss._decoder_and_head`): both loss paths call it (the
shared-prefix path twice, with a cache) and keep the head and the loss at the answer
positions in eager code. Shapes vary with every micro-batch, so it is compiled with dynamic
shapes. The trial runs one forward and backward of the first micro-batch under the step's
autocast, with the RNG forked and the gradients dropped after it, so that training is the
eager training's step for step; a failure (no compiler, an unsupported op, a graph the
backend refuses) restores the eager forward and the reason goes in the run record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lorapilot.base.precision import autocast
from lorapilot.train.loss import _decoder_and_head

# torch.compile's backend: inductor (Triton kernels on a GPU, C++ on a CPU). The tests set
# "aot_eager" where they check the graphs lorapilot's decoder calls produce (the same
# capture and autograd, without code generation, which takes minutes on 2 cores).
BACKEND = "inductor"


def compile_decoder(
    model: Any, loss_fn: Callable, batch: dict, precision: str, log: Callable[[str], None]
) -> dict[str, Any]:
    """Compile `model`'s decoder in place and try it on `batch`; the run record's entry:
    {requested, compiled, seconds (the trial, compile included), reason (when eager)}."""
    decoder, _ = _decoder_and_head(model)
    if decoder is None:
        return _eager("the model has no separable decoder and head to compile", log)
    eager_forward = decoder.forward
    decoder.forward = torch.compile(eager_forward, dynamic=True, backend=BACKEND)
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    t0 = time.perf_counter()
    graphs, breaks = _dynamo_counts()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with autocast(device.type, precision):
                loss, _ = loss_fn(model, batch)
            loss.backward()
    except Exception as e:  # any compiler failure: train eagerly, say why
        decoder.forward = eager_forward
        return _eager(f"torch.compile failed: {type(e).__name__}: {_first_line_of(str(e))}", log)
    finally:
        model.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    graphs_after, breaks_after = _dynamo_counts()
    record = {
        "requested": "on",
        "compiled": True,
        "seconds": round(seconds, 3),
        "graphs": graphs_after - graphs,
        "graph_breaks": sum(breaks_after.values()) - sum(breaks.values()),
    }
    log(
        f"train.compile: the decoder is compiled ({seconds:.1f} s for the first step's compile, "
        f"{record['graphs']} graph(s), {record['graph_breaks']} graph break(s))"
    )
    new_reasons = [r for r in breaks_after if breaks_after[r] > breaks.get(r, 0)]
    if new_reasons:  # parts of the decoder run eagerly: say which, so a user can see why
        record["graph_break_reasons"] = [_first_line_of(r) for r in new_reasons[:3]]
        log(f"train.compile: graph break: {record['graph_break_reasons'][0]}")
    return record


def _dynamo_counts() -> tuple[int, dict[str, int]]:
    """(graphs compiled so far, graph breaks so far by reason) in this process: the trial's
    are the difference (a graph break leaves part of the decoder eager, silently otherwise)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), dict(counters["graph_break"])


def _eager(reason: str, log: Callable[[str], None]) -> dict[str, Any]:
    log(f"train.compile: training eagerly: {reason}")
    return {"requested": "on", "compiled": False, "reason": reason}


def _first_line_of(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:300] if text else ""
