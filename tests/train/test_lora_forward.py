"""`train.lora_forward: fused`: PEFT's LoRA arithmetic without its input casts.

Each case computes one forward and backward of the same batch with PEFT's forward and with
the fused one and compares the loss and every LoRA gradient: bit for bit where the module
says so (fp32; bf16 when alpha/r is a power of two), else within one rounding."""

from __future__ import annotations

import pytest
import torch
from test_loop import TASK, TICKETS

from lorapilot.base.adapter import build_adapter, set_checkpointing
from lorapilot.base.models import load_model, resolve_base
from lorapilot.base.precision import autocast, hold_frozen
from lorapilot.data.format import PromptFormatter
from lorapilot.sizing.memory import ModelShape, layer_activation_bytes
from lorapilot.spec import AdapterSpec
from lorapilot.train.batches import collate
from lorapilot.train.lora_forward import describe, fused
from lorapilot.train.loss import causal_lm_loss_sum, shared_prefix_loss_sum

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    from transformers import AutoTokenizer

    fmt = PromptFormatter(AutoTokenizer.from_pretrained(tiny_model_dir), TASK, max_length=128)
    budget = fmt.answer_budget_for(TASK.labels)
    return collate([fmt.encode(text, label, budget) for text, label in TICKETS[:4]], 2)


def loss_and_grads(model, batch, *, mode, precision, loss_fn=causal_lm_loss_sum, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout's draws
    with fused(model, mode) as n, autocast("cpu", precision):
        loss, _ = loss_fn(model, batch)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return n, loss.detach(), grads


def adapted(tiny_model_dir, *, held=False, dropout=0.0, alpha=16):
    model, _ = load_model(resolve_base(str(tiny_model_dir)))
    model, _ = build_adapter(model, AdapterSpec(r=8, alpha=alpha, dropout=dropout), seed=0)
    if held:
        hold_frozen(model, "bfloat16")
    return model.train()


CASES = {  # name: (held bf16 base, precision, dropout)
    "fp32": (False, "fp32", 0.0),
    "bf16, base held in bf16": (True, "bf16", 0.0),
    "bf16, fp32 base": (False, "bf16", 0.0),
    "bf16, held, dropout": (True, "bf16", 0.1),
    "fp32, dropout": (False, "fp32", 0.1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_forward_computes_peft_s_loss_and_gradients_bit_for_bit(
    tiny_model_dir, batch, case
):
    held, precision, dropout = CASES[case]
    model = adapted(tiny_model_dir, held=held, dropout=dropout)
    n0, loss0, g0 = loss_and_grads(model, batch, mode="peft", precision=precision)
    n1, loss1, g1 = loss_and_grads(model, batch, mode="fused", precision=precision)
    assert (n0, n1) == (0, 14)  # 2 layers x 7 linears
    assert torch.equal(loss0, loss1)
    assert g0.keys() == g1.keys() and len(g0) == 28
    assert [k for k in g0 if not torch.equal(g0[k], g1[k])] == []


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_4_bit_base_s_lora_layers_run_fused_with_peft_s_results(tiny_model_dir, batch, dropout):
    """QLoRA (NF4, bf16 compute): bitsandbytes' LoRA layers, the base reading the fp32
    input itself (it answers in its input's dtype), the adapters sharing one cast."""
    from lorapilot.spec import QuantizationSpec

    q = QuantizationSpec(bits=4, compute_dtype="bf16")
    model, _ = load_model(resolve_base(str(tiny_model_dir)), "float32", False, q)
    model, _ = build_adapter(model, AdapterSpec(r=8, alpha=16, dropout=dropout), seed=0)
    model.train()
    n0, loss0, g0 = loss_and_grads(model, batch, mode="peft", precision="bf16")
    n1, loss1, g1 = loss_and_grads(model, batch, mode="fused", precision="bf16")
    assert (n0, n1) == (0, 14)
    assert torch.equal(loss0, loss1)
    assert len(g0) == 28 and [k for k in g0 if not torch.equal(g0[k], g1[k])] == []
    if dropout == 0:  # the adapters' kept inputs as the memory model counts them
        (_, saved0), (_, saved1) = (_copies_and_saved_bytes(model, batch, m) for m in SIDES)
        assert saved0 - saved1 == 2 * _model_saving(model, batch, quantized=True) > 0


SIDES = ("peft", "fused")


def _model_saving(model, batch, quantized=False) -> int:
    """The memory model's kept adapter bytes of one layer, PEFT's forward less the fused."""
    shape = ModelShape.from_config(model.get_base_model().config.to_dict())
    rows, width = batch["input_ids"].shape
    kw = dict(micro_batch=rows, seq_len=width, precision="bf16", weight_dtype_bytes=4,
              lora_rank=8, quantized=quantized)  # fmt: skip
    peft, fused_ = (layer_activation_bytes(shape, **kw, lora_forward=m)["adapter"] for m in SIDES)
    return peft - fused_


def test_checkpointing_and_the_shared_prefix_path_are_unchanged_too(tiny_model_dir, batch):
    model = adapted(tiny_model_dir, held=True)
    set_checkpointing(model, True)
    for loss_fn in (causal_lm_loss_sum, shared_prefix_loss_sum):
        _, loss0, g0 = loss_and_grads(model, batch, mode="peft", precision="bf16", loss_fn=loss_fn)
        _, loss1, g1 = loss_and_grads(model, batch, mode="fused", precision="bf16", loss_fn=loss_fn)
        assert torch.equal(loss0, loss1)
        assert [k for k in g0 if not torch.equal(g0[k], g1[k])] == []


def test_a_scaling_that_is_not_a_power_of_two_agrees_within_rounding(tiny_model_dir, batch):
    model = adapted(tiny_model_dir, alpha=12)  # scaling 1.5
    torch.nn.init.normal_(next(p for n, p in model.named_parameters() if "lora_B" in n))
    _, loss0, g0 = loss_and_grads(model, batch, mode="peft", precision="fp32")
    _, loss1, g1 = loss_and_grads(model, batch, mode="fused", precision="fp32")
    assert torch.allclose(loss0, loss1, rtol=1e-6)
    for k in g0:
        assert (g0[k] - g1[k]).norm() <= 1e-5 * g0[k].norm() + 1e-12, k


def test_only_plain_lora_linears_are_fused_and_the_forward_is_peft_s_after(tiny_model_dir):
    model = adapted(tiny_model_dir)
    linears = [m for m in model.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A")]
    with fused(model) as n:
        assert n == len(linears) == 14
        assert all("forward" in m.__dict__ for m in linears)
    assert not any("forward" in m.__dict__ for m in linears)  # validation, eval: PEFT's
    with fused(model):
        with fused(model) as inner:  # nested: the outer region stays fused
            assert inner == 14
        assert all("forward" in m.__dict__ for m in linears)
    assert not any("forward" in m.__dict__ for m in linears)
    assert describe(model, "fused") == {"mode": "fused", "fused_layers": 14, "lora_layers": 14}
    assert describe(model, "peft")["fused_layers"] == 0

    base, _ = load_model(resolve_base(str(tiny_model_dir)))
    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    with fused(dora) as n:
        assert n == 0  # DoRA's forward is not LoRA's: PEFT's own
    assert describe(dora, "fused") == {"mode": "fused", "fused_layers": 0, "lora_layers": 2}
    base, _ = load_model(resolve_base(str(tiny_model_dir)))
    biased = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True))
    assert describe(biased, "fused")["fused_layers"] == 0  # a bias on B: PEFT's own
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    torch.nn.init.normal_(q.lora_B["default"].weight)
    x = torch.randn(2, 3, q.in_features)
    with fused(model):
        model.base_model.disable_adapter_layers()  # disabled within the region: no adapter
        assert describe(model, "fused")["fused_layers"] == 0
        assert torch.equal(q(x), q.base_layer(x))
        model.base_model.enable_adapter_layers()
        assert not torch.equal(q(x), q.base_layer(x))


def _copies_and_saved_bytes(model, batch, mode):
    """Casts of activations in a forward and backward (the profiler's aten::copy_ of 3-d
    tensors: weights are 2-d) and the bytes autograd saved (distinct storages)."""
    from torch.profiler import ProfilerActivity, profile

    storages: dict = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with fused(model, mode), autocast("cpu", "bf16"):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss, _ = causal_lm_loss_sum(model, batch)
        loss.backward()
    copies = sum(e.name == "aten::copy_" and len(e.input_shapes[0]) == 3 for e in prof.events())
    return copies, sum(storages.values())


def test_the_fused_forward_casts_less_and_saves_what_the_memory_model_says(tiny_model_dir, batch):
    model = adapted(tiny_model_dir, held=True)
    copies0, saved0 = _copies_and_saved_bytes(model, batch, "peft")
    copies1, saved1 = _copies_and_saved_bytes(model, batch, "fused")
    # a layer's forward: PEFT casts x for each of q, k, v's base and adapter (6) and gate,
    # up's (4), and o's and down's (16-bit) inputs up to fp32 and back (2 + 2): 14; fused,
    # q/k/v's and gate/up's inputs once each: 2. Backward: o's and down's gradients not cast
    # up and back (4)
    layers = 2
    assert copies0 - copies1 == layers * ((14 - 2) + 4)
    # kept for backward: PEFT's adapters keep a cast copy of their input each (7 a layer);
    # fused, one per distinct input, as the memory model counts under `lora_forward`
    assert saved0 - saved1 == layers * _model_saving(model, batch) > 0
