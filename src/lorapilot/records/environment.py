"""Snapshot of the software and hardware a run executed on.

A result is only reproducible on a known stack, so every run record carries this, and the
`run` pipeline uses `platform_fingerprint` to decide whether launch checks must be redone.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from lorapilot import __version__

# The compute stack: these change results or speed, so they are part of platform_fingerprint.
_LIBS = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "tokenizers",
    "gguf",
    "numpy",
    "pydantic",
)
# Recorded too, but outside the fingerprint: data readers, trackers and the CLI change no
# result, and installing a tracker must not make `run` redo its launch checks.
_OTHER_LIBS = ("datasets", "mlflow", "tensorboard", "typer", "bitsandbytes")
# Library -> the distributions that install it, first found wins: mlflow's module also comes
# from the lighter mlflow-skinny (what lorapilot[mlflow] installs).
_DISTS = {"mlflow": ("mlflow", "mlflow-skinny")}


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str | None]:
    """Installed version of every recorded library, None when it is not installed. Read from
    the package metadata: nothing is imported (datasets or mlflow take seconds to import)."""
    out: dict[str, str | None] = {}
    for name in (*_LIBS, *_OTHER_LIBS):
        out[name] = next((v for d in _DISTS.get(name, (name,)) if (v := _version(d))), None)
    return out


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 autocast is several times faster than fp32 on these CPUs."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


@functools.cache
def git_commit() -> str | None:
    """The lorapilot source commit, when running from a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def default_threads() -> int:
    """The cores this process may use, or OMP_NUM_THREADS when set."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op threads (`train.threads`, default: default_threads()); the
    snapshot taken after it records the number."""
    import torch

    n = threads or default_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def snapshot() -> dict:
    """Python, libraries, accelerator stack and devices. Imports torch (slow the first time)."""
    import torch

    env: dict = {
        "lorapilot": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_fast_bf16": cpu_has_fast_bf16(),
        "libraries": library_versions(),
        "torch_num_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cudnn": None,
        "nccl": None,
        "accelerator": "cpu",
        "devices": [],
    }
    try:
        import psutil

        env["ram_bytes"] = psutil.virtual_memory().total
    except Exception:  # psutil missing on an odd platform: the snapshot is still useful
        env["ram_bytes"] = None
    if torch.cuda.is_available():
        env["accelerator"] = "rocm" if env["hip"] else "cuda"
        env["devices"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
        if torch.backends.cudnn.is_available():
            env["cudnn"] = torch.backends.cudnn.version()
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # NCCL absent (ROCm builds report RCCL differently)
            pass
    return env


def platform_fingerprint(env: dict) -> dict:
    """The parts of a snapshot that change results or speed: a change redoes launch checks."""
    return {
        "accelerator": env.get("accelerator"),
        "devices": [d.get("name") for d in env.get("devices", [])],
        "cuda": env.get("cuda"),
        "hip": env.get("hip"),
        # only the compute stack: a run recorded before more libraries were added keeps its key
        "libraries": {
            k: v
            for k, v in (env.get("libraries") or {}).items()
            # bitsandbytes quantizes bases: a new version redoes the checks; absent, the key
            # is left out so records made without it keep theirs
            if k in _LIBS or (k == "bitsandbytes" and v)
        },
        "python": env.get("python"),
    }
