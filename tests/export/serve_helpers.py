"""What the serving tests share: llama.cpp (the `serve` extra) required or skipped with the
reason, never passed empty. CI sets LORAPILOT_SERVE_TEST=required, so a missing extra fails
there instead of skipping."""

from __future__ import annotations

import importlib.util
import os

import pytest


def need_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is not None:
        return
    why = "llama-cpp-python (the `serve` extra) is not installed: run `make serve`"
    if os.environ.get("LORAPILOT_SERVE_TEST") == "required":
        pytest.fail(why + " (LORAPILOT_SERVE_TEST=required)")
    pytest.skip(why)
