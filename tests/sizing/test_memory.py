"""The analytic memory model: shapes from configs, components, and how they scale."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lorapilot.sizing.memory import (
    COMPONENTS,
    GIB,
    ModelShape,
    estimate_step_memory,
    layer_activation_bytes,
    llama_param_count,
    to_gib,
)

LLAMA2_7B = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
SMOLLM2_135M = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
TINY = ModelShape(
    n_params=1_000_000, n_layers=2, hidden=256, intermediate=688, n_heads=8, n_kv_heads=4,
    vocab=1000, tied_embeddings=True,
)  # fmt: skip


def step(shape: ModelShape = TINY, **kw) -> dict:
    args = dict(
        trainable_params=10_000,
        weight_dtype_bytes=4,
        micro_batch=4,
        seq_len=256,
        precision="bf16",
        grad_checkpointing=False,
    )
    return estimate_step_memory(shape, **{**args, **kw})


# --------------------------------------------------------------------------- shapes


def test_param_counts_of_known_models():
    llama = ModelShape.from_config(LLAMA2_7B)
    assert llama.n_params == 6_738_415_616  # Llama-2-7b's published count
    assert llama.head_dim == 128 and llama.kv_dim == 4096
    smol = ModelShape.from_config(SMOLLM2_135M)
    assert 134e6 < smol.n_params < 135e6  # SmolLM2-135M (tied head counted once)
    assert smol.head_dim == 64 and smol.kv_dim == 192


def test_from_config_takes_a_given_count_defaults_and_text_config():
    shape = ModelShape.from_config(LLAMA2_7B, n_params=7)
    assert shape.n_params == 7
    no_kv = {k: v for k, v in LLAMA2_7B.items() if k != "num_key_value_heads"}
    assert ModelShape.from_config(no_kv).n_kv_heads == 32
    nested = ModelShape.from_config({"model_type": "llava", "text_config": SMOLLM2_135M})
    assert nested == ModelShape.from_config(SMOLLM2_135M)
    untied = llama_param_count(**{**_kwargs(SMOLLM2_135M), "tied_embeddings": False})
    assert untied - ModelShape.from_config(SMOLLM2_135M).n_params == 49152 * 576


def _kwargs(cfg: dict) -> dict:
    s = ModelShape.from_config(cfg)
    return dict(
        n_layers=s.n_layers, hidden=s.hidden, intermediate=s.intermediate, n_heads=s.n_heads,
        n_kv_heads=s.n_kv_heads, vocab=s.vocab, tied_embeddings=s.tied_embeddings,
    )  # fmt: skip


def test_from_config_names_a_missing_key_and_checks_values():
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_config({k: v for k, v in LLAMA2_7B.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="n_layers"):
        ModelShape.from_config({**LLAMA2_7B, "num_hidden_layers": 0})
    with pytest.raises(ValueError, match="multiple"):
        ModelShape.from_config({**LLAMA2_7B, "num_key_value_heads": 5})


# --------------------------------------------------------------------------- components


def test_components_sum_to_total():
    for kw in ({}, {"grad_checkpointing": True}, {"adapter": "full", "trainable_params": 10**6}):
        est = step(**kw)
        assert set(est) == {*COMPONENTS, "total"}
        assert sum(est[k] for k in COMPONENTS) == est["total"]
        assert all(isinstance(v, int) and v >= 0 for v in est.values())


def test_7b_weights_in_bf16_are_13_to_14_gb():
    shape = ModelShape.from_config(LLAMA2_7B)
    est = step(shape, weight_dtype_bytes=2, trainable_params=40_000_000, grad_accum=2)
    assert 13e9 < est["weights"] < 14e9
    # LoRA: adapter in fp32 + fp32 gradient + AdamW's two fp32 states = 16 bytes per param
    # (with accumulation the gradients are alive through the next micro-batch's peak)
    assert est["trainable_master"] == est["gradients"] == 4 * 40_000_000
    assert est["optimizer_states"] == 8 * 40_000_000


def test_lora_gradients_count_only_where_they_outlive_the_activations():
    """One micro-batch per update: backward frees a layer's activations as it allocates its
    gradients, so the peak is backward's start (activations, logits, no gradient) or its end
    (every gradient, one layer), whichever is larger; with accumulation, both at once."""
    one = step(trainable_params=10_000)
    assert one["gradients"] == 0 and one["activations"] > 4 * 10_000
    acc = step(trainable_params=10_000, grad_accum=4)
    assert acc["gradients"] == 4 * 10_000 and acc["activations"] == one["activations"]
    assert acc["total"] > one["total"]
    huge = step(trainable_params=10**9, seq_len=8, micro_batch=1)  # gradients outweigh
    assert huge["gradients"] == 4 * 10**9 and huge["logits"] == 0
    assert huge["activations"] < step(trainable_params=10**9, seq_len=8, micro_batch=1,
                                      grad_accum=2)["activations"]  # fmt: skip


def test_under_checkpointing_the_logits_and_a_recomputed_layer_do_not_coexist():
    """The step peaks at the forward's end (the logits, the head's and the adapter's weight
    copies) or while a layer is recomputed (its activations and copies), never both."""
    from lorapilot.sizing.memory import checkpointed_cast_moments, decoder_linear_params

    few = dict(grad_checkpointing=True, loss_positions_per_example=4)
    one, acc = step(**few), step(**few, grad_accum=2)
    assert one["logits"] == 0 < acc["logits"]  # a recomputed layer outweighs a few logits
    at_head, in_layer = checkpointed_cast_moments(
        TINY, precision="bf16", weight_dtype_bytes=4, trainable_params=10_000
    )
    assert at_head == 2 * (1000 * 256 + 10_000)  # the tied head's copy, the adapter's
    assert one["weight_casts"] == in_layer == 2 * ((decoder_linear_params(TINY) + 10_000) // 2)
    every = dict(grad_checkpointing=True, loss_positions_per_example=None)  # full logits
    wide = dataclasses.replace(TINY, vocab=100_000)  # logits outweigh a layer
    one, acc = step(wide, **every), step(wide, **every, grad_accum=2)
    assert one["logits"] == acc["logits"] == 4 * 256 * 100_000 * 12
    head_moment = one["activations"] + one["logits"] + one["weight_casts"]
    assert one["weight_casts"] == 2 * (100_000 * 256 + 10_000)  # the head's and the adapter's
    assert acc["activations"] - one["activations"] > 0  # no recomputed layer beside them
    assert head_moment < acc["activations"] + acc["logits"] + acc["weight_casts"]


def test_shared_prefix_under_checkpointing_keeps_the_prefix_keys_and_values_once():
    kw = dict(grad_checkpointing=True, micro_batch=4, seq_len=256, loss_positions_per_example=4)
    plain, shared = step(**kw), step(**kw, shared_prefix_tokens=200)
    assert shared["activations"] < plain["activations"]
    full = step(grad_checkpointing=False, micro_batch=4, seq_len=256, shared_prefix_tokens=200)
    assert shared["activations"] < full["activations"]
    # By hand: every layer's input for the tokens computed (the prefix once, each row's
    # rest), the prefix's keys after RoPE in the residual stream's dtype (fp32 over fp32
    # weights: tests/train/test_shared_prefix.py) and its values in bf16, one layer
    # recomputed (its activations for the tokens computed, plus the prefix's keys and
    # values every row's attention keeps, at every head's width under SDPA), the final norm.
    tokens, computed = 4 * 256, 4 * 256 - 3 * 200
    full_layer = layer_activation_bytes(
        TINY, micro_batch=4, seq_len=256, precision="bf16", weight_dtype_bytes=4
    )["total"]
    layer = math.ceil(full_layer * computed / tokens + 2 * 2 * TINY.q_dim * (tokens - computed))
    kept = TINY.n_layers * (4 * TINY.hidden * computed + (4 + 2) * TINY.kv_dim * 200)
    assert shared["activations"] == kept + layer + 4 * TINY.hidden * computed


def test_full_fine_tuning_keeps_states_in_the_weight_dtype():
    n = TINY.n_params
    fp32 = step(adapter="full", trainable_params=n)
    assert fp32["trainable_master"] == 0
    assert fp32["gradients"] == 4 * n and fp32["optimizer_states"] == 8 * n
    bf16 = step(adapter="full", trainable_params=n, weight_dtype_bytes=2)
    assert bf16["gradients"] == 2 * n and bf16["optimizer_states"] == 4 * n
    assert step(optimizer="sgd")["optimizer_states"] == 0


def test_workspace_is_the_stated_fraction():
    est = step(workspace_fraction=0.25)
    rest = sum(est[k] for k in COMPONENTS if k != "workspace")
    assert est["workspace"] == int(0.25 * rest)
    assert step(workspace_fraction=0.0)["workspace"] == 0
    assert step(workspace_fraction=1.0)["workspace"] == rest  # a CPU heap with checkpointing


# --------------------------------------------------------------------------- scaling


def test_activations_are_linear_in_batch_and_length_with_sdpa():
    a = step(micro_batch=2, seq_len=256)["activations"]
    assert step(micro_batch=4, seq_len=256)["activations"] == pytest.approx(2 * a, rel=1e-6)
    assert step(micro_batch=2, seq_len=512)["activations"] == pytest.approx(2 * a, rel=1e-6)


def test_a_shared_prefix_saves_the_rows_copies_of_it_but_not_their_keys_and_values():
    """The prefix runs once: a layer keeps n + b(s - n) tokens' activations, plus each row's
    keys and values over the whole length (the prefix's, concatenated with its own)."""
    from lorapilot.sizing.memory import layer_activation_bytes

    b, s, n = 4, 256, 192
    base = step(micro_batch=b, seq_len=s)
    assert step(micro_batch=b, seq_len=s, shared_prefix_tokens=0) == base
    assert step(micro_batch=1, seq_len=s, shared_prefix_tokens=n) == step(micro_batch=1, seq_len=s)
    shared = step(micro_batch=b, seq_len=s, shared_prefix_tokens=n)
    layer = layer_activation_bytes(
        TINY, micro_batch=b, seq_len=s, precision="bf16", weight_dtype_bytes=4
    )["total"]
    computed = n + b * (s - n)
    # bf16 keys and values of the prefix, per row, repeated to every head (SDPA under a mask)
    kv = 2 * 2 * TINY.q_dim * (b * s - computed)
    per_layer = math.ceil(layer * computed / (b * s) + kv)
    assert shared["activations"] == TINY.n_layers * per_layer + 4 * TINY.hidden * computed
    assert shared["activations"] < base["activations"] and shared["logits"] == base["logits"]


def test_eager_attention_grows_quadratically_in_length():
    def attn(s):
        return layer_activation_bytes(
            TINY,
            micro_batch=1,
            seq_len=s,
            precision="bf16",
            weight_dtype_bytes=4,
            attention="eager",
        )["attention"]

    per_token = 3 * 2 * TINY.q_dim  # q and k, v repeated to every head, in bf16
    probs = (4 + 2) * TINY.n_heads  # fp32 softmax + its bf16 cast, per token per key
    for s in (128, 1024):
        assert attn(s) == s * per_token + s * s * probs
    sdpa = step(seq_len=2048)["activations"]
    assert step(seq_len=2048, attention="eager")["activations"] > 2 * sdpa


def test_checkpointing_reduces_activations():
    shape = ModelShape.from_config(SMOLLM2_135M)
    full = step(shape, micro_batch=8, seq_len=1024)
    ckpt = step(shape, micro_batch=8, seq_len=1024, grad_checkpointing=True)
    assert ckpt["activations"] < full["activations"] / 5
    # the logits at every position (4.8 GB) outweigh a recomputed layer: the peak is at the
    # forward's end; at a few answer positions it is while a layer is recomputed
    ckpt = step(shape, micro_batch=8, seq_len=1024, grad_checkpointing=True,
                loss_positions_per_example=8)  # fmt: skip
    assert ckpt["total"] < full["total"]
    # what is kept: each layer's fp32 input + one layer recomputed + the final norm
    layer = layer_activation_bytes(
        shape, micro_batch=8, seq_len=1024, precision="bf16", weight_dtype_bytes=4
    )["total"]
    tokens = 8 * 1024
    assert ckpt["activations"] == 30 * 4 * 576 * tokens + layer + 4 * 576 * tokens


def test_lm_head_at_loss_positions_reduces_logits():
    full = step(seq_len=512)
    at_answer = step(seq_len=512, loss_positions_per_example=8)
    assert full["logits"] == 4 * 512 * 1000 * 12
    assert at_answer["logits"] == 4 * 8 * 1000 * 12
    assert at_answer["total"] < full["total"]
    # more positions than tokens is capped at the sequence
    assert step(seq_len=16, loss_positions_per_example=64)["logits"] == step(seq_len=16)["logits"]


def test_layer_formula_for_lora_all_linear_in_bf16():
    """The per-token count written out by hand (it matched autograd's saved tensors to
    <0.1% for this shape; see layer_activation_bytes)."""
    h, i, a, kv, r = 256, 688, 8, 128, 16
    expected = (
        2 * 4 * h  # two RMSNorm fp32 inputs
        + 2 * (h + 2 * h)  # q, and k, v repeated to every head (SDPA under a mask)
        + 2 * h
        + 4 * a  # output, log-sum-exp
        + 3 * 2 * i  # SiLU in/out, up
        + 2 * (h + h + i)  # the adapters' inputs: q/k/v's, gate/up's, down's (o's: sdpa's)
        + 7 * 2 * r  # each adapter's rank-r output
    )
    got = layer_activation_bytes(
        TINY, micro_batch=3, seq_len=100, precision="bf16", weight_dtype_bytes=4, lora_rank=r
    )
    assert got["total"] == expected * 300
    peft = layer_activation_bytes(  # PEFT's forward: each adapter its own cast copy
        TINY, micro_batch=3, seq_len=100, precision="bf16", weight_dtype_bytes=4, lora_rank=r,
        lora_forward="peft",
    )  # fmt: skip
    assert peft["total"] - got["total"] == 2 * (6 * h + i - (h + h + i)) * 300
    flash = layer_activation_bytes(  # grouped k and v, as they are
        TINY, micro_batch=3, seq_len=100, precision="bf16", weight_dtype_bytes=4, lora_rank=r,
        attention="flash",
    )  # fmt: skip
    assert got["total"] - flash["total"] == 2 * 2 * (h - kv) * 300
    dropout = layer_activation_bytes(
        TINY, micro_batch=3, seq_len=100, precision="bf16", weight_dtype_bytes=4, lora_rank=r,
        lora_dropout=0.1,
    )  # fmt: skip
    # with dropout each adapter masks its own input (PEFT's arithmetic): + a 1-byte mask each
    assert dropout["total"] - peft["total"] == 1 * (6 * h + i) * 300
    fewer = layer_activation_bytes(
        TINY, micro_batch=3, seq_len=100, precision="bf16", weight_dtype_bytes=4, lora_rank=r,
        adapted_modules=["model.layers.0.self_attn.q_proj", "v_proj", "lm_head"],
    )  # fmt: skip
    # q and v share their input: gate/up's and down's inputs and five rank-r outputs fewer
    assert got["adapter"] - fewer["adapter"] == 300 * 2 * (h + i + 5 * r)


def test_fp32_shares_inputs_and_16_bit_compute_halves_them():
    fp32 = step(precision="fp32")["activations"]
    bf16 = step(precision="bf16")["activations"]
    assert bf16 < fp32


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="precision"):
        step(precision="fp8")
    with pytest.raises(ValueError, match="attention"):
        step(attention="ring")
    with pytest.raises(ValueError, match="optimizer"):
        step(optimizer="lion")
    with pytest.raises(ValueError, match="loss_positions"):
        step(loss_positions_per_example=0)
    with pytest.raises(ValueError, match="adapter"):
        step(adapter="ia3")


