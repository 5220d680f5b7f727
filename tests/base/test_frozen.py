"""`model.dtype: auto`: the frozen base held in the 16-bit compute dtype computes exactly
what the fp32 base computes under autocast (same loss, same LoRA gradients, bit for bit), on
the plain and the shared-prefix loss, with and without checkpointing, tied or untied head;
what stays fp32 and why; where each use of the base loads it."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from lorapilot.base.adapter import set_checkpointing
from lorapilot.base.precision import base_dtype, hold_frozen
from lorapilot.spec import PilotSpec, TrainSpec
from lorapilot.train.audit import run_update_audit
from lorapilot.train.loss import causal_lm_loss_sum, shared_prefix_loss_sum
from lorapilot.train.step import make_optimizer
from tests.train.test_shared_prefix import batch_of

pytestmark = pytest.mark.usefixtures("one_thread")


def lora_model(tied: bool, modules_to_save=None):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tied,
    )  # fmt: skip
    base = LlamaForCausalLM(config).float()
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules="all-linear", modules_to_save=modules_to_save
    )
    model = get_peft_model(base, lora)
    for name, p in model.named_parameters():  # LoRA B starts at 0: give it values to test
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model.train()


def loss_and_grads(model, loss_fn, batch, ckpt: bool):
    set_checkpointing(model, ckpt)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = loss_fn(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


BATCH = batch_of([5, 6, 7, 8, 9, 10], [[11, 12, 13], [14, 15], [16, 17, 18, 19]], [1, 0, 2])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("ckpt", [False, True])
@pytest.mark.parametrize("loss_fn", [causal_lm_loss_sum, shared_prefix_loss_sum])
def test_a_held_base_gives_the_fp32_bases_loss_and_gradients_bit_for_bit(tied, ckpt, loss_fn):
    fp32 = lora_model(tied)
    held = copy.deepcopy(fp32)
    record = hold_frozen(held, "bfloat16")
    assert record["params_in_dtype"] > 0 and record["dtype"] == "bfloat16"
    loss_a, grads_a = loss_and_grads(fp32, loss_fn, BATCH, ckpt)
    loss_b, grads_b = loss_and_grads(held, loss_fn, BATCH, ckpt)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 2 * 7 * 2  # A, B x 7 x 2
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_what_is_held_and_what_stays_fp32():
    model = lora_model(tied=False, modules_to_save=["lm_head"])
    hold_frozen(model, "bfloat16")
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    for name, dtype in dtypes.items():
        trainable = "lora_" in name or "modules_to_save" in name
        linear = name.endswith(("proj.base_layer.weight", "lm_head.original_module.weight"))
        want = torch.bfloat16 if linear and not trainable else torch.float32
        assert dtype == want, (name, dtype)
    assert dtypes["base_model.model.model.embed_tokens.weight"] == torch.float32
    assert dtypes["base_model.model.model.norm.weight"] == torch.float32
    # the trainable copy of the head keeps its full fp32 values (master weights)
    assert dtypes["base_model.model.lm_head.modules_to_save.default.weight"] == torch.float32

    tied = lora_model(tied=True)
    hold_frozen(tied, "bfloat16")
    base = tied.get_base_model()
    assert base.lm_head.weight is base.model.embed_tokens.weight  # still one tensor
    assert base.lm_head.weight.dtype == torch.float32


def test_the_update_audit_holds_on_a_held_base():
    model = lora_model(tied=True)
    hold_frozen(model, "bfloat16")
    cfg = TrainSpec(precision="bf16", lr=1e-2)
    audit = run_update_audit(
        model, [BATCH, BATCH], lambda m: make_optimizer(m, cfg), precision="bf16"
    )
    assert audit["ok"], audit.get("problems")
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert {p.dtype for p in frozen} == {torch.bfloat16, torch.float32}


EXAMPLE = Path(__file__).parents[2] / "examples" / "ticket-triage" / "pilot.yaml"


def spec(**sections) -> PilotSpec:
    """The ticket-triage spec with whole sections' keys overridden."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    for key, values in sections.items():
        raw[key] = {**(raw.get(key) or {}), **values}
    return PilotSpec.model_validate(raw)


def test_base_dtype_follows_the_compute_dtype_and_falls_back_to_fp32():
    s = spec(train={"precision": "bf16"}, eval={"precision": "bf16"})
    assert base_dtype(s, "train") == "bfloat16" and base_dtype(s, "eval") == "bfloat16"
    assert base_dtype(s, "exact") == "float32"  # a merge adds in fp32
    fp16 = spec(train={"precision": "fp16"}, eval={"precision": "fp16"})
    assert base_dtype(fp16, "train") == "float16"
    # evaluation in another dtype would evaluate rounded weights: not held
    mixed = spec(train={"precision": "bf16"}, eval={"precision": "fp32"})
    assert base_dtype(mixed, "train") == "float32" and base_dtype(mixed, "eval") == "float32"
    assert base_dtype(spec(train={"precision": "fp32"}), "train") == "float32"
    full = spec(train={"precision": "bf16"}, eval={"precision": "bf16"}, adapter={"method": "full"})
    assert base_dtype(full, "train") == "float32"  # the weights are the master weights
    assert base_dtype(s, "train", method="full") == "float32"
    q = spec(
        train={"precision": "bf16"}, eval={"precision": "bf16"},
        model={"quantization": {"bits": 4}},
    )  # fmt: skip
    assert base_dtype(q, "train") == "float32" and base_dtype(q, "eval") == "float32"
    explicit = spec(model={"dtype": "bfloat16"}, train={"precision": "fp32"})
    assert {base_dtype(explicit, u) for u in ("train", "eval", "exact")} == {"bfloat16"}
    with pytest.raises(ValueError):
        base_dtype(s, "merge")


def test_auto_hashes_as_the_float32_it_replaced_and_bfloat16_differs():
    assert spec().model.dtype == "auto"
    assert spec().spec_hash() == spec(model={"dtype": "float32"}).spec_hash()
    assert spec().spec_hash() != spec(model={"dtype": "bfloat16"}).spec_hash()
