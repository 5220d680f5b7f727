"""Measuring one training-step configuration on this machine: step times and peak memory.

Split out of `probe` so that the verb (which configurations to run, the comparison with the
memory model, the run record) reads apart from the machinery underneath, which knows no
pilot, spec or run: `measure` times warm-up + measured `train.train_step`s on one batch with
a fresh optimizer (an out-of-memory error becomes ok=False); `PeakMemory` takes a phase's
peak (CUDA allocator statistics; CPU: RSS sampled by a thread); `make_resident` pages
memory-mapped weights in; `adapter.set_checkpointing` switches activation checkpointing as the
training loop does; `other_processes` says who else uses the device.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from lorapilot.records.environment import usable_cores
from lorapilot.train.batches import batch_units, count_target_tokens
from lorapilot.train.meter import PeakMemory, live_tensor_peak
from lorapilot.train.step import train_step

# --------------------------------------------------------------------------- memory


def make_resident(model) -> None:
    """Read every weight once. transformers maps safetensors files into memory and pages
    them in lazily, so without this the first training step's RSS growth would include
    the weights themselves (~the whole model on CPU) and not only what the step adds."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.device.type == "cpu" and t.numel():
                t.detach().reshape(-1)[:: max(1, 4096 // t.element_size())].sum()


def is_out_of_memory(e: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e).lower()
    )


# --------------------------------------------------------------------------- environment


DISTURBED_MIN_CORES = 0.5  # other processes' CPU use that marks a CPU measurement disturbed
DISTURBED_FRACTION = 0.25  # ... or this share of the cores, on a machine with many
LOAD_CHECK_ENV = "LORAPILOT_LOAD_CHECK"  # `off`: a machine shared on purpose (a test runner)


def is_disturbed(other_cores: float, cores: int) -> bool:
    """Other processes used enough CPU during a measurement to make its times unreliable
    (threads competing for the same cores slow every step several times over)."""
    return other_cores >= max(DISTURBED_MIN_CORES, DISTURBED_FRACTION * cores)


_BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # psutil.cpu_times()


class CpuLoad:
    """The CPU time other processes used while we measured, in cores: the machine's busy
    CPU seconds (steal included: a VM's neighbours) minus this process's and its children's,
    per wall second. Taken around the whole measurement, not one 0.2 s sample."""

    def __init__(self):
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.t0 = time.perf_counter()
        self.busy0, self.own0 = self._busy(), self._own()

    def _busy(self) -> float:
        t = self._psutil.cpu_times()
        return sum(getattr(t, k, 0.0) for k in _BUSY_FIELDS)

    def _own(self) -> float:
        t = self._me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def stop(self, threads: int) -> dict:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        other = max(0.0, (self._busy() - self.busy0) - (self._own() - self.own0)) / wall
        cores = usable_cores()
        checked = os.environ.get(LOAD_CHECK_ENV, "on").lower() != "off"
        return {
            "other_cores": round(other, 2),
            "cores": cores,
            "threads": threads,
            "seconds": round(wall, 2),
            "checked": checked,
            "disturbed": checked and is_disturbed(other, cores),
        }


def other_processes(accelerator: str, device_index: int = 0, top: int = 5) -> dict:
    """Who else uses the device. GPUs: the driver's process list. CPU: the load average
    and the busiest processes (pid, name, cpu %, RSS; never command lines)."""
    if accelerator in ("cuda", "rocm"):
        import torch

        with contextlib.suppress(Exception):
            return {"gpu_processes": torch.cuda.list_gpu_processes(device_index)}
        if shutil.which("nvidia-smi"):
            import subprocess

            with contextlib.suppress(Exception):
                out = subprocess.run(
                    [
                        "nvidia-smi",
                        "--query-compute-apps=pid,process_name,used_memory",
                        "--format=csv,noheader",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                return {"gpu_processes": out.stdout.strip()}
        return {"gpu_processes": None, "note": "no process list available (pynvml / nvidia-smi)"}
    import psutil

    me = os.getpid()
    procs = [p for p in psutil.process_iter(["pid", "name"]) if p.info["pid"] != me]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    time.sleep(0.2)
    rows = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            rows.append(
                {
                    "pid": p.info["pid"],
                    "name": p.info["name"],
                    "cpu_percent": p.cpu_percent(None),
                    "rss_bytes": p.memory_info().rss,
                }
            )
    rows.sort(key=lambda r: -r["cpu_percent"])
    return {"load_average": list(os.getloadavg()), "cpu_count": os.cpu_count(), "top": rows[:top]}


# --------------------------------------------------------------------------- one configuration


def measure(
    model,
    batch: dict,
    *,
    make_opt: Callable[[], Any],
    precision: str,
    max_grad_norm: float | None,
    steps: int,
    warmup: int,
    device,
    loss_fn: Callable | None = None,
    live: bool = False,
    lora_forward: str = "fused",
) -> dict:
    """Fresh optimizer, `warmup` + `steps` train_steps on one batch, timed and peak-measured
    (with the training loop's `loss_fn`: the shared-prefix path when it is the one that
    will run). An out-of-memory error is caught and returned as ok=False.

    `live` (CPU): the last measured step also runs under the profiler's memory events and is
    left out of the times: `peak_live_bytes` is the most its tensors held at once, plus the
    optimizer states it kept (see `memmeter.live_tensor_peak`)."""
    import torch

    total_targets = count_target_tokens(batch)
    times: list[float] = []
    out: dict[str, Any] = {"ok": True, "error": None, "peak_live_bytes": None}
    optimizer = None
    n_steps = warmup + steps
    with PeakMemory(device) as mem:
        try:
            optimizer = make_opt()
            for k in range(n_steps):
                profiled = live and k == n_steps - 1 and steps > 1
                t0 = time.perf_counter()
                with live_tensor_peak() if profiled else contextlib.nullcontext({}) as seen:
                    res = train_step(
                        model,
                        optimizer,
                        None,
                        [batch],
                        total_targets,
                        precision,
                        max_grad_norm,
                        loss_fn=loss_fn,
                        lora_forward=lora_forward,
                    )
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if profiled:
                    states = sum(
                        t.nbytes
                        for st in optimizer.state.values()
                        for t in st.values()
                        if torch.is_tensor(t)
                    )
                    out["peak_live_bytes"] = seen["peak_bytes"] + states
                    out["profiled_step_s"] = time.perf_counter() - t0
                else:
                    times.append(time.perf_counter() - t0)
                out["loss"] = res["loss"]
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            out.update(ok=False, error=f"{type(e).__name__}: {e}"[:500])
        finally:
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            del optimizer
            for p in model.parameters():
                p.grad = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    later = times[warmup:]
    tokens = batch_units(batch)[0]  # tokens (text) or images
    out.update(
        first_step_s=times[0] if times else None,
        later_step_s=statistics.median(later) if later else None,
        later_step_max_s=max(later) if later else None,
        steps_run=len(times) + (out["peak_live_bytes"] is not None),
        tokens=tokens,
        target_tokens=total_targets,
        tokens_per_s=tokens / statistics.median(later) if later else None,
        peak_memory_bytes=mem.peak,
        peak_total_bytes=mem.total,
        rss_before_bytes=mem.rss_start,
        cuda_max_reserved_bytes=mem.cuda_reserved,
    )
    return out


def checkpoint_seconds(model, batch: dict, tcfg, root, precision: str, loss_fn=None) -> float:
    """One checkpoint as the training loop writes it (weights, optimizer state after a real
    step, RNG) into `root`, timed, then removed."""
    from lorapilot.train.checkpoint import save_checkpoint
    from lorapilot.train.step import make_optimizer, make_scheduler

    optimizer = make_optimizer(model, tcfg)
    train_step(model, optimizer, None, [batch], count_target_tokens(batch), precision,
               tcfg.max_grad_norm, loss_fn=loss_fn,
               lora_forward=tcfg.lora_forward)  # fmt: skip
    scheduler = make_scheduler(optimizer, "constant", 0, 1)
    try:
        t0 = time.perf_counter()
        save_checkpoint(root, 1, model, optimizer, scheduler, None, {"step": 1, "probe": True})
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
