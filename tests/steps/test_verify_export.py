"""The deliverable: fresh-process verify, pinned base refused when changed, plain-PEFT reload,
merged export, and the files that must (not) exist."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import EXAMPLES, run_cli, run_json


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A tiny pilot with its own copy of the base (so tests may corrupt it) and one train run."""
    root = tmp_path_factory.mktemp("export")
    base = root / "base"
    shutil.copytree(tiny_model_dir, base)
    pilot = root / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(base)}
    spec["train"].update(max_steps=3, lr=0.01, precision="fp32")
    spec["adapter"]["modules_to_save"] = ["norm"]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_json("train", str(pilot), "--no-progress")
    return pilot, base, out


def test_verify_fresh_process_matches(trained):
    pilot, base, train = trained
    out = run_json("verify", str(pilot))
    assert out["ok"] and out["metrics_match"] and out["n_mismatched_predictions"] == 0
    assert out["base_sha256"] == out["expected_base_sha256"]
    assert out["metrics"]["accuracy"] == train["metrics"]["accuracy"]
    assert out["device"] == "cpu"  # where the fresh process evaluated (no accelerator here)
    assert out["eval_peak_memory_bytes"] > 0  # its own peak: load + evaluation
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert (
        rec["kind"] == "verify"
        and rec["parent"] == train["run_id"]
        and rec["status"] == "completed"
    )


