"""What this machine must have for a spec to run, checked when the pilot is loaded: bitsandbytes
for a quantized base, a tracker's Python packages. Only package lookups (no import of the
engines that use them), so the spec stays beneath every other layer."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from lorapilot.errors import UsageError

if TYPE_CHECKING:
    from lorapilot.spec.model import QuantizationSpec

BITSANDBYTES_INSTALL = "pip install -e '.[quant]' (bitsandbytes==0.50.2)"
_SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def bitsandbytes_version() -> str | None:
    try:
        return md.version("bitsandbytes")
    except md.PackageNotFoundError:
        return None


def require_quantization(q: QuantizationSpec, source: str) -> None:
    """Refuse (exit 2) a quantized base this machine cannot load: the extra missing, or a
    bitsandbytes without a backend for this platform."""
    if bitsandbytes_version() is None:
        raise UsageError(
            f"{source}: model.quantization needs bitsandbytes, which is not installed; "
            f"install the extra: {BITSANDBYTES_INSTALL}"
        )
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # a broken install or no backend for this CPU/GPU
        raise UsageError(
            f"{source}: model.quantization: bitsandbytes {bitsandbytes_version()} cannot run "
            f"on this platform ({type(e).__name__}: {e}); remove model.quantization or use a "
            "machine it supports (CUDA, ROCm or an x86-64/aarch64 CPU)"
        ) from None


def tracker_modules(target: str) -> list[str]:
    """The Python modules a tracker needs (MLflow on a SQL store needs SQLAlchemy and Alembic)."""
    if target == "tensorboard":
        return ["tensorboard"]
    scheme = (os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:").split(":", 1)[0].split("+", 1)[0]
    return ["mlflow", "sqlalchemy", "alembic"] if scheme in _SQL_SCHEMES else ["mlflow"]


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require_trackers(targets: Iterable[str], source: str) -> None:
    """Refuse up front (exit 2) a tracker whose packages are missing, saying how to get them."""
    for target in targets:
        missing = [m for m in tracker_modules(target) if not available(m)]
        if missing:
            raise UsageError(
                f"{source}: tracking: {target} needs the Python package(s) {', '.join(missing)}, "
                "which "
                f"are not installed; install the extra with `pip install 'lorapilot[{target}]'` "
                f"(or remove {target} from tracking)"
            )


SERVE_INSTALL = (
    "pip install -e '.[serve]' (gguf 0.19.0 and llama-cpp-python 0.3.36, built from its sdist "
    "with cmake and a C++ compiler: about 4 minutes on 2 cores), or `make serve`"
)


def require_serving(source: str) -> None:
    """Refuse (exit 2) a GGUF export this machine cannot check: llama.cpp's binding missing."""
    missing = [m for m in ("gguf", "llama_cpp") if not available(m)]
    if missing:
        raise UsageError(
            f"{source}: the GGUF export needs {', '.join(missing)} (the `serve` extra), not "
            f"installed here; install it: {SERVE_INSTALL}"
        )
