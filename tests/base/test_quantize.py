"""Quantized bases (model.quantization): the spec's refusals, QLoRA training with an audit
that covers the quantization state, the exact base identity, verify's refusal of another
quantization, the merge onto the dequantized weights, and the memory model's weight bytes.
All on a tiny random Llama quantized on the CPU by bitsandbytes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import EXAMPLES, need_llama_cpp, run_cli, run_json

from lorapilot.base import quantize
from lorapilot.sizing.memory import ModelShape, decoder_linear_params, estimate_step_memory
from lorapilot.spec import QuantizationSpec, requirements

Q4 = {"bits": 4, "compute_dtype": "fp32"}  # fp32 compute: exact and fast on any CPU


def _pilot(root, tiny_model_dir, quantization, **train):
    pilot = root / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir), "quantization": quantization}
    spec["train"].update(max_steps=3, lr=0.01, precision="fp32", **train)
    spec["eval"] = {**(spec.get("eval") or {}), "precision": "fp32"}
    spec["data"]["split"]["val"] = 0.04  # 30 validation tickets: the checks in seconds
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    pilot = _pilot(tmp_path_factory.mktemp("q4"), tiny_model_dir, Q4)
    return pilot, run_json("train", str(pilot), "--no-progress")


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("quantization", "adapter", "needle"),
    [
        ({"bits": 3}, {}, "model.quantization.bits"),
        ({"bits": 4, "type": "int4"}, {}, "model.quantization.type"),
        ({"bits": 8, "type": "nf4"}, {}, "type applies to 4-bit quantization only"),
        ({"bits": 4}, {"method": "full"}, "model.quantization: a quantized base cannot be"),
    ],
)
def test_bad_quantization_is_exit_2_naming_the_key(
    tmp_path, tiny_model_dir, quantization, adapter, needle
):
    pilot = _pilot(tmp_path, tiny_model_dir, quantization)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["adapter"].update(adapter)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = run_cli("check", str(pilot))
    assert proc.returncode == 2, proc.stderr
    assert needle in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr


def test_missing_extra_is_refused_up_front(tmp_path, tiny_model_dir, monkeypatch):
    from typer.testing import CliRunner

    from lorapilot.cli import app

    monkeypatch.setattr(requirements, "bitsandbytes_version", lambda: None)
    pilot = _pilot(tmp_path, tiny_model_dir, Q4)
    res = CliRunner().invoke(app, ["check", str(pilot)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "model.quantization needs bitsandbytes" in text and ".[quant]" in text


def test_defaults_are_qlora_and_the_variant_is_one_change_of_group_model():
    from lorapilot.spec import variant_label

    q = QuantizationSpec(bits=4)
    assert (q.type, q.double_quant, q.compute_dtype) == ("nf4", True, "auto")
    # `auto` is resolved where it is recorded: the base identity holds the real dtype
    assert quantize.describe(q)["compute_dtype"] == quantize.compute_dtype(q)
    assert quantize.compute_dtype(q) in ("bf16", "fp16", "fp32")
    assert quantize.describe(QuantizationSpec(bits=4, compute_dtype="fp16"))["compute_dtype"] == (
        "fp16"
    )
    diff = {
        "model.quantization.bits": [None, 4],
        "model.quantization.compute_dtype": [None, "fp32"],
    }
    assert variant_label(diff) == "one_change"


# --------------------------------------------------------------------------- memory


def test_weight_bytes_per_param_hand_computed():
    assert quantize.weight_bytes_per_param(QuantizationSpec(bits=8)) == 1.0
    plain = QuantizationSpec(bits=4, double_quant=False)
    assert quantize.weight_bytes_per_param(plain) == 0.5 + 4 / 64  # fp32 absmax per 64
    double = QuantizationSpec(bits=4)
    assert quantize.weight_bytes_per_param(double) == 0.5 + 1 / 64 + 4 / (64 * 256)


def test_quantized_weights_in_the_memory_model():
    smol = ModelShape.from_config({
        "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "tie_word_embeddings": True,
    })  # fmt: skip
    args = dict(trainable_params=4_000_000, micro_batch=8, seq_len=100, precision="fp32",
                grad_checkpointing=False, weight_dtype_bytes=4)  # fmt: skip
    full = estimate_step_memory(smol, **args)
    q = QuantizationSpec(bits=4, compute_dtype="fp32")
    q4 = estimate_step_memory(smol, **args, quantized_bytes_per_param=0.515625 + 1 / 4096,
                              dequantize_bytes=4)  # fmt: skip
    linears = decoder_linear_params(smol)
    assert q4["weights"] == pytest.approx(
        (smol.n_params - linears) * 4 + linears * quantize.weight_bytes_per_param(q), abs=1
    )
    assert q4["weights"] < full["weights"] / 3  # ~85% of SmolLM2's weights are decoder linears
    assert q4["dequantize"] == 576 * 1536 * 4 and full["dequantize"] == 0


# --------------------------------------------------------------------------- train, audit


def test_qlora_train_audits_the_quantization_state_and_records_the_exact_base(trained):
    pilot, out = trained
    assert out["status"] == "completed" and out["update_audit"]["ok"]
    audit = out["update_audit"]
    # 2 layers x 7 linears x (packed weight, absmax, quant map, nested absmax, nested map,
    # packed quant state)
    assert audit["quant_state"] == {"tensors": 84, "changed": []}
    ident = out["base_identity"]
    assert ident["quantization"] == {"bits": 4, "type": "nf4", "double_quant": True,
                                     "compute_dtype": "fp32", "block_size": 64}  # fmt: skip
    assert ident["bitsandbytes"] == "0.50.2" and len(ident["weights_sha256"]) == 64
    manifest = json.loads(
        (pilot / "runs" / out["run_id"] / "adapter" / "lorapilot.json").read_text()
    )
    assert manifest["base_identity"] == ident
    assert manifest["needs_quantization"] == ident["quantization"]
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert rec["result"]["adapter"]["kbit_prepared"] is True


def test_audit_fails_when_the_quantization_state_changes(tiny_model_dir):
    from lorapilot.base.adapter import build_adapter
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.spec import AdapterSpec, TrainSpec
    from lorapilot.train.audit import run_update_audit
    from lorapilot.train.loss import causal_lm_loss_sum
    from lorapilot.train.step import make_optimizer

    model, _ = load_model(resolve_base(str(tiny_model_dir), None), "float32", False,
                          QuantizationSpec(bits=4, compute_dtype="fp32"))  # fmt: skip
    model, _ = build_adapter(model, AdapterSpec(r=4), seed=0)
    absmax = model.base_model.model.model.layers[0].mlp.down_proj.base_layer.weight.quant_state
    x = torch.randint(0, 500, (2, 10))
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x}

    def buggy_loss(m, b):  # a bug that rescales the frozen 4-bit block scales
        absmax.absmax.add_(1)
        return causal_lm_loss_sum(m, b)

    audit = run_update_audit(model, [batch], lambda m: make_optimizer(m, TrainSpec()),
                             loss_fn=buggy_loss)  # fmt: skip
    assert not audit["ok"] and audit["quant_state"]["changed"]
    assert any("quantization-state" in p for p in audit["problems"])


# --------------------------------------------------------------------------- verify, export


def test_verify_reloads_quantized_and_refuses_another_quantization(trained):
    pilot, out = trained
    ok = run_json("verify", str(pilot))
    assert ok["ok"] and ok["n_mismatched_predictions"] == 0 and ok["metrics_match"]
    manifest_path = pilot / "runs" / out["run_id"] / "adapter" / "lorapilot.json"
    original = manifest_path.read_text()
    manifest = json.loads(original)
    manifest["base_identity"]["quantization"]["type"] = "fp4"  # trained on fp4, supposedly
    manifest_path.write_text(json.dumps(manifest))
    try:
        proc = run_cli("verify", str(pilot), "--json")
    finally:
        manifest_path.write_text(original)
    assert proc.returncode == 1, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "not the one the adapter was trained on: quantization" in text and "fp4" in text


def test_export_merges_onto_the_dequantized_weights_and_measures_agreement(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    pilot, out = trained
    res = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert res["ok"] and res["merge_agreement"] >= 0.99
    assert res["merge_agreement_examples"] > 0 and "dequantized" in res["merged_onto"]
    manifest = json.loads((tmp_path / "merged" / "lorapilot.json").read_text())
    assert manifest["merge_agreement"] == res["merge_agreement"]
    assert manifest["base_identity"]["quantization"]["bits"] == 4
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True)
    assert not getattr(merged, "is_quantized", False)  # a plain model: loads anywhere


def test_a_quantized_variant_of_an_unquantized_pilot_exports_with_its_own_recipe(
    tmp_path, tiny_model_dir
):
    """`export` takes the run's variant (as verify and eval do), not the pilot's base recipe:
    otherwise a 4-bit variant's adapter is refused as trained on another base."""
    pilot = _pilot(tmp_path, tiny_model_dir, None)
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    nf4 = {"model.quantization.bits": 4, "model.quantization.compute_dtype": "fp32"}
    spec["variants"] = [{"name": "nf4", "set": nf4}]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_json("train", str(pilot), "--variant", "nf4", "--no-progress")
    assert out["base_identity"]["quantization"]["bits"] == 4
    res = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert res["ok"] and res["train_run"] == out["run_id"] and res["merge_agreement"] >= 0.99
    assert "dequantized" in res["merged_onto"]


