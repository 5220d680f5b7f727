"""Helpers shared by the reliability tests: a small pilot on the tiny model, and ways to run
the CLI as a user would (a subprocess), killed, wrapped, or measured (time and peak RSS).

Not a conftest (tests/conftest.py is imported by name as `conftest`); imported by name.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

LABELS = ["alpha", "beta", "gamma"]
# Every subprocess runs single-threaded: the tests share 2 cores, and a 32-wide model gains
# nothing from threads (OpenMP spinning makes small ops slower on a busy machine).
QUIET_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def small_records(n: int = 36, seed: int = 0) -> list[dict]:
    """`n` classification records of random words: no two are near-duplicates."""
    rng = random.Random(seed)
    vocab = [f"w{i}" + "".join(rng.choice("abcdefghij") for _ in range(3)) for i in range(400)]
    return [
        {
            "id": f"r{i}",
            "text": " ".join(rng.sample(vocab, rng.randint(6, 10))),
            "label": LABELS[i % 3],
        }
        for i in range(n)
    ]


def small_spec(base: Path, **train) -> dict:
    return {
        "name": "reliability",
        "hypothesis": "A tiny pilot for the reliability tests.",
        "task": {
            "kind": "classification",
            "labels": LABELS,
            "system": "Pick one of: {labels}.",
            "template": "Text:\n{text}\n\nLabel:",
        },
        "model": {"base": str(base)},
        "data": {
            "source": "synthetic random words (tests/reliability)",
            "permission": "generated for the tests",
            "file": "data.jsonl",
            "max_length": 64,  # short sequences for speed: inputs are cut on purpose
            "truncation": "allow",
        },
        # dropout > 0: resuming must also restore the RNG for the result to be bitwise equal
        "adapter": {"r": 4, "alpha": 8, "dropout": 0.1},
        "train": {
            "seed": 0,
            "max_steps": 12,
            "save_every": 2,
            "micro_batch": 2,
            "precision": "fp32",
            "lr": 0.01,
            "warmup_ratio": 0.0,
            **train,
        },
        "eval": {"batch_size": 16, "precision": "fp32"},
    }


def small_pilot(
    folder: Path, base: Path, records: list[dict] | None = None, spec: dict | None = None, **train
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    spec = spec or small_spec(base, **train)
    (folder / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    recs = small_records() if records is None else records
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return folder


def cli_env(extra: dict | None = None) -> dict:
    return {**os.environ, **QUIET_ENV, **(extra or {})}


def cli_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "lorapilot", *args]


def wrapped_args(prelude: str, *args: str) -> list[str]:
    """`python -c` that runs `prelude` (e.g. a monkeypatch) and then the real CLI with ARGS."""
    code = textwrap.dedent(prelude) + textwrap.dedent(f"""
        import sys
        sys.argv = ["lorapilot", *{list(args)!r}]
        from lorapilot.cli import main
        main()
    """)
    return [sys.executable, "-c", code]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss_bytes: int

    def json(self) -> dict:
        return json.loads(self.stdout)


# A child forked from this (large) test process starts with our RSS counted in its
# ru_maxrss, so the peak is measured from a bare launcher: fork + exec, then wait4.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
with open(os.environ["LORAPILOT_TEST_RSS_FILE"], "w") as f:
    f.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def run_measured(
    argv: list[str],
    *,
    timeout: float = 120,
    env: dict | None = None,
    cwd: Path | None = None,
    umask: int | None = None,
) -> Finished:
    """Run to the end: its wall time and its own peak RSS (0 when not measured).

    A run over `timeout` is SIGKILLed and the test fails: a hang is a bug.
    """
    import tempfile

    preexec = (lambda: os.umask(umask)) if umask is not None else None
    fd, rss_file = tempfile.mkstemp(prefix="rss-")
    os.close(fd)
    env = {**(env or {}), "LORAPILOT_TEST_RSS_FILE": rss_file}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", _LAUNCHER, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(env),
        cwd=cwd,
        preexec_fn=preexec,
    )
    out: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        out[name] = stream.read()

    readers = [
        threading.Thread(target=drain, args=(n, s), daemon=True)
        for n, s in (("stdout", proc.stdout), ("stderr", proc.stderr))
    ]
    for r in readers:
        r.start()
    while True:
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > timeout:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            os.kill(proc.pid, signal.SIGKILL)
            _, status, _ = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise AssertionError(f"{argv[3:] or argv} ran over {timeout} s (killed)")
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    rss = Path(rss_file).read_text()
    os.unlink(rss_file)
    return Finished(
        proc.returncode,
        out["stdout"].decode("utf-8", "replace"),
        out["stderr"].decode("utf-8", "replace"),
        time.monotonic() - t0,
        int(rss or 0),
    )


def run_ok(
    *args: str,
    expect: int = 0,
    timeout: float = 300,
    env: dict | None = None,
    argv: list[str] | None = None,
    **kw,
) -> dict:
    """A verb with --json: exit code as expected, no traceback, exactly one JSON object."""
    res = run_measured(argv or cli_args(*args, "--json"), timeout=timeout, env=env, **kw)
    assert res.returncode == expect, (
        f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    )
    assert "Traceback" not in res.stderr, res.stderr
    return res.json()


def new_run_json(runs: Path, before: set[str], timeout: float = 120) -> Path | None:
    """Wait for a run folder not in `before` whose run.json says `running`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if runs.is_dir():
            for d in runs.iterdir():
                if d.name in before:
                    continue
                try:
                    if json.loads((d / "run.json").read_text())["status"] == "running":
                        return d
                except (OSError, ValueError, KeyError):
                    pass
        time.sleep(0.01)
    return None


def existing_runs(pilot: Path) -> set[str]:
    runs = pilot / "runs"
    return {d.name for d in runs.iterdir()} if runs.is_dir() else set()


def start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env(env)
    )


def sigkill(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=30)


def adapter_tensors(adapter_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(adapter_dir / "adapter_model.safetensors")


def assert_same_tensors(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, differing
