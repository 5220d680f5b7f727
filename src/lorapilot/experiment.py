"""The `train` and `smoke` verbs: one experiment with an identity, from spec to saved adapter.

A train run records its variant (the `--set` diff against the spec and whether it changes one
parameter group or several), the adapter's resolved targets and parameter counts, the base
model's identity, the update audit, the training curve and the in-process validation result
of the final adapter (what `verify` later reproduces in a fresh process).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from lorapilot import environment, fsdp, registry, tracking
from lorapilot.audit import build_adapter, run_update_audit
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.data.format import template_hash, tokenizer_hash
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.evaluate.runner import evaluate_records, make_protocol
from lorapilot.evaluate.stage import load_base, write_eval_files
from lorapilot.export import write_adapter_manifest
from lorapilot.models import pad_id_of
from lorapilot.spec import Pilot, variant_label
from lorapilot.train import (
    check_distributed,
    collate,
    init_distributed,
    launched_world_size,
    make_optimizer,
    train,
)


def _live_interval() -> float:
    """Seconds between live tracking updates: LORAPILOT_TRACKING_INTERVAL, default 15."""
    raw = os.environ.get("LORAPILOT_TRACKING_INTERVAL")
    if raw is None:
        return tracking.LIVE_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UsageError(
            f"LORAPILOT_TRACKING_INTERVAL={raw!r}: must be a positive number of seconds"
        )
    return value


def _limit_checks(pilot: Pilot, started: float):
    """(deadline, cost_check) from the spec's limits: stop gracefully at the time/cost cap."""
    lim = pilot.spec.limits
    deadline = started + lim.time_hours * 3600 if lim.time_hours else None
    cost_check = None
    if lim.cost_cap_usd and lim.usd_per_hour:

        def cost_check(status: dict) -> str | None:
            spent = status["wall_s"] / 3600 * lim.usd_per_hour
            return (
                f"the cost cap of ${lim.cost_cap_usd:.2f} was reached (${spent:.2f})"
                if spent >= lim.cost_cap_usd
                else None
            )

    return deadline, cost_check


def _audit_batches(examples, micro_batch: int, pad_id: int, steps: int = 2) -> list:
    """Real batches for the update audit: the first micro-batches of the training data."""
    out = []
    for i in range(steps):
        chunk = examples[i * micro_batch : (i + 1) * micro_batch] or examples[:micro_batch]
        out.append(collate(chunk, pad_id))
    return out


def _distributed_state():
    """accelerate's process state when launched with several processes, else None.

    Joining the process group here, before the run is opened, lets rank 0 share its run id.
    """
    return init_distributed() if launched_world_size() > 1 else None


def _distributed_info(state, requested: str = "none") -> dict:
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
def _open_train_run(state, pilot_dir: Path, **kwargs):
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


def refuse_over_limits(pilot: Pilot, log=print) -> None:
    """Before starting: refuse (exit 1) when the latest probe's measured memory or the budget
    estimate exceeds the spec's limits. Without a probe there is nothing measured to check."""
    from lorapilot.errors import LorapilotError
    from lorapilot.plan import run_budget

    try:
        budget = run_budget(pilot)
    except LorapilotError as e:
        log(f"limits not checked before training: {e}")
        return
    limits = budget.get("limits") or {}
    over = {k: v for k, v in limits.items() if isinstance(v, dict) and not v.get("ok", True)}
    if over:
        detail = "; ".join(
            f"{k}: {v.get('detail') or (str(v.get('value')) + ' > ' + str(v.get('limit')))}"
            for k, v in over.items()
        )
        raise CheckFailed(
            f"the measured probe / budget estimate exceeds the spec's limits ({detail}); "
            "raise limits in pilot.yaml or shrink the run",
            {"limits": limits},
        )