def test_probe_estimates_the_quantized_step(tmp_path, tiny_model_dir):
    pilot = _pilot(tmp_path, tiny_model_dir, Q4)
    out = run_json("probe", str(pilot), "--no-progress")
    rows = [r for r in out["measurements"] if r["ok"]]
    assert rows and all("dequantize" in r["estimate_components"] for r in rows)
    weights = rows[0]["estimate_components"]["weights"]
    assert out["load"]["weights_bytes"] == pytest.approx(weights, rel=0.05)


def test_an_evaluation_pass_leaves_4bit_training_gradients_exact(tmp_path, default_model_dir):
    """bitsandbytes repacks a 4-bit weight in place for its CPU inference kernel (AVX512-BF16
    CPUs, eval mode, no grad), and a training step after that got zero LoRA gradients
    (`gemv_4bit` has no autograd kernel). lorapilot keeps one path: the gradients after a
    validation pass are those of a model that never evaluated. 64 wide: a quantization
    block, as the repacking needs."""
    from lorapilot.base.adapter import build_adapter
    from lorapilot.base.models import load_model, make_tiny_model, resolve_base
    from lorapilot.spec import AdapterSpec
    from lorapilot.train.loss import causal_lm_loss_sum

    folder = make_tiny_model(
        tmp_path / "m", tokenizer_dir=default_model_dir, hidden_size=64, intermediate_size=128
    )
    ids = torch.arange(100, 124).reshape(2, 12)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def lora_grads(evaluate_first: bool) -> dict:
        q = QuantizationSpec(bits=4, compute_dtype="bf16")
        model, _ = load_model(resolve_base(str(folder)), "float32", False, q)
        model, _ = build_adapter(model, AdapterSpec(r=4, alpha=8, dropout=0.0), seed=0)
        assert not any(getattr(m, "support_avx512bf16_for_cpu", False) for m in model.modules())
        if evaluate_first:
            model.eval()
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                causal_lm_loss_sum(model, batch)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _ = causal_lm_loss_sum(model, batch)
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    plain, after_eval = lora_grads(False), lora_grads(True)
    assert set(plain) == set(after_eval)
    assert sum(int(g.abs().sum() > 0) for g in plain.values()) > len(plain) // 3
    for name, grad in plain.items():
        assert torch.equal(grad, after_eval[name]), name


