"""The GGUF conversion rules, without llama.cpp: names, the rotary permutation of q/k, the scale
folded into B, refusals, and what the written adapter file holds (read back with gguf)."""

from __future__ import annotations

import numpy as np
import pytest

from lorapilot.errors import UsageError
from lorapilot.export import gguf_files as gf
from lorapilot.export.weights import Weights, of_folder, read_safetensors

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 16,
    "tie_word_embeddings": True,
}


def _adapter(rank=2, modules=("q_proj", "k_proj", "v_proj"), seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(2):
        for m in modules:
            width = 16 if m == "q_proj" else 8
            key = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            out[f"{key}.lora_A.weight"] = rng.normal(size=(rank, 16)).astype(np.float32)
            out[f"{key}.lora_B.weight"] = rng.normal(size=(width, rank)).astype(np.float32)
    return out


def test_names_shapes_and_rotary_permutation_of_b():
    w = _adapter()
    alpha, tensors = gf.lora_tensors(w, {"lora_alpha": 4, "r": 2}, CONFIG, "adapter")
    got = dict(tensors)
    assert alpha == 4.0
    assert set(got) == {
        f"blk.{i}.attn_{m}.weight.lora_{ab}" for i in (0, 1) for m in "qkv" for ab in "ab"
    }
    a = w["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    b = w["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_array_equal(got["blk.0.attn_q.weight.lora_a"], a)
    # q rows permuted over 4 heads (head dim 4: rows [0, 2, 1, 3] of each head), k over 2
    perm_q = np.concatenate([h * 4 + np.array([0, 2, 1, 3]) for h in range(4)])
    np.testing.assert_array_equal(got["blk.0.attn_q.weight.lora_b"], b[perm_q])
    kb = w["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"]
    np.testing.assert_array_equal(got["blk.0.attn_k.weight.lora_b"], kb[perm_q[:8]])
    vb = w["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"]
    np.testing.assert_array_equal(got["blk.0.attn_v.weight.lora_b"], vb)  # v: not rotated


def test_qwen2_rows_are_not_permuted():
    w = _adapter(modules=("q_proj",))
    cfg = CONFIG | {"architectures": ["Qwen2ForCausalLM"]}
    _, tensors = gf.lora_tensors(w, {"lora_alpha": 4}, cfg, "adapter")
    b = w["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    np.testing.assert_array_equal(dict(tensors)["blk.0.attn_q.weight.lora_b"], b)


def test_rslora_and_alpha_pattern_are_folded_into_b():
    """llama.cpp scales by alpha / rank; rsLoRA's alpha / sqrt(r) and a per-module alpha must
    come out as the same product scale * B @ A."""
    w = _adapter(rank=4, modules=("v_proj",))
    cfg = {"lora_alpha": 8, "use_rslora": True, "alpha_pattern": {"layers.1.self_attn.v_proj": 2}}
    alpha, tensors = gf.lora_tensors(w, cfg, CONFIG, "adapter")
    got = dict(tensors)
    for layer, peft_scale in ((0, 8 / 2.0), (1, 2 / 2.0)):  # alpha / sqrt(4)
        key = f"base_model.model.model.layers.{layer}.self_attn.v_proj"
        want = peft_scale * w[f"{key}.lora_B.weight"] @ w[f"{key}.lora_A.weight"]
        served = (
            (alpha / 4)
            * got[f"blk.{layer}.attn_v.weight.lora_b"]
            @ got[f"blk.{layer}.attn_v.weight.lora_a"]
        )
        np.testing.assert_allclose(served, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("config", "extra", "says"),
    [
        ({"use_dora": True}, {}, "DoRA"),
        ({"modules_to_save": ["norm"]}, {}, "--merge"),
        ({}, {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((2, 4))}, "A/B"),
    ],
)
def test_what_a_gguf_lora_cannot_carry_is_refused(config, extra, says):
    with pytest.raises(UsageError, match=says):
        gf.lora_tensors(_adapter() | extra, {"lora_alpha": 4} | config, CONFIG, "adapter")


def test_an_unsupported_architecture_is_named():
    cfg = CONFIG | {"architectures": ["GPTNeoXForCausalLM"]}
    with pytest.raises(UsageError, match="GPTNeoXForCausalLM is not one the GGUF export"):
        gf.lora_tensors(_adapter(), {"lora_alpha": 4}, cfg, "adapter")


def test_adapter_file_reads_back_as_a_llama_cpp_lora(tmp_path):
    import gguf

    _, tensors = gf.lora_tensors(_adapter(), {"lora_alpha": 4}, CONFIG, "adapter")
    path = tmp_path / "adapter.gguf"
    gf.write_adapter_gguf(path, "llama", 4.0, tensors, "t")
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.type"].contents() == "adapter"
    assert r.fields["adapter.type"].contents() == "lora"
    assert r.fields["adapter.lora.alpha"].contents() == 4.0
    assert r.fields["general.architecture"].contents() == "llama"
    shapes = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert shapes["blk.0.attn_q.weight.lora_a"] == (16, 2)  # ggml order: [in, r]
    assert shapes["blk.0.attn_q.weight.lora_b"] == (2, 16)  # [r, out]


def test_model_tensors_leave_out_a_tied_head_and_permute_q():
    rng = np.random.default_rng(1)
    w = {
        "model.embed_tokens.weight": rng.normal(size=(10, 16)),
        "lm_head.weight": rng.normal(size=(10, 16)),
        "model.layers.0.self_attn.q_proj.weight": rng.normal(size=(16, 16)),
        "model.norm.weight": np.ones(16),
    }
    got = {t.name: t.load() for t in gf.model_tensors(Weights.of(w), CONFIG, "base")}
    assert set(got) == {"token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"}
    perm = np.concatenate([h * 4 + np.array([0, 2, 1, 3]) for h in range(4)])
    np.testing.assert_allclose(
        got["blk.0.attn_q.weight"], w["model.layers.0.self_attn.q_proj.weight"][perm]
    )


def test_a_bf16_checkpoint_is_read_as_float32_exactly(tmp_path):
    """Most 1-8B bases ship bf16 safetensors, which numpy has no dtype for: they are read
    through torch and widened (exactly), so `export --gguf` converts them (it failed before)."""
    import torch
    from safetensors.torch import save_file

    w = torch.randn(4, 6).to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": w, "step": torch.tensor([3])},
              str(tmp_path / "model-00001.safetensors"))  # fmt: skip
    save_file({"lm_head.weight": w.half()}, str(tmp_path / "model-00002.safetensors"))
    got = read_safetensors(tmp_path / "model-00001.safetensors")
    assert got["model.embed_tokens.weight"].dtype == np.float32
    assert np.array_equal(got["model.embed_tokens.weight"], w.float().numpy())
    assert got["step"].dtype == np.int64 and got["step"].tolist() == [3]
    both = of_folder(tmp_path)
    assert set(both) == {"model.embed_tokens.weight", "step", "lm_head.weight"}
    assert both.shape("lm_head.weight") == (4, 6)
    assert np.array_equal(both["lm_head.weight"], w.half().float().numpy())


def _tiny_llama(tmp_path):
    """A Hugging Face folder of random float32 weights (2 blocks), for the writers."""
    rng = np.random.default_rng(0)
    w = {"model.embed_tokens.weight": rng.normal(size=(10, 64)), "model.norm.weight": np.ones(64)}
    for i in range(2):
        w[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.normal(size=(64, 64))
        w[f"model.layers.{i}.mlp.down_proj.weight"] = rng.normal(size=(64, 96))
        w[f"model.layers.{i}.mlp.up_proj.weight"] = rng.normal(size=(96, 40))  # rows not q8-able
    return {k: v.astype(np.float32) for k, v in w.items()}


CONFIG64 = {**CONFIG, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
            "num_hidden_layers": 2}  # fmt: skip


@pytest.mark.parametrize("base_type", ["f32", "f16"])
def test_the_streamed_writer_writes_what_ggufs_own_writer_writes(tmp_path, base_type):
    """Tensors are written one at a time (infos first): the file is byte for byte the one
    gguf's in-memory writer makes of the same tensors."""
    import gguf

    w = _tiny_llama(tmp_path)
    tensors = gf.model_tensors(Weights.of(w), CONFIG64, "base")
    streamed = gguf.GGUFWriter(str(tmp_path / "streamed.gguf"), "llama")
    gf._write_model_tensors(streamed, tensors, base_type)
    whole = gguf.GGUFWriter(str(tmp_path / "whole.gguf"), "llama")
    for t in tensors:
        data = t.load()
        whole.add_tensor(
            t.name, data if data.ndim < 2 or base_type == "f32" else data.astype(np.float16)
        )
    gf._finish(whole)
    assert (tmp_path / "streamed.gguf").read_bytes() == (tmp_path / "whole.gguf").read_bytes()


def test_a_q8_0_base_is_written_with_its_real_shapes(tmp_path):
    """`--gguf-base q8_0` stopped with a ValueError before (the float shape was passed where
    gguf wants the byte shape): rows of whole 32-blocks are Q8_0, the rest F16, vectors F32."""
    import gguf

    w = _tiny_llama(tmp_path)
    writer = gguf.GGUFWriter(str(tmp_path / "q8.gguf"), "llama")
    gf._write_model_tensors(writer, gf.model_tensors(Weights.of(w), CONFIG64, "b"), "q8_0")
    r = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "q8.gguf")).tensors}
    q8 = r["blk.0.ffn_down.weight"]
    assert q8.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert tuple(int(x) for x in reversed(q8.shape)) == (64, 96)
    back = gguf.quants.dequantize(q8.data, q8.tensor_type)
    want = w["model.layers.0.mlp.down_proj.weight"]
    assert back.shape == want.shape and np.abs(back - want).max() < 0.02 * np.abs(want).max()
    assert r["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.F16  # 40: no block
    assert r["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_a_conversion_holds_one_tensor_at_a_time(tmp_path):
    """The writer reads each tensor only after every tensor's info is written and drops it
    before the next: what keeps an 8B export inside a 24 GB machine (bench/gguf_memory.py)."""
    import weakref

    import gguf

    w = _tiny_llama(tmp_path)
    alive: list = []
    most = [0]

    def read(key):
        a = w[key].copy()
        alive.append(weakref.ref(a))
        most[0] = max(most[0], sum(r() is not None for r in alive))
        return a

    weights = Weights({k: v.shape for k, v in w.items()}, read)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    gf._write_model_tensors(writer, gf.model_tensors(weights, CONFIG64, "b"), "f16")
    assert len(alive) == len(w) and most[0] == 1