def run_train(pilot: Pilot, *, resume: str | None = None, progress: bool = True, log=print) -> dict:
    """One experiment: data -> adapter -> audit -> train -> save -> evaluate the adapter.

    Under torchrun / accelerate launch every rank runs this; only rank 0 writes the run, evaluates
    the final adapter and keeps stdout (the CLI prints one JSON object, rank 0's).
    """
    spec = pilot.spec
    check_distributed(spec.train)
    state = _distributed_state()
    if state is not None and not state.is_main_process:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this rank's process
    distributed = _distributed_info(state, spec.train.distributed)
    label = variant_label(pilot.diff)
    variant = {"label": label, "diff": pilot.diff, "parent_spec_hash": None}
    if resume:
        rec = registry.get_run(pilot.dir, resume)
        if rec.kind != "train":
            raise UsageError(f"--resume {resume}: is a {rec.kind} run, not a train run")
        if rec.status == "completed":
            raise UsageError(f"--resume {resume}: the run is already completed")
        if rec.spec_hash != spec.spec_hash():
            raise UsageError(
                f"--resume {resume}: the spec (with --set) differs from the one the run started with; "
                "resume with the same pilot.yaml and the same --set values"
            )
    else:
        from lorapilot.spec import load_spec_file

        base_spec, _ = load_spec_file(pilot.spec_path)
        variant["parent_spec_hash"] = base_spec.spec_hash()
        refuse_over_limits(pilot, log)
    started = time.time()
    with _open_train_run(
        state,
        pilot.dir,
        spec_hash=spec.spec_hash(),
        config=spec.model_dump(mode="json"),
        environment=environment.snapshot(),
        run_id=resume,
    ) as run:
        if not resume:
            run.record.variant = variant
            run.save()
        resolved, model, tok = load_base(pilot)
        prepared = prepare_data(pilot, tok)
        run.record.data_version = prepared.version
        fmt = formatter_for(pilot, tok)
        train_ex = encode_records(fmt, spec.task, prepared.splits["train"], prepared.answer_budget)
        val_ex = encode_records(fmt, spec.task, prepared.splits["val"], prepared.answer_budget)
        pad_id = pad_id_of(tok)

        model, adapter_info = build_adapter(model, spec.adapter, seed=spec.train.seed)
        base_info = {
            "id": resolved.id,
            "path": str(resolved.path),
            "revision": resolved.revision,
            "sha256": resolved.weights_sha256,
            "source": resolved.source,
        }
        run.update(
            adapter=adapter_info,
            trainable_params=adapter_info["trainable_params"],
            target_modules=adapter_info["target_modules"],
            base=base_info,
            distributed=distributed,
        )

        if not resume:
            audit = run_update_audit(
                model,
                _audit_batches(train_ex, spec.train.micro_batch, pad_id),
                lambda m: make_optimizer(m, spec.train),
                steps=2,
                precision=spec.train.precision,
                max_grad_norm=spec.train.max_grad_norm,
            )
            run.update(update_audit=audit)
            if not audit["ok"]:
                raise CheckFailed(
                    "the update audit failed: " + "; ".join(audit.get("problems", [])[:5]),
                    {"run_id": run.id, "update_audit": audit},
                )
        deadline, cost_check = _limit_checks(pilot, started)
        # Trackers see the curves during the run (rank 0 only); the whole run is mirrored at close.
        live = tracking.LiveMirror(run.dir, spec.tracking if run.write else [], _live_interval())
        try:
            with live:
                result = train(
                    model,
                    train_ex,
                    val_ex,
                    spec.train,
                    run.dir,
                    pad_id=pad_id,
                    resume=bool(resume),
                    deadline=deadline,
                    cost_check=cost_check,
                    progress=progress,
                    log=log,
                )
        except registry.StoppedByLimit as e:
            run.update(
                checkpoint=str(getattr(e, "checkpoint", "")),
                stopped_at_step=getattr(e, "step", None),
            )
            raise
        adapter_dir = Path(result["adapter"])
        run.update(
            train=result,
            adapter_path=str(adapter_dir),
            final_val_loss=result["final_val_loss"],
            initial_val_loss=result["initial_val_loss"],
        )
        if not run.write:  # a non-zero rank: rank 0 evaluates the adapter and writes the files
            return {"run_id": run.id, "status": "completed", "rank": state.process_index}

        # The final adapter on the validation split, with the same protocol as the baseline.
        if distributed["mode"] == "fsdp":  # rank 0 cannot run the sharded model alone
            del model
            model = fsdp.model_for_final_eval(pilot, adapter_dir, init_distributed().device)
        protocol = make_protocol(spec, tok, prepared)
        ev = evaluate_records(
            model,
            tok,
            fmt,
            spec,
            prepared.splits["val"],
            protocol,
            progress=progress,
            label="eval (val)",
        )
        write_eval_files(run.dir, ev)
        run.update(
            metrics=ev.metrics,
            eval_protocol=protocol["eval_protocol"],
            protocol=protocol,
            eval_seconds=round(ev.seconds, 3),
            eval_device=ev.device,
        )
        write_adapter_manifest(
            adapter_dir,
            base=base_info,
            spec=spec.model_dump(mode="json"),
            data_version=prepared.version,
            eval_protocol=protocol,
            metrics=ev.metrics,
            tokenizer_sha256=tokenizer_hash(tok),
            template_sha256=template_hash(tok, spec.task),
            adapter_info=adapter_info,
            run_id=run.id,
        )
    rec = run.record
    return {
        "run_id": run.id,
        "status": rec.status,
        "variant": (rec.variant or {}).get("label", label),
        "variant_diff": (rec.variant or {}).get("diff", {}),
        "update_audit": rec.result.get("update_audit"),
        "trainable_params": adapter_info["trainable_params"],
        "total_params": adapter_info["total_params"],
        "target_modules": adapter_info["target_modules"],
        "adapter_path": str(adapter_dir),
        "final_val_loss": result["final_val_loss"],
        "initial_val_loss": result["initial_val_loss"],
        "steps": result["steps"],
        "resumed_from": result["resumed_from"],
        "metrics": ev.metrics,
        "eval_protocol": protocol["eval_protocol"],
        "data_version": prepared.version,
        "distributed": distributed,
        "wall_s": round(time.time() - started, 3),
    }