def test_to_gib():
    assert to_gib(3 * GIB) == 3.0


def test_autocast_weight_casts_of_fp32_weights():
    """bf16 autocast over fp32 weights keeps a 16-bit copy of each weight for backward
    (measured with saved-tensor hooks on SmolLM2-135M: 255 MiB of base-weight copies)."""
    from lorapilot.sizing.memory import decoder_linear_params, weight_cast_bytes

    smol = ModelShape.from_config(SMOLLM2_135M)
    linears = decoder_linear_params(smol)
    assert linears == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)
    casts = weight_cast_bytes(
        smol, precision="bf16", weight_dtype_bytes=4, grad_checkpointing=False
    )
    assert casts == 2 * (linears + 49152 * 576)
    assert 250 < casts / 2**20 < 260
    ckpt = weight_cast_bytes(smol, precision="bf16", weight_dtype_bytes=4, grad_checkpointing=True)
    assert ckpt == 2 * (linears // 30 + 49152 * 576)  # one layer while recomputed + the head
    # nothing is cast in fp32, nor when the weights are already 16-bit
    assert (
        weight_cast_bytes(smol, precision="fp32", weight_dtype_bytes=4, grad_checkpointing=False)
        == 0
    )
    assert (
        weight_cast_bytes(smol, precision="bf16", weight_dtype_bytes=2, grad_checkpointing=False)
        == 0
    )
    est = estimate_step_memory(
        smol,
        trainable_params=0,
        weight_dtype_bytes=4,
        micro_batch=8,
        seq_len=100,
        precision="bf16",
        grad_checkpointing=False,
    )
    assert est["weight_casts"] == casts


def test_eval_memory_by_hand():
    """One scoring batch with the label tree, then without it, then generation."""
    from lorapilot.sizing.memory import ModelShape, estimate_eval_memory

    shape = ModelShape(n_params=1000, n_layers=2, hidden=8, intermediate=16, n_heads=2,
                       n_kv_heads=1, vocab=100, tied_embeddings=True)  # fmt: skip
    est = estimate_eval_memory(shape, batch_size=2, prompt_len=10, dtype_bytes=4, mode="score",
                               shared_prefix_len=4, label_tokens=[2, 3],
                               workspace_fraction=0.5)  # fmt: skip
    # kv: 2 layers x (k, v) x kv_dim 4 x 4 bytes = 64 per token; 2 rows x (10 + 1 + 2) tokens
    assert est["kv_cache"] == 2 * 13 * 64
    # logits: 3 packed label tokens x 2 rows x 100 vocab x 4 bytes, then one row's fp32 copy
    # and log-probabilities at a time (3 x 100 x 8), beside the first token's fp32
    # log-probabilities (2 x 100 x 4)
    assert est["logits"] == 2 * 3 * 100 * 4 + 3 * 100 * 8 + 2 * 100 * 4
    assert est["masks"] == 2 * 3 * 13
    # one layer over the 6 own tokens of each row: 4 x 8 hidden x 4 bytes, then the larger
    # of the MLP's 3 x 16 intermediates and the 2 heads' scores over the 10-token context
    assert est["activations"] == 12 * 32 * 4 + max(12 * 48 * 4, 2 * 2 * 6 * 10 * 4)
    assert est["weights"] == 4000
    live = 1664 + 5600 + 78 + 3840
    assert est["workspace"] == live // 2 and est["total"] == 4000 + live + live // 2
    # no 4D masks: the cache is repeated once per label, logits per label row
    flat = estimate_eval_memory(shape, batch_size=2, prompt_len=10, dtype_bytes=4, mode="score",
                                label_tokens=[2, 3], tree=False, workspace_fraction=0)  # fmt: skip
    assert flat["kv_cache"] == 4 * 12 * 64 and flat["logits"] == 4 * 2 * 100 * 12
    # generation: the cache grows by max_new_tokens, logits of the last position only
    gen = estimate_eval_memory(shape, batch_size=2, prompt_len=10, dtype_bytes=2,
                               mode="generate", max_new_tokens=5, workspace_fraction=0)  # fmt: skip
    assert gen["kv_cache"] == 2 * 15 * 32 and gen["logits"] == 2 * 100 * (2 + 8)
    # many labels: the tree's logits dominate (the 77-label pilot's evaluation peak)
    many = estimate_eval_memory(shape, batch_size=2, prompt_len=10, dtype_bytes=4, mode="score",
                                label_tokens=[4] * 77, workspace_fraction=0)  # fmt: skip
    assert many["logits"] == 2 * 77 * 3 * 100 * 4 + 77 * 3 * 100 * 8 + 800 > many["kv_cache"]
    # the same labels as a trie of 100 nodes with children, searched best first in passes of
    # at most 32 tokens: the cache holds the trie at most; the logits are the larger of one
    # pass (both fp32 copies) and the packed tree the unsure prompts are handed over to
    trie = estimate_eval_memory(shape, batch_size=2, prompt_len=10, dtype_bytes=4, mode="score",
                                label_tokens=[4] * 77, tree_tokens=100, pass_tokens=32,
                                workspace_fraction=0)  # fmt: skip
    assert trie["logits"] == 800 + max(2 * 32 * 100 * 12, 2 * 100 * 100 * 4 + 100 * 100 * 8)
    assert trie["kv_cache"] == 2 * 110 * 64
    assert trie["masks"] == 2 * 32 * 110


def test_a_quantized_bases_mlp_activations_are_in_the_residual_dtype():
    """#35 item 10: bitsandbytes hands a linear's output back in its input's dtype, so on a
    4-bit base with fp32 modules the MLP's three saved tensors are fp32 under bf16 autocast
    (measured: the NF4 probe's live bytes 0.758 GiB against 0.611 estimated before, 0.748
    after; bench/README.md)."""
    from lorapilot.sizing.memory import ModelShape, layer_activation_bytes

    shape = ModelShape(n_params=1000, n_layers=2, hidden=8, intermediate=16, n_heads=2,
                       n_kv_heads=1, vocab=100, tied_embeddings=True)  # fmt: skip
    kw = dict(micro_batch=2, seq_len=5, precision="bf16")
    plain = layer_activation_bytes(shape, weight_dtype_bytes=4, **kw)
    nf4 = layer_activation_bytes(shape, weight_dtype_bytes=4, quantized=True, **kw)
    assert plain["mlp"] == 3 * 2 * 16 * 10 and nf4["mlp"] == 3 * 4 * 16 * 10
    assert {k: v for k, v in nf4.items() if k not in ("mlp", "total")} == {
        k: v for k, v in plain.items() if k not in ("mlp", "total")
    }
    # 16-bit modules around the 4-bit linears: the stream, and so the MLP, stay 16-bit
    half = layer_activation_bytes(shape, weight_dtype_bytes=2, quantized=True, **kw)
    assert half["mlp"] == 3 * 2 * 16 * 10


LLAMA3_8B = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def test_a_held_base_counts_its_linears_in_16_bits_and_no_casts_of_them():
    """model.dtype auto: frozen decoder linears (and an untied head) in bf16, the rest fp32;
    autocast has nothing to cast but the adapter and a tied head (the fp32 embeddings)."""
    from lorapilot.sizing.memory import decoder_linear_params

    smol = ModelShape.from_config(SMOLLM2_135M)  # tied head
    linears = decoder_linear_params(smol)
    kw = dict(trainable_params=0, micro_batch=8, seq_len=100, grad_checkpointing=False)
    fp32 = step(smol, **kw)
    held = step(smol, **kw, held_linear_bytes=2)
    assert held["weights"] == linears * 2 + (smol.n_params - linears) * 4
    assert held["weight_casts"] == 2 * 49152 * 576  # the tied head's copy only
    assert fp32["weight_casts"] == held["weight_casts"] + 2 * linears
    assert held["activations"] == fp32["activations"]  # the same computation
    assert held["logits"] == fp32["logits"]

    llama = ModelShape.from_config(LLAMA2_7B)  # untied head: held too
    head = 32000 * 4096
    held = step(llama, **{**kw, "trainable_params": 1000}, held_linear_bytes=2)
    rest = llama.n_params - decoder_linear_params(llama) - head
    assert held["weights"] == (decoder_linear_params(llama) + head) * 2 + rest * 4
    assert held["weight_casts"] == 2 * 1000  # the adapter's casts
    # not for full fine-tuning (fp32 master weights) nor a quantized base
    assert step(smol, **kw, held_linear_bytes=2, adapter="full")["weights"] == smol.n_params * 4
    q = step(smol, **kw, held_linear_bytes=2, quantized_bytes_per_param=0.5)
    assert q["weights"] == step(smol, **kw, quantized_bytes_per_param=0.5)["weights"]


def test_an_8b_lora_step_of_8_x_512_tokens_fits_24_gib_with_the_base_held_in_bf16():
    """The issue's target (#36): Llama-3-8B shape, LoRA r 16 on every linear, micro-batch 8
    x 512 tokens, checkpointing, the loss on 64 answer tokens a row: 21.3 GiB estimated
    with the held base, 38.2 GiB with the fp32 one."""
    from lorapilot.sizing.probe_plan import lora_trainable_params
    from lorapilot.spec import AdapterSpec

    shape = ModelShape.from_config(LLAMA3_8B)
    kw = dict(
        trainable_params=lora_trainable_params(shape, AdapterSpec(r=16)), micro_batch=8,
        seq_len=512, grad_checkpointing=True, loss_positions_per_example=64,
    )  # fmt: skip
    held = step(shape, **kw, held_linear_bytes=2)
    fp32 = step(shape, **kw)
    assert held["total"] <= 24 * GIB < fp32["total"]
    # linears and head (6.98e9 + 0.53e9) x 2 bytes, the embeddings 0.53e9 x 4
    assert 15.5 * GIB < held["weights"] < 16.5 * GIB


def test_sdpa_under_a_padding_mask_keeps_keys_and_values_repeated_to_every_head():
    """What `kv_saved_width` says, measured: a grouped-query model (4 heads, 2 key/value
    heads) on padded rows keeps, per layer, two bf16 tensors of every head's width (k and v
    after transformers' repeat_kv) and none of the grouped width."""
    import torch

    from lorapilot.train.loss import causal_lm_loss_sum
    from tests.train.test_shared_prefix import batch_of, make_lora_model

    model = make_lora_model()
    cfg = model.get_base_model().config
    assert cfg._attn_implementation == "sdpa" and cfg.num_key_value_heads < cfg.num_attention_heads
    batch = batch_of([5, 6, 7], [[8, 9, 10, 11], [12, 13]], answer_from=[0, 0])  # padded
    rows, width = batch["input_ids"].shape
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    shapes: list[tuple] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: shapes.append((tuple(t.shape), t.dtype)) or t, lambda t: t
    ):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            causal_lm_loss_sum(model, batch)
    full = (rows, cfg.num_attention_heads, width, head_dim)
    grouped = (rows, cfg.num_key_value_heads, width, head_dim)
    # q, k, v and the output, each at every head's width: p(h + 2h) + p h in the formula
    assert shapes.count((full, torch.bfloat16)) == 4 * cfg.num_hidden_layers
    assert (grouped, torch.bfloat16) not in shapes


