"""Peak memory of a phase or of a training run: one meter for the probe and the loop.

CUDA: the allocator's max allocated/reserved since the meter started. CPU: the process RSS,
sampled by a thread every 5 ms inside `with PeakMemory(device)` (the probe's phases), or at
each step end by `at_step_end()` (the training loop, which must not pay for a thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import threading
import warnings

SAMPLE_EVERY_S = 0.005


def _malloc_trim() -> None:
    """Hand freed heap back to the OS (glibc), so RSS falls back to what is really live."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory of a phase. CUDA: max allocated/reserved since entry. CPU: a thread
    samples the process RSS every 5 ms; `increase` is the peak over the RSS at entry."""

    def __init__(self, device, *, reset_cuda: bool = False):
        import psutil

        self.device, self._proc = device, psutil.Process()
        self.rss_start = self.rss_peak = 0
        self.cuda_allocated = self.cuda_reserved = None
        if reset_cuda and device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(device)

    def at_step_end(self) -> int:
        """The loop's figure at a step end, no thread: CUDA max allocated since the meter
        was made with reset_cuda=True; CPU the largest RSS seen at a step end so far, which
        is what a machine's memory limit is measured against."""
        if self.device.type == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        self._sample()
        return self.rss_peak

    def _sample(self) -> None:
        self.rss_peak = max(self.rss_peak, self._proc.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self._sample()

    def __enter__(self) -> PeakMemory:
        import torch

        gc.collect()
        _malloc_trim()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rss_start = self.rss_peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        self._stop.set()
        self._thread.join()
        self._sample()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.cuda_allocated = int(torch.cuda.max_memory_allocated(self.device))
            self.cuda_reserved = int(torch.cuda.max_memory_reserved(self.device))

    @property
    def increase(self) -> int:
        return self.rss_peak - self.rss_start

    @property
    def peak(self) -> int:
        """The measured peak of a step: CUDA max allocated, CPU the RSS increase."""
        return self.cuda_allocated if self.cuda_allocated is not None else self.increase

    @property
    def total(self) -> int:
        """What a memory limit is checked against: CUDA max reserved, CPU the peak RSS."""
        return self.cuda_reserved if self.cuda_reserved is not None else self.rss_peak


@contextlib.contextmanager
def _stderr_muted():
    """fd 2 pointed at /dev/null for the block (C++ code writes there, not to sys.stderr)."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def live_tensor_peak(step_module=None):
    """Peak bytes of CPU tensors allocated and not yet freed inside the block, from torch's
    profiler memory events (yields a dict; `peak_bytes` and `windows` are set on exit).

    What a CPU's RSS cannot say: glibc keeps freed blocks in its heaps, so the RSS increase of
    the same step on the same model varies with the heap's history (1.26-2.09 GiB for one
    configuration of the default model, bench/README.md), while the bytes torch holds live
    are the same every time: the figure to hold an analytic memory model to, as CUDA's max
    allocated is. Tensors live before the block (weights, optimizer states) are not counted;
    memory that libraries allocate outside torch's allocator (oneDNN scratch) is not seen.

    The profiler keeps every operator it saw until it stops (~14 KB each here), so a long
    block grows without bound: a generation of 372 tokens for 32 rows took the 24 GiB of
    this machine. With `step_module`, each of its forward calls (one decoding step) closes a
    profiling window whose memory events are folded into the running count and dropped; the
    windows follow one another, so an allocation in one and its free in a later one still
    cancel.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    out: dict = {"peak_bytes": None}
    cpu = torch.autograd.DeviceType.CPU
    count = {"live": 0, "peak": 0, "windows": 0}

    def fold(prof) -> None:
        events = sorted(
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == cpu
        )
        for _, n in events:
            count["live"] += n
            count["peak"] = max(count["peak"], count["live"])
        count["windows"] += 1

    def quietly(action) -> None:  # kineto's start/stop lines; the warm-up and cycle warnings
        with _stderr_muted(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            action()

    with warnings.catch_warnings():  # "won't be using warmup": none is wanted
        warnings.simplefilter("ignore")
        # every step records and hands its window to `fold`, and so does the stop
        prof = profile(
            activities=[ProfilerActivity.CPU],
            profile_memory=True,
            schedule=schedule(wait=0, warmup=0, active=1),
            on_trace_ready=fold,
        )
    hook = None
    if step_module is not None:
        hook = step_module.register_forward_hook(lambda *_: quietly(prof.step))
    quietly(prof.start)
    try:
        yield out
    finally:
        if hook is not None:
            hook.remove()
        quietly(prof.stop)
    out["peak_bytes"], out["windows"] = count["peak"], count["windows"]
