"""FSDP for the training loop (`train.distributed: fsdp` under torchrun / accelerate launch).

torch's FSDP2 (`torch.distributed.fsdp.fully_shard`) is used directly, not accelerate's FSDP
plugin: accelerate 1.15 shards only on GPUs, while `fully_shard` works the same over gloo on
CPUs and over NCCL on GPUs. The processes join the process group exactly as for DDP
(`train.init_distributed`); only the model is wrapped differently:

- every decoder layer is one shard group and the loop's `_LossModule` is the root, which
  holds what is left (embeddings, final norm, LM head). The root must be the loss module:
  the chunked loss calls the decoder and the LM head separately, and the root's forward
  is what gathers the root-level weights for both. Sharding happens after the adapter is
  built and before the optimizer (the parameters become DTensors); FSDP2 keeps LoRA's mix
  of frozen and trainable parameters per parameter.
- `train_step` is unchanged: FSDP's reduce-scatter averages gradients over ranks like DDP's
  all-reduce, so its `world_size` factor is right, and accelerate's `clip_grad_norm_`
  computes the norm of the DTensor gradients over all shards.
- every forward gathers weights with a collective, so every rank must run the same number
  of forwards: validation pads the ranks' shares (`validation_loss`), and nothing runs the
  sharded model on rank 0 alone (the final evaluation reloads the saved adapter,
  `model_for_final_eval`).
- saving gathers full state dicts on every rank (`gather_weights`, `gather_optimizer`,
  on CPU, rank 0 receives them) and rank 0 writes them with the loop's own writers, so the
  adapter and the checkpoints are the files a single-process run writes. Resuming reads
  those files on every rank (as the DDP path does) and loads them into the shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lorapilot.base.adapter import is_peft
from lorapilot.errors import UsageError

_ROOT = "model."  # the loss module holds the model as `.model`: its state-dict prefix


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def decoder_layer_classes(model) -> set[str]:
    """Class names of the base model's repeated blocks (transformers' `_no_split_modules`)."""
    base = model.get_base_model() if is_peft(model) else model
    return set(getattr(base, "_no_split_modules", None) or ())


def shard(loss_module: torch.nn.Module, device: torch.device, world_size: int) -> torch.nn.Module:
    """fully_shard every decoder layer of `loss_module.model`, then the loss module (the root).

    Called on every rank, with the model still on the CPU: each group is moved to `device`
    as it is sharded, so a device never holds more than one unsharded layer at load time.
    Returns the loss module, now an FSDP module whose forward is the one to call.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = loss_module.model
    classes = decoder_layer_classes(model)
    layers = [m for m in model.modules() if type(m).__name__ in classes]
    if not layers:
        raise UsageError(
            f"train.distributed: fsdp: no decoder layers found in {type(model).__name__} (its "
            "_no_split_modules names none of its modules); use train.distributed: ddp"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(loss_module, mesh=mesh)
    return loss_module


# --------------------------------------------------------------------------- validation


@torch.no_grad()
def validation_loss(
    loss_module, examples, micro_batch: int, precision: str, accelerator
) -> float | None:
    """`train.validation_loss` on the sharded model: the same chunks and the same rank shares,
    but every forward goes through the root (which gathers the weights) and every rank runs
    the same number of forwards; a rank short of one repeats a chunk and drops its result."""
    from lorapilot.base.precision import autocast

    if not len(examples):
        return None
    world, rank = accelerator.num_processes, accelerator.process_index
    device = accelerator.device
    order = sorted(range(len(examples)), key=lambda i: examples.lengths[i])
    chunks = [order[i : i + micro_batch] for i in range(0, len(order), micro_batch)]
    mine = chunks[rank::world]
    rounds = -(-len(chunks) // world)  # every rank: ceil(chunks / world) forwards
    was_training = loss_module.training
    loss_module.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for r in range(rounds):
        chunk = mine[r] if r < len(mine) else chunks[0]
        batch = {k: v.to(device) for k, v in examples.collate(chunk).items()}
        with autocast(device.type, precision):
            loss_sum, n = loss_module(batch)
        if r < len(mine):
            total += torch.stack([loss_sum.double(), n.double()])
    loss_module.train(was_training)
    # Without a backward the root keeps its weights gathered after the forward; reshard, so
    # memory drops back and the model's parameters are the optimizer's (sharded) ones again.
    loss_module.reshard()
    total = accelerator.reduce(total, reduction="sum")
    return float(total[0] / total[1]) if total[1] > 0 else None


# --------------------------------------------------------------------------- saving


def gather_weights(loss_module) -> dict[str, torch.Tensor]:
    """Full weights on rank 0's CPU, keyed as the unsharded model's state_dict ({} on the
    other ranks). A collective: every rank calls it. LoRA: the trainable tensors only (what
    peft saves); full fine-tuning: everything."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    peft = is_peft(loss_module.model)
    full = get_model_state_dict(
        loss_module, options=_options(cpu_offload=True, ignore_frozen_params=peft)
    )
    full = {k.removeprefix(_ROOT): v for k, v in full.items()}
    # Tied parameters (LM head = embeddings) come back as separate copies; make them one
    # tensor again, so the writer sees what it sees unsharded and saves it once.
    first: dict[int, str] = {}
    for name, p in loss_module.model.named_parameters(remove_duplicate=False):
        if name in full:
            full[name] = full[first.setdefault(id(p), name)]
    return full


def gather_optimizer(loss_module, optimizer) -> dict:
    """The optimizer's full state on rank 0's CPU in torch's own layout, `state` keyed by
    parameter index in param_groups order, as `optimizer.state_dict()` gives it unsharded
    ({} on the other ranks). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    full = get_optimizer_state_dict(loss_module, optimizer, options=_options(cpu_offload=True))
    if not full:
        return {}
    index: dict[str, int] = {}
    groups = []
    for group in full["param_groups"]:
        ids = [index.setdefault(fqn, len(index)) for fqn in group["params"]]
        groups.append({**group, "params": ids})
    state = {index[fqn]: per_param for fqn, per_param in full["state"].items()}
    return {"state": dict(sorted(state.items())), "param_groups": groups}


# --------------------------------------------------------------------------- resuming


def _peft_to_model_keys(model, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's file keys -> the model's state_dict keys, translated by peft itself:
    `set_peft_model_state_dict` is run with `load_state_dict` intercepted, so the same
    renaming (adapter name, modules_to_save, transformers conversions) applies as in the
    unsharded path, and nothing is copied into the shards here."""
    from unittest import mock

    from peft import set_peft_model_state_dict

    captured: dict[str, torch.Tensor] = {}

    def capture(state_dict, strict=True, assign=False):
        captured.update(state_dict)
        return torch.nn.modules.module._IncompatibleKeys([], [])

    with mock.patch.object(model, "load_state_dict", capture):
        set_peft_model_state_dict(model, saved)
    return captured


def load_weights(loss_module, folder: Path) -> None:
    """Load a checkpoint's weights (written by `checkpoint.save_weights`) into the shards. Every
    rank reads the files, like the DDP path; each keeps its own shard of every tensor."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    model = loss_module.model
    if is_peft(model):
        loaded = _peft_to_model_keys(model, load_file(folder / "adapter_model.safetensors"))
        expected = {n for n, p in model.named_parameters() if p.requires_grad}
    else:
        loaded = {}
        for f in sorted(folder.glob("model*.safetensors")):
            loaded.update(load_file(f))
        params = dict(model.named_parameters(remove_duplicate=False))
        tied = {id(params[k]) for k in loaded if k in params}  # embeddings = LM head: saved once
        expected = {k for k, p in params.items() if k in loaded or id(p) not in tied}
    own = set(model.state_dict())
    unexpected = sorted(set(loaded) - own)
    missing = sorted(expected - set(loaded))
    if unexpected or missing:
        raise UsageError(
            f"checkpoint {folder} does not fit this model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    set_model_state_dict(
        loss_module, {_ROOT + k: v for k, v in loaded.items()}, options=_options(strict=False)
    )


def load_optimizer(loss_module, optimizer, state: dict, names: Sequence[str]) -> None:
    """Load an optimizer state in torch's index layout (what `checkpoint.load_checkpoint` rebuilt
    from optimizer.safetensors + state.json) into the sharded optimizer; `names[i]` is the
    model's name of parameter index i."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    fqn = [_ROOT + n for n in names]
    by_name = {
        "state": {fqn[int(i)]: per_param for i, per_param in state["state"].items()},
        "param_groups": [
            {**g, "params": [fqn[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(loss_module, optimizer, by_name, options=_options())


# --------------------------------------------------------------------------- the end


def model_for_final_eval(pilot, adapter_dir: Path, device: torch.device) -> Any:
    """Rank 0's unsharded model for the final evaluation: the base reloaded from its pinned
    files plus the adapter just saved (what `verify` does in a fresh process). The sharded
    model cannot run on rank 0 alone: each of its forwards is a collective."""
    from lorapilot.base.models import attach_adapter, load_base
    from lorapilot.base.precision import base_dtype

    if pilot.spec.adapter.method == "full":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            adapter_dir,
            dtype=getattr(torch, base_dtype(pilot.spec, "eval")),
            trust_remote_code=pilot.spec.model.trust_remote_code,
            local_files_only=True,
        )
        model.eval()
    else:
        _, base, _ = load_base(pilot)
        model = attach_adapter(base, Path(adapter_dir))
    return model.to(device)


def grad_scaler(device: torch.device):
    """fp16's loss scaler for sharded gradients: each rank checks only its own shards for
    inf/NaN, so the verdict is all-reduced (torch's ShardedGradScaler) and every rank skips
    the same steps; a plain GradScaler would let one rank step while another skips."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device.type)
