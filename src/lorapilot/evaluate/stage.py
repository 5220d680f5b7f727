"""The `baseline` and `eval` verbs: evaluate a model on a split and keep everything.

Each writes, in its run folder: `predictions.jsonl` (one row per example), `metrics.json`
and `protocol.json` (the evaluation protocol and its hash). The test split is reserved:
only `eval --split test --final` touches it, and every access is appended to
`runs/test_ledger.jsonl` under a lock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorapilot import environment, registry
from lorapilot.data.dataset import formatter_for, prepare_data
from lorapilot.errors import UsageError
from lorapilot.evaluate.runner import EvalResult, evaluate_records, make_protocol
from lorapilot.fsutil import append_jsonl, atomic_write_bytes, atomic_write_json, locked, read_jsonl
from lorapilot.spec import Pilot

LEDGER = "test_ledger.jsonl"


def quiet_transformers() -> None:
    """transformers' own progress bars and warnings would interleave with ours on stderr."""
    import warnings

    from transformers.utils import logging

    # peft calls a transformers API deprecated for v6; not actionable for our users
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_base(pilot: Pilot):
    """(resolved, model, tokenizer) of the pilot's base model, offline, eval mode."""
    from lorapilot.models import load_model, resolve_base

    quiet_transformers()
    m = pilot.spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    model, tok = load_model(resolved, m.dtype, m.trust_remote_code)
    return resolved, model, tok


def attach_adapter(model: Any, adapter_dir: Path) -> Any:
    """Base + saved PEFT adapter (safetensors only), ready for evaluation."""
    from peft import PeftModel

    if not (adapter_dir / "adapter_model.safetensors").is_file():
        raise UsageError(
            f"{adapter_dir}: no adapter_model.safetensors (was the train run completed?)"
        )
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    peft_model.eval()
    return peft_model


def write_eval_files(run_dir: Path, result: EvalResult) -> None:
    lines = "".join(
        json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in result.predictions
    )
    atomic_write_bytes(run_dir / "predictions.jsonl", lines.encode("utf-8"))
    atomic_write_json(run_dir / "metrics.json", result.metrics)
    atomic_write_json(run_dir / "protocol.json", result.protocol)


def _limit(records: list, limit: int | None) -> list:
    if limit is None:
        return records
    if limit <= 0:
        raise UsageError(f"--limit {limit}: must be a positive number of examples")
    return records[:limit]


def run_evaluation(
    pilot: Pilot,
    kind: str,
    *,
    split: str = "val",
    adapter_dir: Path | None = None,
    parent: str | None = None,
    limit: int | None = None,
    progress: bool = True,
    final: bool = False,
) -> dict:
    """Evaluate the base (or base + adapter) on a split inside a run of `kind`."""
    spec = pilot.spec
    if split == "test" and not final:
        raise UsageError(
            "the test split is reserved: use `lorapilot eval PILOT --split test --final`"
        )
    if split not in ("val", "test"):
        raise UsageError(f"--split {split!r}: must be val or test")
    with registry.open_run(
        pilot.dir,
        kind,
        spec_hash=spec.spec_hash(),
        config=spec.model_dump(mode="json"),
        parent=parent,
        environment=environment.snapshot(),
    ) as run:
        resolved, model, tok = load_base(pilot)
        if adapter_dir is not None:
            model = attach_adapter(model, adapter_dir)
        prepared = prepare_data(pilot, tok)
        run.record.data_version = prepared.version
        records = _limit(prepared.splits[split], limit)
        if not records:
            raise UsageError(f"the {split} split is empty; nothing to evaluate")
        protocol = make_protocol(spec, tok, prepared)
        if limit is not None:
            protocol["limit"] = limit
        if split == "test":
            earlier = record_test_access(pilot.dir, run.id, parent, adapter_dir)
        fmt = formatter_for(pilot, tok)
        result = evaluate_records(
            model, tok, fmt, spec, records, protocol, progress=progress, label=f"{kind} ({split})"
        )
        write_eval_files(run.dir, result)
        out = {
            "split": split,
            "n": len(records),
            "metrics": result.metrics,
            "eval_protocol": protocol["eval_protocol"],
            "protocol": protocol,
            "data_version": prepared.version,
            "base": {
                "id": resolved.id,
                "path": str(resolved.path),
                "revision": resolved.revision,
                "sha256": resolved.weights_sha256,
            },
            "adapter": str(adapter_dir) if adapter_dir else None,
            "seconds": round(result.seconds, 3),
            "examples_per_s": round(result.examples_per_s, 3),
            "device": result.device,
            "predictions": str(run.dir / "predictions.jsonl"),
        }
        if split == "test":
            out["test_accesses_before"] = earlier
        run.update(**out)
    return {"run_id": run.id, "status": run.record.status, **out}


def record_test_access(
    pilot_dir: Path, run_id: str, evaluated: str | None, adapter_dir: Path | None
) -> list[dict]:
    """Append this access to the test ledger (under a lock) and return the earlier ones."""
    runs = registry.runs_dir(pilot_dir)
    with locked(runs / ".test_ledger.lock"):
        earlier = read_jsonl(runs / LEDGER)
        append_jsonl(
            runs / LEDGER,
            {
                "run": run_id,
                "evaluated": evaluated or "base",
                "adapter": str(adapter_dir) if adapter_dir else None,
                "time": registry.now_iso(),
            },
        )
    if earlier:
        from rich.console import Console

        names = ", ".join(f"{e['run']} ({e['time'][:19]})" for e in earlier)
        Console(stderr=True).print(
            f"[yellow]warning:[/] the test split was already used {len(earlier)} time(s): {names}"
        )
    return earlier


def test_ledger(pilot_dir: Path) -> list[dict]:
    return read_jsonl(registry.runs_dir(pilot_dir) / LEDGER)


def adapter_of(pilot: Pilot, run_id: str | None) -> tuple[str, Path]:
    """(train run id, adapter folder) for --run, default the latest completed train run."""
    if run_id is None:
        rec = registry.latest_run(pilot.dir, "train")
        if rec is None:
            raise UsageError(
                f"{pilot.dir}: no completed train run yet (run `lorapilot train` first or pass --run)"
            )
    else:
        rec = registry.get_run(pilot.dir, run_id)
        if rec.kind != "train":
            raise UsageError(f"--run {run_id}: is a {rec.kind} run, not a train run")
        if rec.status != "completed":
            raise UsageError(
                f"--run {run_id}: has status {rec.status}; only a completed train run has a final adapter"
            )
    path = rec.result.get("adapter_path")
    if not path:
        raise UsageError(f"train run {rec.id} has no adapter_path in its record")
    return rec.id, Path(path)
