"""The optimizer `train_step` steps with: torch's fused AdamW where the parameters allow it,
the same update as AdamW's loop up to rounding, and the record says which ran."""

from __future__ import annotations

import copy

import pytest
import torch

from lorapilot.errors import UsageError
from lorapilot.spec import TrainSpec
from lorapilot.train.step import adamw_implementation, make_optimizer, optimizer_record


def small_model() -> torch.nn.Module:
    """A frozen matrix, a trainable matrix and a trainable gain (no weight decay)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    model[0].requires_grad_(False)
    return model


def step_with(model: torch.nn.Module, optimizer, steps: int = 3) -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_make_optimizer_runs_fused_adamw_on_a_cpu_and_updates_as_adamw_does():
    cfg = TrainSpec(lr=1e-2, weight_decay=0.1)
    ours, reference = small_model(), small_model()
    optimizer = make_optimizer(ours, cfg)
    assert optimizer_record(optimizer) == {"name": "adamw", "implementation": "fused"}
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    frozen = ours[0].weight.clone()

    # the same groups stepped by AdamW's per-tensor loop
    params = [p for p in reference.parameters() if p.requires_grad]
    loop = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=1e-2,
        foreach=False,
    )
    assert optimizer_record(loop)["implementation"] == "for-loop"
    step_with(ours, optimizer)
    step_with(reference, loop)
    for (name, a), b in zip(ours.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(ours[2].weight, small_model()[2].weight)  # it did step
    assert torch.equal(ours[0].weight, frozen)


def test_the_record_names_torchs_default_where_fused_is_not_asked():
    p = torch.nn.Parameter(torch.ones(3))
    assert optimizer_record(torch.optim.AdamW([p]))["implementation"] == "for-loop"  # CPU
    assert optimizer_record(torch.optim.AdamW([p], foreach=True))["implementation"] == "foreach"
    assert optimizer_record(torch.optim.SGD([p], lr=0.1)) == {
        "name": "sgd",
        "implementation": "for-loop",
    }


def test_fused_only_where_torch_has_the_kernel():
    assert adamw_implementation([torch.zeros(2)]) == "fused"
    assert adamw_implementation([torch.zeros(2, device="meta")]) == "for-loop"
    assert adamw_implementation([torch.zeros(2), torch.zeros(2, device="meta")]) == "for-loop"


def test_nothing_trainable_is_a_usage_error():
    model = small_model().requires_grad_(False)
    with pytest.raises(UsageError, match="nothing is trainable"):
        make_optimizer(model, TrainSpec())


def test_a_checkpoint_of_torchs_default_adamw_resumes_with_it_bit_for_bit():
    """Checkpoints written before the fused default hold `fused: None` in their param
    groups: loaded into `make_optimizer`'s optimizer they go on with torch's default."""
    cfg = TrainSpec(lr=1e-2, weight_decay=0.1)
    old_model, new_model = small_model(), small_model()
    old = make_optimizer(old_model, cfg)
    for group in old.param_groups:
        group["fused"] = None  # as an older lorapilot built it
    step_with(old_model, old, steps=2)
    new_model.load_state_dict(old_model.state_dict())
    new = make_optimizer(new_model, cfg)
    new.load_state_dict(copy.deepcopy(old.state_dict()))  # as read from a checkpoint
    assert optimizer_record(new)["implementation"] == "for-loop"
    step_with(old_model, old, steps=2)
    step_with(new_model, new, steps=2)
    for a, b in zip(old_model.parameters(), new_model.parameters(), strict=True):
        assert torch.equal(a, b)