def test_dora_keeps_two_outputs_per_adapted_linear_as_counted():
    """DoRA's extra saved tensors, measured: each adapted linear keeps its base output and
    its LoRA output (to scale them by the magnitude), in the compute dtype: what
    layer_activation_bytes(dora=True) adds, 2 x p x d_out per token per adapted linear."""
    import collections

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from lorapilot.train.loss import causal_lm_loss_sum
    from tests.train.test_shared_prefix import batch_of

    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)  # fmt: skip
    batch = batch_of([5, 6, 7], [[8, 9, 10, 11], [12, 13]], answer_from=[0, 0])
    rows, width = batch["input_ids"].shape

    def saved(dora: bool) -> collections.Counter:
        torch.manual_seed(0)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_dora=dora)
        model = get_peft_model(LlamaForCausalLM(config).float(), lora).train()
        out: collections.Counter = collections.Counter()
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: out.update([(tuple(t.shape), t.dtype)]) or t, lambda t: t
        ):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                causal_lm_loss_sum(model, batch)
        return out

    extra = saved(True) - saved(False)
    bf16 = {  # the per-token tensors (DoRA also casts each weight: not activations)
        shape[2]: n
        for (shape, dtype), n in extra.items()
        if dtype == torch.bfloat16 and shape[:2] == (rows, width) and len(shape) == 3
    }
    # per layer: q, o, down out 32 wide; k, v 16 (2 key/value heads of 8); gate, up 64
    assert bf16 == {32: 2 * 3 * 2, 16: 2 * 2 * 2, 64: 2 * 2 * 2}
    shape = ModelShape.from_config(config.to_dict())
    kw = dict(micro_batch=rows, seq_len=width, precision="bf16", weight_dtype_bytes=4,
              lora_rank=4, lora_forward="peft")  # fmt: skip
    delta = (layer_activation_bytes(shape, dora=True, **kw)["total"]
             - layer_activation_bytes(shape, **kw)["total"])  # fmt: skip
    assert delta == 2 * 2 * (3 * 32 + 2 * 16 + 2 * 64) * rows * width
    # the fused forward leaves DoRA layers to PEFT: the same count whichever is asked for
    fused = layer_activation_bytes(shape, dora=True, **{**kw, "lora_forward": "fused"})
    assert fused == layer_activation_bytes(shape, dora=True, **kw)
