"""Shared fixtures: the fetched default model, a tiny random model with its tokenizer, and
helpers to run the CLI as a user would (in-process via typer's runner, or as a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# `make test` runs two pytest-xdist workers on a 2-core machine. Each worker, and every
# subprocess it starts, computes with one thread: two processes with two OpenMP threads
# each would oversubscribe the cores, and spinning OpenMP threads make every op several
# times slower. Set before torch is imported, so OpenMP reads it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # The two workers share the cores on purpose: a probe's load check would (rightly) mark
    # every measurement disturbed and `run` would never reuse one. The check's own tests
    # turn it back on.
    os.environ["LORAPILOT_LOAD_CHECK"] = "off"


def need_llama_cpp() -> None:
    """llama.cpp (the `serve` extra) for the serving tests: skipped with the reason when it is
    missing, never passed empty; CI sets LORAPILOT_SERVE_TEST=required, so there a missing
    extra fails instead of skipping."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is not None:
        return
    why = "llama-cpp-python (the `serve` extra) is not installed: run `make serve`"
    if os.environ.get("LORAPILOT_SERVE_TEST") == "required":
        pytest.fail(why + " (LORAPILOT_SERVE_TEST=required)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The real default model, fetched by `make test` before pytest runs (or here if missing)."""
    from lorapilot.base.models import default_model_dir as d
    from lorapilot.base.models import fetch_default_model

    path = d()
    if not (path / "MANIFEST.json").is_file():
        fetch_default_model()
    return path


@pytest.fixture(scope="session")
def image_model_dir() -> Path:
    """The default image model (EfficientNet-Lite0), fetched by `make test` (or here)."""
    from lorapilot.base.image_models import fetch_image_model

    return fetch_image_model().path


@pytest.fixture(scope="session")
def tiny_vit_dir(tmp_path_factory) -> Path:
    """A random 2-layer ViT (16x16 images, 8x8 patches, 32 wide) saved as a local
    AutoModelForImageClassification folder (safetensors, with an image processor config)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    path = tmp_path_factory.mktemp("vit") / "model"
    config = ViTConfig(image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=37, num_labels=5)  # fmt: skip
    torch.manual_seed(0)
    ViTForImageClassification(config).save_pretrained(path, safe_serialization=True)
    processor = {"do_resize": True, "size": {"height": 16, "width": 16}, "do_normalize": True,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir) -> Path:
    """A 2-layer 32-wide random Llama with the real SmolLM2 tokenizer and chat template."""
    from lorapilot.base.models import make_tiny_model

    return make_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", tokenizer_dir=default_model_dir
    )


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine OpenMP's spinning
    threads make every small op several times slower. Use with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# Verbs run in this process (typer's runner) when a test passes no env or cwd: the same
# entry point and exit codes without a fresh interpreter's imports (torch, transformers and
# peft cost 8-10 s a process, most of the suite's time). LORAPILOT_TEST_SUBPROCESS=1 runs
# every call as a subprocess instead; tests that need a fresh process (signals, environment,
# a killed run) use subprocess themselves or pass env/cwd.
IN_PROCESS_VERBS = frozenset(
    ("check", "data", "inspect", "baseline", "smoke", "probe", "budget", "train", "eval",
     "export", "compare", "report", "runs", "run", "init", "schema", "predict")
)  # fmt: skip


def _in_process(args: tuple[str, ...]) -> subprocess.CompletedProcess:
    import signal

    import torch
    from typer.testing import CliRunner

    from lorapilot.cli import app

    threads, environ = torch.get_num_threads(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        res = CliRunner().invoke(app, list(args), catch_exceptions=True)
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        stderr += "Traceback (in process):\n" + "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(["lorapilot", *args], res.exit_code, res.stdout, stderr)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Run `lorapilot ARGS` the way a user would: in this process when it can (see
    IN_PROCESS_VERBS), else as `python -m lorapilot ARGS` in a subprocess."""
    if (
        env is None
        and cwd is None
        and args
        and args[0] in IN_PROCESS_VERBS
        and os.environ.get("LORAPILOT_TEST_SUBPROCESS") != "1"
    ):
        return _in_process(args)
    return subprocess.run(
        [sys.executable, "-m", "lorapilot", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_json(*args: str, expect: int = 0, **kw) -> dict:
    """Run a verb with --json; assert its exit code and that stdout is exactly one JSON object."""
    proc = run_cli(*args, "--json", **kw)
    assert proc.returncode == expect, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def write_pilot(folder: Path, spec: dict | str, files: dict[str, str] | None = None) -> Path:
    """A pilot folder with its pilot.yaml (a dict is dumped as YAML) and data files."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    text = spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False)
    (folder / "pilot.yaml").write_text(text)
    for rel, content in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content)
    return folder


def init_tiny_pilot(tmp_path: Path, tiny_model_dir: Path, **train) -> Path:
    """`lorapilot init p` in tmp_path, on the tiny model in fp32, with `train` settings."""
    import yaml

    run_json("init", "p", "--dir", str(tmp_path))
    pilot = tmp_path / "p"
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(precision="fp32", **train)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot
