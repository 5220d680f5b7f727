"""The trainable-parameter audit and the update check, with bugs injected on purpose."""

from __future__ import annotations

import pytest
import torch

from lorapilot.base.adapter import build_adapter
from lorapilot.base.models import load_model, resolve_base
from lorapilot.data.format import PromptFormatter
from lorapilot.errors import UsageError
from lorapilot.spec import AdapterSpec, TaskSpec
from lorapilot.train.audit import run_update_audit, snapshot_params, update_audit
from lorapilot.train.batches import collate

TASK = TaskSpec(
    kind="classification",
    labels=["billing", "technical", "feature_request"],
    template="Ticket:\n{text}\n\nCategory:",
)
TICKETS = [
    ("I was charged twice.", "billing"),
    ("The app crashes on start.", "technical"),
    ("Please add a dark mode.", "feature_request"),
    ("Wrong amount on my invoice.", "billing"),
]
BASE_WEIGHT = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
LORA_A = "base_model.model.model.layers.1.mlp.up_proj.lora_A.default.weight"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def batches(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    fmt = PromptFormatter(tok, TASK, max_length=128)
    budget = fmt.answer_budget_for(TASK.labels)
    examples = [fmt.encode(text, label, budget) for text, label in TICKETS]
    return [collate(examples[:2], tok.pad_token_id), collate(examples[2:], tok.pad_token_id)]


def base(tiny_model_dir):
    return load_model(resolve_base(str(tiny_model_dir)))[0]


def lora(tiny_model_dir, **kw):
    spec = AdapterSpec(r=8, alpha=16, dropout=0.0, **kw)
    return build_adapter(base(tiny_model_dir), spec, seed=0)


def adamw(model, weight_decay: float = 0.0):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=weight_decay)


def assert_restored(model, before):
    for name, p in model.named_parameters():
        assert p.dtype == before[name].dtype and torch.equal(p.detach(), before[name]), name
        assert p.grad is None, name


# --------------------------------------------------------------------------- build_adapter


def test_lora_inventory(tiny_model_dir):
    model, info = lora(tiny_model_dir)
    assert info["method"] == "lora"
    types = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert info["target_module_types"] == types
    assert info["target_modules"] == sorted(
        f"model.layers.{i}.{'self_attn' if t[0] in 'qkvo' else 'mlp'}.{t}"
        for i in range(2)
        for t in types
    )
    # r * (in + out) per adapted Linear: q,o 32->32; k,v 32->16; gate,up 32->64; down 64->32
    per_layer = 8 * (2 * 64 + 2 * 48 + 3 * 96)
    assert info["trainable_params"] == 2 * per_layer
    assert info["total_params"] == sum(p.numel() for p in model.parameters())
    assert info["trainable_fraction"] == pytest.approx(2 * per_layer / info["total_params"])
    assert len(info["trainable_tensors"]) == 28
    assert all(".lora_A." in n or ".lora_B." in n for n in info["trainable_tensors"])
    assert info["modules_to_save"] == []


def test_lora_named_modules_and_modules_to_save(tiny_model_dir):
    _, info = lora(tiny_model_dir, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    assert info["target_module_types"] == ["q_proj", "v_proj"]
    assert len(info["target_modules"]) == 4
    assert info["modules_to_save"] == ["lm_head"]
    assert any("modules_to_save" in n for n in info["trainable_tensors"])


def test_dora_trains_a_magnitude_per_output_and_passes_the_audit(tiny_model_dir, batches):
    model, info = lora(tiny_model_dir, dora=True)
    magnitudes = [n for n in info["trainable_tensors"] if "lora_magnitude_vector" in n]
    assert len(magnitudes) == 14 and len(info["trainable_tensors"]) == 42
    per_layer = 8 * (2 * 64 + 2 * 48 + 3 * 96) + (32 + 16 + 16 + 32 + 64 + 64 + 32)
    assert info["trainable_params"] == 2 * per_layer  # + one magnitude per output
    from lorapilot.sizing.memory import ModelShape
    from lorapilot.sizing.probe_plan import lora_trainable_params

    shape = ModelShape.from_config(model.get_base_model().config.to_dict())
    assert lora_trainable_params(shape, AdapterSpec(r=8, dora=True)) == info["trainable_params"]
    result = run_update_audit(model, batches, adamw)
    assert result["ok"], result["problems"]
    assert sorted(result["changed"]) == info["trainable_tensors"]


def test_rslora_scales_by_the_square_root_of_the_rank(tiny_model_dir):
    model, _ = lora(tiny_model_dir, rslora=True)
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    assert layer.scaling["default"] == pytest.approx(16 / 8**0.5)
    assert model.peft_config["default"].use_rslora
    plain, _ = lora(tiny_model_dir)
    assert plain.get_base_model().model.layers[0].self_attn.q_proj.scaling["default"] == 2.0


def test_lora_options_need_a_lora_adapter():
    with pytest.raises(ValueError, match="dora is an option of a LoRA adapter"):
        AdapterSpec(method="full", dora=True)
    assert "dora" not in AdapterSpec().model_dump() and "rslora" not in AdapterSpec().model_dump()


def test_unknown_target_module_is_a_usage_error(tiny_model_dir):
    with pytest.raises(UsageError, match="adapter.target_modules"):
        lora(tiny_model_dir, target_modules=["no_such_proj"])


def test_full_fine_tuning_trains_everything(tiny_model_dir):
    model, info = build_adapter(base(tiny_model_dir), AdapterSpec(method="full"))
    assert info["method"] == "full" and info["target_modules"] == []
    assert info["trainable_params"] == info["total_params"]
    assert info["trainable_fraction"] == 1.0


def test_seeded_lora_init_is_reproducible_and_leaves_the_global_rng(tiny_model_dir):
    state = torch.get_rng_state()
    a, _ = lora(tiny_model_dir)
    assert torch.equal(torch.get_rng_state(), state)
    b, _ = lora(tiny_model_dir)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na


# --------------------------------------------------------------------------- update audit


def test_healthy_lora_passes_and_is_restored(tiny_model_dir, batches):
    model, info = lora(tiny_model_dir)
    before = snapshot_params(model)
    rng = torch.get_rng_state()
    result = run_update_audit(model, batches, adamw)
    assert result["ok"], result["problems"]
    assert sorted(result["changed"]) == info["trainable_tensors"]
    assert result["unchanged_trainable"] == [] and result["changed_frozen"] == []
    assert result["no_gradient"] == []
    assert result["n_trainable"] == 28 and result["n_frozen"] == len(before) - 28
    assert result["steps"] == 2 and not result["nonfinite_loss"]
    assert_restored(model, before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model.training  # the mode it came in with


def test_full_fine_tuning_passes(tiny_model_dir, batches):
    model, _ = build_adapter(base(tiny_model_dir), AdapterSpec(method="full"))
    result = run_update_audit(model, batches, adamw)
    assert result["ok"], result["problems"]
    assert result["n_frozen"] == 0


def test_one_step_would_miss_lora_a(tiny_model_dir, batches):
    """Why the audit takes 2 steps: B starts at zero, so A's first gradient is zero."""
    model, _ = lora(tiny_model_dir)
    before = snapshot_params(model)
    opt = adamw(model)
    from lorapilot.train.batches import count_target_tokens
    from lorapilot.train.step import train_step

    out = train_step(
        model.train(), opt, None, [batches[0]], count_target_tokens(batches[0]), "fp32", None
    )
    one = update_audit(model, before, steps=1, losses=[out["loss"]])
    assert not one["ok"]
    assert one["unchanged_trainable"] and all(".lora_A." in n for n in one["unchanged_trainable"])
    with pytest.raises(ValueError, match="at least 2"):
        run_update_audit(model, batches, adamw, steps=1)


def test_trainable_weight_outside_the_optimizer_is_caught(tiny_model_dir, batches):
    model, _ = lora(tiny_model_dir)
    params = dict(model.named_parameters())
    optimized = [p for p in model.parameters() if p.requires_grad]
    params[BASE_WEIGHT].requires_grad_(True)  # the bug: unfrozen, but no optimizer sees it
    before = snapshot_params(model)
    result = run_update_audit(model, batches, lambda m: torch.optim.AdamW(optimized, lr=1e-3))
    assert not result["ok"]
    assert result["unchanged_trainable"] == [BASE_WEIGHT]
    assert result["changed_frozen"] == []
    assert_restored(model, before)


def test_frozen_weight_modified_is_caught(tiny_model_dir, batches):
    model, _ = lora(tiny_model_dir)
    weight = dict(model.named_parameters())[BASE_WEIGHT]
    module = model.get_base_model().model.layers[0].self_attn.q_proj.base_layer

    def nudge(mod, args):  # the bug: an in-place edit of a frozen base weight
        with torch.no_grad():
            weight.add_(1e-6)

    handle = module.register_forward_pre_hook(nudge)
    before = snapshot_params(model)
    try:
        result = run_update_audit(model, batches, adamw)
    finally:
        handle.remove()
    assert not result["ok"]
    assert result["changed_frozen"] == [BASE_WEIGHT]
    assert result["unchanged_trainable"] == []
    assert_restored(model, before)


def test_frozen_weight_given_to_the_optimizer_is_caught(tiny_model_dir, batches):
    """A frozen tensor in the optimizer with weight decay, which a stray gradient (here
    one set by an optimizer pre-hook) lets AdamW decay."""
    model, _ = lora(tiny_model_dir)
    weight = dict(model.named_parameters())[BASE_WEIGHT]

    def make(m):
        opt = torch.optim.AdamW(
            [
                {"params": [p for p in m.parameters() if p.requires_grad]},
                {"params": [weight], "weight_decay": 0.1},
            ],
            lr=1e-3,
        )
        opt.register_step_pre_hook(
            lambda o, a, k: setattr(weight, "grad", torch.zeros_like(weight))
        )
        return opt

    before = snapshot_params(model)
    result = run_update_audit(model, batches, make)
    assert not result["ok"] and result["changed_frozen"] == [BASE_WEIGHT]
    assert_restored(model, before)


def test_blocked_lora_gradient_is_caught(tiny_model_dir, batches):
    model, _ = lora(tiny_model_dir)
    lora_a = dict(model.named_parameters())[LORA_A]
    handle = lora_a.register_hook(torch.zeros_like)  # the bug: no gradient reaches it
    before = snapshot_params(model)
    try:
        result = run_update_audit(model, batches, adamw)
    finally:
        handle.remove()
    assert not result["ok"]
    assert result["unchanged_trainable"] == [LORA_A]
    assert result["no_gradient"] == [LORA_A]
    assert result["changed_frozen"] == []
    assert_restored(model, before)


def test_blocked_lora_gradient_is_caught_under_weight_decay(tiny_model_dir, batches):
    """Weight decay moves a tensor that gets no gradient, so "changed" alone would pass it."""
    model, _ = lora(tiny_model_dir)
    handle = dict(model.named_parameters())[LORA_A].register_hook(torch.zeros_like)
    try:
        result = run_update_audit(model, batches, lambda m: adamw(m, weight_decay=0.1))
    finally:
        handle.remove()
    assert not result["ok"]
    assert result["unchanged_trainable"] == []  # decay moved it...
    assert result["no_gradient"] == [LORA_A]  # ...but no gradient ever reached it


def test_nonfinite_loss_is_caught(tiny_model_dir, batches):
    from lorapilot.train.loss import causal_lm_loss_sum

    def nan_loss(model, batch):
        loss_sum, n = causal_lm_loss_sum(model, batch)
        return loss_sum * float("nan"), n

    model, _ = lora(tiny_model_dir)
    before = snapshot_params(model)
    result = run_update_audit(model, batches, adamw, loss_fn=nan_loss)
    assert not result["ok"] and result["nonfinite_loss"]
    assert_restored(model, before)


def test_a_frozen_nan_is_not_reported_changed(tiny_model_dir):
    model, _ = lora(tiny_model_dir)
    with torch.no_grad():
        dict(model.named_parameters())[BASE_WEIGHT][0, 0] = float("nan")
    before = snapshot_params(model)
    result = update_audit(model, before, steps=2, losses=[1.0, 1.0])
    assert result["changed_frozen"] == []  # compared bit for bit, NaN == NaN
    assert result["unchanged_trainable"]  # nothing was trained