def run_smoke(
    pilot: Pilot,
    *,
    per_category: int = 2,
    max_steps: int = 40,
    lr: float = 2e-3,
    progress: bool = True,
    log=print,
) -> dict:
    """Overfit a few examples per category through the real training and evaluation code.

    It proves wiring (labels aligned, mask right, eval prompt = training prompt), not
    quality: a correct pipeline memorises a dozen examples in a few dozen steps.
    """
    from lorapilot.data.audit import sample_per_category

    spec = pilot.spec
    with registry.open_run(
        pilot.dir,
        "smoke",
        spec_hash=spec.spec_hash(),
        config=spec.model_dump(mode="json"),
        environment=environment.snapshot(),
    ) as run:
        _, model, tok = load_base(pilot)
        prepared = prepare_data(pilot, tok)
        run.record.data_version = prepared.version
        fmt = formatter_for(pilot, tok)
        records = sample_per_category(prepared.splits["train"], per_category, spec.train.seed)
        examples = encode_records(fmt, spec.task, records, prepared.answer_budget)
        pad_id = pad_id_of(tok)
        model, _ = build_adapter(
            model, spec.adapter.model_copy(update={"dropout": 0.0}), seed=spec.train.seed
        )
        cfg = spec.train.model_copy(
            update={
                "max_steps": max_steps,
                "lr": lr,
                "micro_batch": min(len(examples), 16),
                "grad_accum": 1,
                "warmup_ratio": 0.0,
                "schedule": "constant",
                "eval_every": None,
                "save_every": None,
                "weight_decay": 0.0,
            }
        )
        result = train(
            model, examples, examples, cfg, run.dir, pad_id=pad_id, progress=progress, log=log
        )
        protocol = make_protocol(spec, tok, prepared)
        ev = evaluate_records(
            model, tok, fmt, spec, records, protocol, progress=progress, label="smoke eval"
        )
        n_correct = sum(bool(r["correct"]) for r in ev.predictions)
        final_loss = result["final_val_loss"]
        ok = final_loss < 0.1 and n_correct == len(records)
        out = {
            "ok": ok,
            "final_loss": final_loss,
            "initial_loss": result["initial_val_loss"],
            "n_examples": len(records),
            "n_correct": n_correct,
            "steps": result["steps"],
            "note": "smoke proves wiring (labels, loss mask, eval prompt), not quality",
            "failed_examples": [r["id"] for r in ev.predictions if not r["correct"]],
        }
        run.update(**out)
    return {"run_id": run.id, "status": run.record.status, **out}


def describe(result: dict[str, Any]) -> list[str]:
    return [f"{k}: {v}" for k, v in result.items() if k not in ("metrics",)]
