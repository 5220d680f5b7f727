"""Safe loading: weights from safetensors only, pickles only when the spec allows them (and
then through torch's weights-only loader), no code from a model folder unless the spec says so.

Already covered elsewhere: resolve_base refusing a pickle-only folder (tests/test_models.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from rel_helpers import run_measured, run_ok, small_pilot, small_spec

from lorapilot.base.models import load_model, resolve_base
from lorapilot.spec import load_pilot


class _Evil:
    """A pickle that runs a shell command when loaded."""

    marker = ""

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pickle_only_copy(tiny: Path, dest: Path, payload=None) -> Path:
    from safetensors.torch import load_file

    shutil.copytree(tiny, dest, ignore=shutil.ignore_patterns("*.safetensors", "MANIFEST.json"))
    torch.save(
        payload if payload is not None else load_file(tiny / "model.safetensors"),
        dest / "pytorch_model.bin",
    )
    return dest


def test_pickle_only_base_is_refused_with_exit_2_naming_allow_pickle(tmp_path, tiny_model_dir):
    base = _pickle_only_copy(tiny_model_dir, tmp_path / "pickled")
    pilot = small_pilot(tmp_path / "pilot", base)
    out = run_ok("baseline", str(pilot), "--no-progress", expect=2)
    assert (
        "only pickle weights (pytorch_model.bin)" in out["error"]
        and "model.allow_pickle: true" in out["error"]
    )


def test_allowed_pickle_is_loaded_with_weights_only_and_no_remote_code(
    tmp_path, tiny_model_dir, monkeypatch
):
    from transformers import AutoModelForCausalLM

    from lorapilot.base.models import load_base

    base = _pickle_only_copy(tiny_model_dir, tmp_path / "pickled")
    spec = small_spec(base)
    spec["model"]["allow_pickle"] = True
    pilot = load_pilot(small_pilot(tmp_path / "pilot", base, spec=spec))
    loads, pretrained = [], []
    real_load, real_pretrained = torch.load, AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(torch, "load", lambda *a, **k: (loads.append(k), real_load(*a, **k))[1])
    monkeypatch.setattr(
        AutoModelForCausalLM,
        "from_pretrained",
        lambda *a, **k: (pretrained.append(k), real_pretrained(*a, **k))[1],
    )
    resolved, model, _ = load_base(pilot)
    assert resolved.weights_format == "pickle"
    assert [k.get("weights_only") for k in loads] == [True]
    assert pretrained[0]["trust_remote_code"] is False and pretrained[0]["use_safetensors"] is False
    ref, _ = load_model(resolve_base(str(tiny_model_dir)))
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), ref.state_dict().values(), strict=True)
    )


def test_a_malicious_pickle_never_runs_even_when_pickles_are_allowed(tmp_path, tiny_model_dir):
    marker = tmp_path / "PWNED"
    _Evil.marker = str(marker)
    base = _pickle_only_copy(
        tiny_model_dir, tmp_path / "evil", payload={"model.embed_tokens.weight": _Evil()}
    )
    spec = small_spec(base)
    spec["model"]["allow_pickle"] = True
    pilot = small_pilot(tmp_path / "pilot", base, spec=spec)
    out = run_ok("baseline", str(pilot), "--no-progress", expect=2)
    assert (
        "refused by torch's weights-only loader" in out["error"] and "posix.system" in out["error"]
    )
    assert not marker.exists()


def test_code_in_a_model_folder_is_not_run_by_default(tmp_path, tiny_model_dir):
    """A folder whose config asks for its own modeling code (auto_map): with
    trust_remote_code off (the default) the code is never imported."""
    base = tmp_path / "remote"
    shutil.copytree(tiny_model_dir, base)
    marker = tmp_path / "REMOTE_CODE_RAN"
    cfg = json.loads((base / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "evil.py").write_text(
        textwrap.dedent(f"""
        open({str(marker)!r}, "w").write("ran")
        from transformers import LlamaConfig, LlamaForCausalLM
        class EvilConfig(LlamaConfig): pass
        class EvilModel(LlamaForCausalLM): config_class = EvilConfig
    """)
    )
    pilot = load_pilot(small_pilot(tmp_path / "pilot", base))
    assert pilot.spec.model.trust_remote_code is False
    from lorapilot.base.models import load_base, load_tokenizer

    _, model, _ = load_base(pilot)
    load_tokenizer(pilot)
    assert type(model).__name__ == "LlamaForCausalLM" and not marker.exists()


NO_PICKLE_SITECUSTOMIZE = """
import os, pickle

def _refuse(name):
    def refuse(*args, **kwargs):
        with open(os.environ["LORAPILOT_PICKLE_LOG"], "a") as f:
            f.write(f"{name} in pid {os.getpid()}\\n")
        raise RuntimeError(f"{name} was called on a default path")
    return refuse

pickle.load, pickle.loads = _refuse("pickle.load"), _refuse("pickle.loads")
import torch
torch.load = _refuse("torch.load")

# no network either: any connection or name lookup outside the machine is logged and refused
import socket
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo

def _no_net_connect(self, address, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        _refuse(f"network connect to {address!r}")()
    return _connect(self, address, *args)

def _no_net_getaddrinfo(host, *args, **kwargs):
    if host not in (None, "localhost", "127.0.0.1", "::1"):
        _refuse(f"name lookup of {host!r}")()
    return _getaddrinfo(host, *args, **kwargs)

socket.socket.connect, socket.getaddrinfo = _no_net_connect, _no_net_getaddrinfo
"""


def test_default_verbs_never_unpickle_never_reach_the_network_and_record_trust_remote_code_off(
    tmp_path, tiny_model_dir
):
    """data, baseline, train and verify (whose fresh child process is covered too: the
    patch is a sitecustomize on PYTHONPATH) with pickle.load/loads, torch.load, network
    connects and name lookups made to raise and log, and the HF offline switches OFF:
    every verb exits 0 and nothing was logged."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_PICKLE_SITECUSTOMIZE)
    log = tmp_path / "pickle.log"
    env = {
        "PYTHONPATH": str(site),
        "LORAPILOT_PICKLE_LOG": str(log),
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
    }
    probe = run_measured(
        [
            sys.executable,
            "-c",
            "import socket, torch\ntry:\n    socket.getaddrinfo('huggingface.co', 443)\n"
            "except RuntimeError:\n    pass\ntorch.load('x')",
        ],
        env=env,
    )
    assert probe.returncode != 0  # the patches are live:
    assert [x.split(" in pid")[0] for x in log.read_text().splitlines()] == [
        "name lookup of 'huggingface.co'",
        "torch.load",
    ]
    log.unlink()

    pilot = small_pilot(tmp_path / "pilot", tiny_model_dir, max_steps=4)
    ids = [
        run_ok(verb, str(pilot), *flags, env=env)["run_id"]
        for verb, flags in (
            ("data", []),
            ("baseline", ["--no-progress"]),
            ("train", ["--no-progress"]),
            ("verify", []),
        )
    ]
    assert not log.exists(), log.read_text()
    for run_id in ids:
        config = json.loads((pilot / "runs" / run_id / "run.json").read_text())["config"]
        assert (
            config["model"]["trust_remote_code"] is False
            and config["model"]["allow_pickle"] is False
        )
    adapter = pilot / "runs" / ids[2] / "adapter"
    assert not [p.name for p in adapter.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl")]


pytestmark = pytest.mark.usefixtures("one_thread")