def test_adapter_files_and_plain_peft_reload(trained):
    """Loads with transformers + peft only (no lorapilot loading code) and gives the same
    outputs as lorapilot's own loading path."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    pilot, base, train = trained
    adapter = pilot / "runs" / train["run_id"] / "adapter"
    names = {p.name for p in adapter.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "lorapilot.json"} <= names
    assert not {n for n in names if n.endswith((".bin", ".pt", ".pkl", ".pth"))}
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base), adapter
        ).eval()
    assert not [w for w in caught if "missing" in str(w.message).lower()]
    from lorapilot.base.models import attach_adapter, load_base
    from lorapilot.spec import load_pilot

    _, ours, _ = load_base(load_pilot(pilot), use="exact")  # fp32, as the plain load
    ours = attach_adapter(ours, adapter)
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids=ids).logits, ours(input_ids=ids).logits, rtol=0, atol=0
        )
    # modules_to_save were trained, saved and restored
    saved = {n for n, _ in plain.named_parameters() if "modules_to_save" in n}
    assert saved, "modules_to_save not restored"
    trained_norm = plain.base_model.model.model.norm.modules_to_save["default"].weight
    assert not torch.equal(trained_norm, plain.base_model.model.model.norm.original_module.weight)


def test_export_merge_loads_with_plain_transformers(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pilot, base, train = trained
    out = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert out["ok"] and out["max_logit_diff"] <= out["tolerance"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert AutoTokenizer.from_pretrained(tmp_path / "merged").chat_template
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not list((tmp_path / "merged").glob("adapter_*"))
    assert merged.config.vocab_size > 0
    again = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"), expect=2)
    assert "not empty" in again["error"]
    # whole trained modules (modules_to_save: norm here) merge in memory, in float32 only
    half = run_json("export", str(pilot), "--merge", "--merge-dtype", "float16",
                    "--out", str(tmp_path / "m16"), expect=2)  # fmt: skip
    assert "modules_to_save" in half["error"] and not (tmp_path / "m16").exists()


def test_full_fine_tune_verifies_tests_against_the_base_and_exports(tmp_path, tiny_model_dir):
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["adapter"] = {"method": "full"}
    spec["train"].update(max_steps=2, lr=1e-2, precision="fp32")
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    tr = run_json("train", str(pilot), "--no-progress")
    assert tr["status"] == "completed" and tr["update_audit"]["ok"] is True
    v = run_json("verify", str(pilot))
    assert v["ok"] and v["n_mismatched_predictions"] == 0
    test = run_json("eval", str(pilot), "--split", "test", "--final", "--no-progress")

    # the base on the test rows is the base itself (loaded again), not the fine-tune
    def scores(name: str) -> dict:
        lines = (pilot / "runs" / test["run_id"] / name).read_text().splitlines()
        return {json.loads(x)["id"]: json.loads(x)["scores"] for x in lines}

    base_rows, ft_rows = scores("baseline_predictions.jsonl"), scores("predictions.jsonl")
    assert set(base_rows) == set(ft_rows) and base_rows != ft_rows
    from lorapilot.modality import modality_of
    from lorapilot.spec import load_pilot

    loaded = modality_of(load_pilot(pilot)).load()
    base, _ = loaded.evaluate_base(loaded.prepared.splits["test"], loaded.protocol, progress=False)
    assert test["baseline_metrics"] == base.metrics
    ex = run_json("export", str(pilot), "--out", str(tmp_path / "whole"))
    assert ex["ok"] and ex["merged"] is False and "model.safetensors" in ex["files"]
    proc = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "m"), expect=2)
    assert "without --merge" in proc["error"]


def test_unmerged_export_copies_the_adapter_and_names_its_base(trained, tmp_path):
    pilot, _, train = trained
    out = run_json("export", str(pilot), "--out", str(tmp_path / "adapter"))
    assert out["ok"] and out["merged"] is False and out["needs_quantization"] is None
    assert out["base"]["sha256"]
    src = pilot / "runs" / train["run_id"] / "adapter"
    for name in out["files"]:
        assert (tmp_path / "adapter" / name).read_bytes() == (src / name).read_bytes()
    # a folder for users: the permissions of a plain mkdir/open under their umask, not
    # mkdtemp's 0700 and safetensors' 0600
    import os
    import stat

    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "adapter").stat().st_mode) == 0o777 & ~umask
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    assert stat.S_IMODE(weights.stat().st_mode) == 0o666 & ~umask


def test_changed_base_is_refused_then_restored(trained):
    pilot, base, _ = trained
    weights = base / "model.safetensors"
    original = weights.read_bytes()
    try:
        data = bytearray(original)
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
        out = run_json("verify", str(pilot), expect=1)
        assert not out["ok"] and out["base_sha256"] != out["expected_base_sha256"]
        assert out["base_sha256"] in out["error"] and out["expected_base_sha256"] in out["error"]
    finally:
        weights.write_bytes(original)


def test_adapter_on_a_different_base_is_refused(trained, tmp_path):
    from lorapilot.base.models import default_model_dir, make_tiny_model

    pilot, _, _ = trained
    other = make_tiny_model(tmp_path / "other", tokenizer_dir=default_model_dir(), seed=1)
    spec_path = pilot / "pilot.yaml"
    original = spec_path.read_text()
    try:
        # the manifest pins the base by hash, not by path: the same path with other weights is
        # refused
        spec = yaml.safe_load(original)
        base = spec["model"]["base"]
        shutil.move(base, str(tmp_path / "moved"))
        shutil.copytree(other, base)
        out = run_json("verify", str(pilot), expect=1)
        assert "trained on" in out["error"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.move(str(tmp_path / "moved"), base)
        spec_path.write_text(original)


def test_missing_adapter_file_is_a_clear_error(trained):
    pilot, _, train = trained
    weights = pilot / "runs" / train["run_id"] / "adapter" / "adapter_model.safetensors"
    saved = weights.read_bytes()
    weights.unlink()
    try:
        out = run_json("verify", str(pilot), expect=1)
        assert "adapter_model.safetensors" in out["error"] and "missing" in out["error"]
    finally:
        weights.write_bytes(saved)


def test_changed_evaluation_protocol_is_refused_naming_the_key(trained):
    """verify evaluates with the protocol the adapter was measured with; when the protocol it
    computes now differs from the manifest's (here the manifest says batch size 3), the
    refusal says which protocol key moved."""
    pilot, _, train = trained
    manifest = pilot / "runs" / train["run_id"] / "adapter" / "lorapilot.json"
    original = manifest.read_text()
    try:
        data = json.loads(original)
        data["eval_protocol"].update(batch_size=3, eval_protocol="ep-0000000000000000")
        manifest.write_text(json.dumps(data))
        out = run_json("verify", str(pilot), expect=1)
        assert "eval protocol" in out["error"] and "batch_size (3 vs " in out["error"], out["error"]
    finally:
        manifest.write_text(original)


def test_a_base_held_in_bf16_trains_verifies_and_merges(tmp_path, tiny_model_dir):
    """model.dtype auto with bf16 training and evaluation: the frozen linears are held in
    bf16 (recorded in the run, the result and the manifest's base identity), the fresh
    process reproduces every prediction, and the merge (in fp32) gives the adapter's logits."""
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(max_steps=3, lr=0.01, precision="bf16")
    spec["eval"] = {**(spec.get("eval") or {}), "precision": "bf16"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    train = run_json("train", str(pilot), "--no-progress")
    assert train["base_dtype"] == "bfloat16" and train["update_audit"]["ok"]
    assert train["base_identity"]["dtype"] == "bfloat16"
    rec = json.loads((pilot / "runs" / train["run_id"] / "run.json").read_text())
    held = rec["result"]["adapter"]["frozen_held"]
    assert held["dtype"] == "bfloat16" and held["params_in_dtype"] > 0
    assert "weights_dtype" not in rec["result"]["protocol"]  # evaluated in bf16: nothing lower
    from lorapilot.base.manifest import read_manifest

    assert read_manifest(Path(train["adapter_path"]))["base_identity"]["dtype"] == "bfloat16"
    out = run_json("verify", str(pilot))
    assert out["ok"] and out["metrics_match"] and out["n_mismatched_predictions"] == 0
    merged = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert merged["ok"] and merged["max_logit_diff"] <= merged["tolerance"]
    assert merged["merged_dtype"] == "float32"
    # half the size: written tensor by tensor in float16, loaded by plain transformers as
    # evaluation holds the base, checked on every validation prediction (the gate)
    half = run_json("export", str(pilot), "--merge", "--merge-dtype", "float16",
                    "--out", str(tmp_path / "m16"))  # fmt: skip
    assert half["ok"] and half["merged_dtype"] == "float16" and half["tolerance"] is None
    assert half["merge_agreement"] >= half["merge_agreement_min"] == 0.99
    assert half["merge_agreement_examples"] > 0 and half["max_logit_diff"] > 0
    from lorapilot.base.models import checkpoint_dtype

    assert checkpoint_dtype(tmp_path / "m16") == "float16"
    written = json.loads((tmp_path / "m16" / "lorapilot.json").read_text())
    assert written["merged_dtype"] == "float16" and written["merge_tolerance"] is None
    for bad, says in ((["--merge-dtype", "bf16", "--merge"], "use auto, float32"),
                      (["--merge-dtype", "float16"], "goes with --merge")):  # fmt: skip
        out = run_json("export", str(pilot), *bad, "--out", str(tmp_path / "x"), expect=2)
        assert says in out["error"]


def test_a_16_bit_merge_of_generated_answers_is_gated_on_their_tokens(tmp_path, tiny_model_dir):
    """An extraction (generated answers) merged in bfloat16: the gate is the share of the
    adapter's answer tokens the merged model predicts the same from the same preceding ones
    (one near-tie does not make a whole answer differ); the answers that differ and the
    pilot's metrics on both are reported."""
    pilot = tmp_path / "inv"
    shutil.copytree(EXAMPLES / "invoice-fields", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(max_steps=2, precision="fp32", threads=1)
    spec["eval"] = {"mode": "generate", "precision": "fp32", "max_new_tokens": 16}
    spec["data"]["split"].update(val=0.02)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_json("train", str(pilot), "--no-progress")
    proc = run_cli("export", str(pilot), "--merge", "--merge-dtype", "bfloat16", "--out",
                   str(tmp_path / "m"), "--json")  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["merge_agreement_unit"] == "tokens" and out["merged_dtype"] == "bfloat16"
    n = out["merge_agreement_examples"]
    assert n > 0 and n < out["merge_tokens_compared"] <= n * 17  # answers and their ends
    assert out["ok"] == (out["merge_token_agreement"] >= 0.99)
    assert proc.returncode == (0 if out["ok"] else 1)
    assert {"leaf_f1", "json_valid_rate"} <= set(out["merge_metrics"])


def test_a_dora_adapter_trains_verifies_and_merges(tmp_path, tiny_model_dir):
    """adapter.dora (as a `--set` variant): trained, audited, reloaded in a fresh process and
    merged with its outputs checked; refused up front where the deliverable is a GGUF LoRA."""
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(max_steps=3, lr=0.01, precision="fp32")
    spec.pop("export", None)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    t = run_json("train", str(pilot), "--set", "adapter.dora=true", "--set",
                 "adapter.rslora=true", "--no-progress")  # fmt: skip
    config = json.loads((pilot / "runs" / t["run_id"] / "adapter" / "adapter_config.json")
                        .read_text())  # fmt: skip
    assert config["use_dora"] is True and config["use_rslora"] is True
    audit = t["update_audit"]
    assert audit["ok"] and any("lora_magnitude_vector" in n for n in audit["changed"])
    v = run_json("verify", str(pilot), "--run", t["run_id"])
    assert v["ok"] and v["n_mismatched_predictions"] == 0
    ex = run_json("export", str(pilot), "--run", t["run_id"], "--merge", "--out",
                  str(tmp_path / "merged"))  # fmt: skip
    assert ex["ok"]
    bad = run_cli("check", str(pilot), "--set", "adapter.dora=true", "--set",
                  "export.formats=[peft, gguf]")  # fmt: skip
    assert bad.returncode == 2 and "no GGUF LoRA form" in bad.stderr
