"""Checkpoints: atomic, verifiable, and enough to resume a run bit for bit.

A run that is stopped by a limit, killed or crashes must be able to continue exactly where
it left off, and a half-written or corrupted checkpoint must never be loaded. So a
checkpoint is written into a temp folder, fsynced, renamed into place whole, and only then
pointed to by latest.json; on resume the newest one whose files match their sha256 is used
and anything newer is discarded. The final adapter is swapped in whole the same way.

A checkpoint folder, checkpoints/step-N/, holds::

    adapter_model.safetensors    the LoRA weights, with adapter_config.json (peft's format);
                                 full fine-tuning: model*.safetensors and config.json
    optimizer.safetensors        optimizer tensors, keyed state.{param_index}.{key}
    state.json                   step, data position, totals, data hash, parameter names,
                                 optimizer scalars and param groups, scheduler, scaler, RNGs
    checksums.json               sha256 of every other file

checkpoints/latest.json names the newest complete one; the last 2 are kept. A run with
`train.early_stopping` also keeps checkpoints/best-step-N, the weights (and checksums) of
its best validation point, which a resume and the end of the run restore. Nothing is
pickled: tensors go to safetensors, everything else to JSON.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from lorapilot.base.adapter import is_peft
from lorapilot.base.models import load_full_weights
from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_json, atomic_write_text, read_jsonl, sha256_file, to_json
from lorapilot.train import fsdp

KEEP_CHECKPOINTS = 2
BEST_PREFIX = "best-step-"  # checkpoints/best-step-N: an early-stopping run's best weights
CHECKPOINT_FORMAT = 1

Log = Callable[[str], None]


def save_weights(model, folder: Path, state_dict: dict | None = None) -> None:
    """LoRA: adapter_model.safetensors + adapter_config.json; full: model.safetensors + config.
    `state_dict`: the weights to write instead of the model's own (FSDP: gathered shards)."""
    extra = {} if state_dict is None else {"state_dict": state_dict}
    if is_peft(model):
        # The vocabulary is never resized here, so the base embeddings are not saved (and
        # peft does not go looking for the base config on the hub to decide).
        model.save_pretrained(folder, safe_serialization=True, save_embedding_layers=False, **extra)
    else:
        model.save_pretrained(folder, safe_serialization=True, **extra)


