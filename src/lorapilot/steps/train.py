"""`lorapilot train`: one experiment with an identity, from spec to saved adapter.

A train run records its variant (the `--set` diff against the spec and whether it changes one
parameter group or several), the adapter's resolved targets and parameter counts, the base
model's identity, the update audit, the training curve and the in-process validation result
of the final adapter (what `verify` later reproduces in a fresh process).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from lorapilot.base.manifest import write_adapter_manifest
from lorapilot.base.quantize import identity
from lorapilot.decision.plan import pilot_of_run
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.evaluate.records import write_eval_files
from lorapilot.fsutil import atomic_write_text
from lorapilot.modality import modality_of
from lorapilot.records import registry, tracking
from lorapilot.records.steprun import record_kwargs
from lorapilot.sizing.budget import limit_checks
from lorapilot.sizing.estimate import checkpoint_policy, refuse_over_limits
from lorapilot.spec import Pilot, load_pilot, load_spec_file, variant_label
from lorapilot.train import fsdp
from lorapilot.train.audit import audit_batches, run_update_audit
from lorapilot.train.distributed import (
    check_distributed,
    distributed_info,
    distributed_state,
    init_distributed,
    open_train_run,
)
from lorapilot.train.loop import train
from lorapilot.train.step import make_optimizer


def _why(pilot: Pilot) -> str | None:
    for v in pilot.spec.variants:
        if v.name == pilot.variant:
            return v.why
    return None


def changed_keys(old: dict, new: dict, prefix: str = "", limit: int = 8) -> list[str]:
    """Dotted keys whose values differ between two spec dumps (tracking ignored)."""
    out: list[str] = []
    for key in sorted(set(old) | set(new)):
        path = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if path == "tracking" or a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, path + ".", limit)
        else:
            out.append(path)
    return out[:limit]


def pilot_for(
    path: str, sets: list[str] | None, variant: str | None, resume: str | None, replicate: int = 0
) -> Pilot:
    """The pilot `train` runs: `--resume RUN` alone takes the run's own variant, seed
    replicate and overrides from its record; otherwise the spec with `--variant` (and
    `--replicate`) or `--set`."""
    if resume and not sets and variant is None and not replicate:
        return pilot_of_run(path, resume)
    return load_pilot(path, sets, variant, replicate)


def run_train(
    pilot: Pilot,
    *,
    resume: str | None = None,
    limits_checked: bool = False,
    progress: bool = True,
    log=print,
) -> dict:
    """One experiment: data -> adapter -> audit -> train -> save -> evaluate the adapter.

    Under torchrun / accelerate launch every rank runs this; only rank 0 writes the run, evaluates
    the final adapter and keeps stdout (the CLI prints one JSON object, rank 0's).
    `limits_checked`: the caller (`run`) has just checked the budget against the limits.
    """
    spec = pilot.spec
    check_distributed(spec.train)
    state = distributed_state()
    if state is not None and not state.is_main_process:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of this rank's process
    distributed = distributed_info(state, spec.train.distributed)
    label = variant_label(pilot.diff)
    variant = {"name": pilot.variant, "label": label, "diff": pilot.diff,
               "parent_spec_hash": None, "why": _why(pilot)}  # fmt: skip
    if pilot.replicate:  # seed k of selection.seeds: the same recipe, train.seed + k
        variant["replicate"] = pilot.replicate
    if resume:
        rec = registry.get_run(pilot.dir, resume)
        if rec.kind != "train":
            raise UsageError(f"--resume {resume}: is a {rec.kind} run, not a train run")
        if rec.status == "completed":
            raise UsageError(f"--resume {resume}: the run is already completed")
        if rec.spec_hash != spec.spec_hash():
            keys = changed_keys(rec.config, spec.model_dump(mode="json"))
            raise UsageError(
                f"--resume {resume}: the spec differs from the one the run started with"
                + (f" ({', '.join(keys)})" if keys else "")
                + "; resume with the same pilot.yaml (a run's variant and --set values are "
                "taken from its record)"
            )
    else:
        base_spec, _ = load_spec_file(pilot.spec_path)
        variant["parent_spec_hash"] = base_spec.spec_hash()
        if not limits_checked:
            refuse_over_limits(pilot, log)
    started = time.time()
    with open_train_run(state, pilot.dir, **record_kwargs(pilot), run_id=resume) as run:
        if not resume:
            run.record.variant = variant
            run.save()
        tr = modality_of(pilot).trainee()
        resolved, model, adapter_info, prepared = (tr.resolved, tr.model, tr.adapter_info,
                                                   tr.prepared)  # fmt: skip
        run.record.data_version = prepared.version
        train_ex, val_ex = tr.train_set, tr.val_set
        base_info = {**resolved.record(), "source": resolved.source}
        # The exact base: the adapter learned against these weights quantized this way.
        base_identity = identity(
            resolved.weights_sha256, spec.model.quantization, adapter_info.get("base_dtype")
        )
        run.update(
            adapter=adapter_info,
            trainable_params=adapter_info["trainable_params"],
            target_modules=adapter_info["target_modules"],
            base=base_info,
            base_identity=base_identity,
            base_dtype=adapter_info.get("base_dtype"),
            distributed=distributed,
        )

        if not resume:
            audit = run_update_audit(
                model,
                audit_batches(train_ex, spec.train.micro_batch),
                lambda m: make_optimizer(m, spec.train),
                steps=2,
                precision=spec.train.precision,
                max_grad_norm=spec.train.max_grad_norm,
                loss_fn=train_ex.loss_fn(spec.train)[0],  # the path the training steps take
                lora_forward=spec.train.lora_forward,
            )
            run.update(update_audit=audit)
            if not audit["ok"]:
                raise CheckFailed(
                    "the update audit failed: " + "; ".join(audit.get("problems", [])[:5]),
                    {"run_id": run.id, "update_audit": audit},
                )
        # A killed run loses at most ~10% of its steps by default (checkpoint interval).
        checkpointing = (run.record.result.get("checkpointing") if resume else None) or (
            checkpoint_policy(pilot, len(train_ex), distributed.get("world_size") or 1)
        )
        run.update(checkpointing=checkpointing)
        train_cfg = spec.train.model_copy(update={"save_every": checkpointing["save_every"]})
        deadline, cost_check = limit_checks(spec.limits, started)
        # Trackers see the curves during the run (rank 0 only); the whole run is mirrored at close.
        live = tracking.LiveMirror(
            run.dir, spec.tracking if run.write else [], tracking.live_interval()
        )
        try:
            with live:
                result = train(
                    model,
                    train_ex,
                    val_ex,
                    train_cfg,
                    run.dir,
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
        adapter_dir = Path(result.adapter)
        run.update(
            train=result.to_dict(),
            adapter_path=str(adapter_dir),
            final_val_loss=result.final_val_loss,
            initial_val_loss=result.initial_val_loss,
        )
        if not run.write:  # a non-zero rank: rank 0 evaluates the adapter and writes the files
            return {"run_id": run.id, "status": "completed", "rank": state.process_index}

        # The final adapter on the validation split, with the same protocol as the baseline.
        if distributed["mode"] == "fsdp":  # rank 0 cannot run the sharded model alone
            del model
            model = fsdp.model_for_final_eval(pilot, adapter_dir, init_distributed().device)
        ev, protocol = tr.evaluate(
            model, prepared.splits["val"], label="eval (val)", progress=progress, log=log
        )
        write_eval_files(run.dir, ev)
        run.update(
            metrics=ev.metrics,
            eval_protocol=protocol["eval_protocol"],
            protocol=protocol,
            eval_seconds=round(ev.seconds, 3),
            eval_peak_memory_bytes=ev.peak_memory_bytes,
            eval_device=ev.device,
            generation=ev.generation,  # eval.generation_check: the answers a chat server gives
        )
        for name, text in tr.adapter_texts.items():  # before the manifest, which pins them
            atomic_write_text(adapter_dir / name, text)
        write_adapter_manifest(
            adapter_dir,
            base=base_info,
            spec=spec.model_dump(mode="json"),
            data_version=prepared.version,
            eval_protocol=protocol,
            metrics=ev.metrics,
            adapter_info=adapter_info,
            run_id=run.id,
            base_identity=base_identity,
            **tr.manifest_hashes,
        )
    rec = run.record
    return {
        "run_id": run.id,
        "status": rec.status,
        "variant": (rec.variant or {}).get("label", label),
        "variant_name": (rec.variant or {}).get("name", pilot.variant),
        "replicate": (rec.variant or {}).get("replicate", 0),
        "seed": spec.train.seed,
        "checkpointing": rec.result.get("checkpointing"),
        "variant_diff": (rec.variant or {}).get("diff", {}),
        "update_audit": rec.result.get("update_audit"),
        "trainable_params": adapter_info["trainable_params"],
        "total_params": adapter_info["total_params"],
        "target_modules": adapter_info["target_modules"],
        "base_identity": base_identity,
        "base_dtype": adapter_info.get("base_dtype"),
        "adapter_path": str(adapter_dir),
        "final_val_loss": result.final_val_loss,
        "initial_val_loss": result.initial_val_loss,
        "steps": result.steps,
        "total_steps": result.total_steps,
        "early_stopping": result.early_stopping,
        "sampling": result.sampling,
        "resumed_from": result.resumed_from,
        "prefix": result.prefix,
        "lora_forward": result.lora_forward,
        "optimizer": result.optimizer,
        "metrics": ev.metrics,
        "generation": ev.generation,
        "eval_protocol": protocol["eval_protocol"],
        "data_version": prepared.version,
        "distributed": distributed,
        "wall_s": round(time.time() - started, 3),
    }
