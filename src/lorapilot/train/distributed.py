"""Launchers and process groups: torchrun / accelerate launch, DDP or FSDP, CPU (gloo) or GPU.

Joining the process group happens before the run is opened, so that rank 0 can share its
run id; the other ranks follow that run without writing (see docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import torch

from lorapilot.errors import UsageError
from lorapilot.records import registry
from lorapilot.spec import TrainSpec


def launched_world_size() -> int:
    """Processes started by the launcher (torchrun / accelerate launch set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _cpu_only_launch() -> bool:
    # DISTRIBUTED FIX: on a machine without GPUs accelerate joins the process group only when
    # asked for cpu=True; otherwise every rank of `torchrun --nproc_per_node N` silently trains
    # alone (world size 1, N run folders, no gradient averaging).
    return launched_world_size() > 1 and not torch.cuda.is_available()


def init_distributed():
    """accelerate's process state: joins the process group (gloo on CPUs, nccl on GPUs) when
    launched with several processes. Safe to call more than once; the state is shared."""
    from accelerate import PartialState

    return PartialState(cpu=_cpu_only_launch())


def check_distributed(cfg: TrainSpec) -> None:
    """Refuse settings the loop cannot honour, before anything is loaded or written.

    `train.distributed: fsdp` is sharded by the loop itself with torch's fully_shard (see
    lorapilot.train.fsdp); an accelerate FSDP or DeepSpeed launcher config is refused: accelerate
    would then wrap the loss module its own way, which the optimizer, saving and validation
    here do not expect."""
    for var, what in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(var, "false").lower() == "true":
            raise UsageError(
                f"launched with an accelerate {what} config ({var}=true); lorapilot shards the "
                "model itself: launch with torchrun or examples/accelerate/ddp_multi_gpu.yaml and "
                "set train.distributed: fsdp (or ddp), see docs/distributed.md"
            )


def accelerator_for():
    """accelerate's Accelerator for the loop, mixed precision off (the loop autocasts itself)."""
    from accelerate import Accelerator

    cpu = _cpu_only_launch()  # DISTRIBUTED FIX, see _cpu_only_launch
    try:
        return Accelerator(mixed_precision="no", cpu=cpu)
    except ValueError:  # the process-global state exists with other settings: reuse it
        return Accelerator(cpu=cpu)


def distributed_state():
    """accelerate's process state when launched with several processes, else None.

    Joining the process group here, before the run is opened, lets rank 0 share its run id.
    """
    return init_distributed() if launched_world_size() > 1 else None


def distributed_info(state, requested: str = "none") -> dict:
    """World size, backend, hosts and versions, as recorded in the run (a collective call).
    `mode` is what ran: `none` for one process whatever `train.distributed` asked
    (`requested`), else `fsdp` when asked, `ddp` otherwise."""
    import accelerate
    import torch

    host = socket.gethostname()
    info = {
        "mode": "none",
        "requested": requested,
        "world_size": 1,
        "backend": None,
        "rank0_host": host,
        "hosts": [host],
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
    }
    if state is None:
        return info
    hosts: list = [None] * state.num_processes
    torch.distributed.all_gather_object(hosts, host)
    mode = "fsdp" if requested == "fsdp" else "ddp"
    info.update(
        mode=mode,
        world_size=state.num_processes,
        backend=state.backend,
        rank0_host=hosts[0],
        hosts=sorted(set(hosts)),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", state.num_processes)),
    )
    return info


@contextlib.contextmanager
def open_train_run(state, pilot_dir: Path, **kwargs):
    """Rank 0 creates (or reopens) the run and broadcasts its id; the other ranks follow it
    with a handle that writes nothing, so a distributed launch leaves exactly one run."""
    if state is None:
        with registry.open_run(pilot_dir, "train", **kwargs) as run:
            yield run
        return
    from accelerate.utils import broadcast_object_list

    if state.is_main_process:
        with registry.open_run(pilot_dir, "train", **kwargs) as run:
            broadcast_object_list([run.id])
            yield run
    else:
        run_id = broadcast_object_list([None])[0]
        with registry.open_run(
            pilot_dir, "train", **{**kwargs, "run_id": run_id}, write=False
        ) as run:
            yield run