def _rng_state() -> dict:
    def b64(t: torch.Tensor) -> str:
        return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")

    version, internal, gauss = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [name, key.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng_state(state: dict) -> None:
    def unb64(s: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([unb64(s) for s in state["cuda"]])


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _checkpoint_step(path: Path) -> int | None:
    name = path.name
    if path.is_dir() and name.startswith("step-") and name[5:].isdigit():
        return int(name[5:])
    return None


def save_checkpoint(
    root: Path, step: int, model, optimizer, scheduler, scaler, state: dict, gathered=None
) -> Path:
    """Write checkpoints/step-N atomically (temp folder + rename), then latest.json.
    `gathered`: (weights, optimizer state_dict) to write instead of the live ones (FSDP)."""
    from safetensors.torch import save_file

    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_weights(model, tmp, gathered[0] if gathered else None)
    # Optimizer: tensors to safetensors as state.{param_index}.{key}; the rest to JSON.
    opt = gathered[1] if gathered else optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, per_param in opt["state"].items():
        for key, value in per_param.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{key}"] = value
    save_file(tensors, tmp / "optimizer.safetensors")
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    body = {
        "format": CHECKPOINT_FORMAT,
        **state,
        "optimizer": {"param_groups": opt["param_groups"], "scalars": scalars},
        "scheduler": sched,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": _rng_state(),
    }
    (tmp / "state.json").write_text(to_json(body), encoding="utf-8")
    final = _seal(tmp, root / f"step-{step}")
    atomic_write_json(root / "latest.json", {"step": step})
    steps = sorted(s for s in (_checkpoint_step(p) for p in root.iterdir()) if s is not None)
    for s in steps[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(root / f"step-{s}", ignore_errors=True)
    return final


def _seal(tmp: Path, final: Path) -> Path:
    """A folder written in `tmp`: its files' sha256 in checksums.json, fsynced, then renamed
    to `final` whole (a previous `final` replaced): a reader never sees half of it."""
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    checksums = {"algorithm": "sha256", "files": {f: sha256_file(tmp / f) for f in files}}
    (tmp / "checksums.json").write_text(to_json(checksums), encoding="utf-8")
    _fsync_tree(tmp)
    old = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _checksum_problems(folder: Path) -> tuple[dict, list[str]]:
    """(the files checksums.json lists, the problems: unreadable, missing or changed)."""
    try:
        listed = json.loads((folder / "checksums.json").read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, ["checksums.json is missing or unreadable"]
    problems = []
    for rel, expected in sorted(listed.items()):
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif sha256_file(path) != expected:
            problems.append(f"{rel} does not match its checksum")
    return listed, problems


def verify_checkpoint(folder: Path) -> list[str]:
    """Problems with a checkpoint folder; [] means every file matches checksums.json."""
    listed, problems = _checksum_problems(folder)
    if not listed:
        return problems
    if "state.json" not in listed or "optimizer.safetensors" not in listed:
        problems.append("state.json or optimizer.safetensors is not listed")
    if "adapter_model.safetensors" not in listed and not any(
        f.endswith(".safetensors") and f.startswith("model") for f in listed
    ):
        problems.append("no weights are listed")
    return problems


def find_checkpoint(root: Path, log: Log) -> Path | None:
    """The newest checkpoint that passes its checksums, starting from latest.json.

    A truncated or corrupted checkpoint is never loaded: it is reported and the previous
    one is tried. Newer checkpoints than the one returned are deleted, since training
    continues from the returned one and they belong to a history that no longer exists.
    """
    if not root.is_dir():
        return None
    for p in root.glob(".*-step-*"):  # .tmp-/.old- folders a killed save left behind
        shutil.rmtree(p, ignore_errors=True)
    steps = sorted(
        (s for s in (_checkpoint_step(p) for p in root.iterdir()) if s is not None), reverse=True
    )
    try:
        latest = int(json.loads((root / "latest.json").read_text(encoding="utf-8"))["step"])
        steps = [s for s in steps if s <= latest]
    except (OSError, ValueError, KeyError, TypeError):
        log(f"{root / 'latest.json'} is missing or unreadable; trying every checkpoint")
    for s in steps:
        folder = root / f"step-{s}"
        problems = verify_checkpoint(folder)
        if not problems:
            for p in list(root.iterdir()):
                newer = _checkpoint_step(p)
                if newer is not None and newer > s:
                    shutil.rmtree(p, ignore_errors=True)
            atomic_write_json(root / "latest.json", {"step": s})
            return folder
        log(
            f"checkpoint {folder.name} is not usable ({'; '.join(problems)}); "
            "falling back to the previous one"
        )
    return None


def load_weights(folder: Path, model, sharded=None) -> None:
    """The weights `save_weights` wrote in `folder`, into `model` (LoRA: the adapter's
    tensors; full: every weight). `sharded`: the FSDP root module holding `model`."""
    from safetensors.torch import load_file

    if sharded is not None:
        fsdp.load_weights(sharded, folder)
    elif is_peft(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        if getattr(result, "unexpected_keys", None):
            raise UsageError(
                f"checkpoint {folder} does not fit this adapter: "
                f"unexpected keys {result.unexpected_keys[:5]}"
            )
    else:
        load_full_weights(model, folder)


def load_checkpoint(folder: Path, model, optimizer, scheduler, scaler, sharded=None) -> dict:
    """Restore weights, optimizer, scheduler, scaler and RNG; returns state.json.
    `sharded`: the FSDP root module holding `model` (weights go into the shards)."""
    from safetensors.torch import load_file

    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    load_weights(folder, model, sharded)
    names = param_names(model, optimizer)
    if state.get("param_names") != names:
        raise UsageError(
            f"checkpoint {folder} was written for other trainable parameters "
            "(the adapter settings changed since); start a new run"
        )
    tensors = load_file(folder / "optimizer.safetensors")
    per_param: dict[int, dict] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        per_param.setdefault(int(index), {})[name] = value
    for key, value in state["optimizer"]["scalars"].items():
        index, name = key.split(".", 1)
        per_param.setdefault(int(index), {})[name] = value
    optim_state = {"state": per_param, "param_groups": state["optimizer"]["param_groups"]}
    if sharded is not None:
        fsdp.load_optimizer(sharded, optimizer, optim_state, names)
    else:
        optimizer.load_state_dict(optim_state)
    scheduler.load_state_dict(
        {**state["scheduler"], "lr_lambdas": [None] * len(optimizer.param_groups)}
    )
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    _set_rng_state(state["rng"])
    return state


def param_names(model, optimizer) -> list[str]:
    """Names of the optimizer's parameters in its own order (the state_dict's indices)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id.get(id(p), "?") for g in optimizer.param_groups for p in g["params"]]


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop log lines past `step`, so a resumed run never logs a step twice."""
    if path.exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


def best_folder(root: Path, step: int) -> Path:
    return root / f"{BEST_PREFIX}{step}"


def save_best(root: Path, step: int, model, state_dict: dict | None = None) -> Path:
    """checkpoints/best-step-N: the weights of an early-stopping run's best validation point
    (weights only, with their checksums), written into a temp folder and renamed whole."""
    final = best_folder(root, step)
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_weights(model, tmp, state_dict)
    return _seal(tmp, final)


def best_problems(folder: Path) -> list[str]:
    """Why a best-step folder cannot be restored ([]: every file matches its checksum)."""
    if not folder.is_dir():
        return [f"{folder} is missing"]
    return [f"{folder.name}/{p}" for p in _checksum_problems(folder)[1]]


def prune_best(root: Path, current: int | None) -> None:
    """Delete best-step folders that neither the run (`current`) nor a kept checkpoint (its
    state's early_stopping.best_step: what a resume from it restores) still needs."""
    keep = {current}
    for p in root.iterdir():
        if _checkpoint_step(p) is not None:
            try:
                state = json.loads((p / "state.json").read_text(encoding="utf-8"))
                keep.add((state.get("early_stopping") or {}).get("best_step"))
            except (OSError, ValueError):
                pass
    for p in root.glob(f"{BEST_PREFIX}*"):
        step = p.name[len(BEST_PREFIX) :]
        if p.is_dir() and step.isdigit() and int(step) not in keep:
            shutil.rmtree(p, ignore_errors=True)


def write_final(model, out_dir: Path, state_dict: dict | None = None) -> Path:
    """out_dir/adapter, swapped in whole: a reader never sees half an adapter."""
    final = out_dir / "adapter"
    tmp = out_dir / f".adapter-tmp-{uuid.uuid4().hex[:8]}"
    old = out_dir / f".adapter-old-{uuid.uuid4().hex[:8]}"
    try:
        save_weights(model, tmp, state_dict)
        _fsync_tree(tmp)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final