def test_a_bf16_compute_merge_is_gated_like_with_like_and_saved_as_merged(tmp_path, tiny_model_dir):
    """#36 item 7: with 4-bit layers computing in bf16 and evaluation in bf16, the merge's
    gate compares adapter and merged model both in fp32 (`merge_agreement_precision`), the
    agreement in the protocol's precision is reported beside it, and the folder holds the
    merged weights in fp32 (the bf16 evaluation does not cast what is saved)."""
    import torch
    from safetensors import safe_open

    pilot = _pilot(tmp_path, tiny_model_dir, {"bits": 4, "compute_dtype": "bf16"})
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["eval"]["precision"] = "bf16"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_json("train", str(pilot), "--no-progress")
    res = run_json("export", str(pilot), "--merge", "--out", str(tmp_path / "merged"))
    assert res["ok"] and res["merge_agreement_precision"] == "fp32"
    assert res["merge_agreement"] >= 0.99
    assert 0 <= res["merge_agreement_in_protocol_precision"] <= 1
    manifest = json.loads((tmp_path / "merged" / "lorapilot.json").read_text())
    assert manifest["merge_agreement_precision"] == "fp32"
    with safe_open(str(tmp_path / "merged" / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert dtypes == {"F32"}
    assert (q.view(torch.int32) & 0xFFFF).ne(0).any()  # not values rounded to bf16 and back


def test_a_dequantized_model_is_no_longer_quantized(tiny_model_dir):
    """transformers' dequantize() leaves `is_loaded_in_4bit` set: the plain model must still
    be evaluated as a plain one (cast to the protocol's dtype), not as a 4-bit base."""
    from lorapilot.base.models import load_model, resolve_base
    from lorapilot.base.quantize import is_quantized

    model, _ = load_model(resolve_base(str(tiny_model_dir), None), "float32", False,
                          QuantizationSpec(**Q4))  # fmt: skip
    assert is_quantized(model)
    plain = model.dequantize()
    assert getattr(plain, "is_loaded_in_4bit", False) and not is_quantized(plain)


def test_gguf_export_serves_the_dequantized_weights_the_adapter_was_trained_on(
    trained, tmp_path, tiny_model_dir
):
    """A 4-bit adapter learned against the dequantized 4-bit weights, not the original ones:
    base.gguf holds those (f16), so the served model is the trained one and the check gates."""
    need_llama_cpp()
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    from lorapilot.base.models import load_base
    from lorapilot.spec import load_pilot

    pilot, _ = trained
    proc = run_cli("export", str(pilot), "--gguf", "--out", str(tmp_path / "g"), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    base = out["base_gguf"]
    assert base["type"] == "f16" and base["trained_on"] is True and out["gated"] is True
    assert base["quantization"]["bits"] == 4 and "4-bit nf4 weights dequantized" in base["note"]
    key = "model.layers.0.mlp.down_proj.weight"  # not rope-permuted: compared as it is
    (tensor,) = [t for t in gguf.GGUFReader(str(tmp_path / "g" / "base.gguf")).tensors
                 if t.name == "blk.0.ffn_down.weight"]  # fmt: skip
    served = np.asarray(tensor.data, dtype=np.float32)
    _, model, _ = load_base(load_pilot(pilot), use="exact")
    trained_on = model.dequantize().state_dict()[key].float().numpy()
    original = load_file(str(tiny_model_dir / "model.safetensors"))[key].astype(np.float32)
    assert served.shape == trained_on.shape
    scale = np.abs(original).max()
    assert np.abs(served - trained_on).max() < 1e-3 * scale  # f16 of the trained-on weights
    assert np.abs(served - original).max() > 1e-2 * scale  # not the unquantized original
    (conf,) = out["configs"]
    assert conf["ties"]["score_noise_max"] < 0.05  # the same model, up to f16 and the runtime


def test_the_gguf_weights_are_transformers_dequantize_tensor_by_tensor(trained):
    """`export --gguf` dequantizes a 4-bit base one linear at a time (an 8B base whole in
    float32 is 32 GB): every tensor is exactly what `model.dequantize()` gives."""
    import numpy as np

    from lorapilot.base.models import load_base, load_tokenizer
    from lorapilot.export.gguf_export import _dequantized_weights
    from lorapilot.spec import load_pilot

    p = load_pilot(trained[0])
    resolved, _ = load_tokenizer(p)
    lazy = _dequantized_weights(p, resolved, lambda m: None)
    _, model, _ = load_base(p, resolved, use="exact")
    want = model.dequantize().state_dict()
    compared = 0
    for key in lazy:
        got = lazy[key]
        assert got.shape == lazy.shape(key)
        if key in want:
            assert np.array_equal(got, want[key].float().numpy()), key
            compared += 1
    assert compared == len(lazy) and any("down_proj" in k for k in lazy)
