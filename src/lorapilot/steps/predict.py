"""`lorapilot predict`: an adapter (or the base) applied to new inputs, a file the pilot never
saw, in a `predict` run: the same prompts, truncation, decoding and parsing as the pilot's
evaluation (one protocol), every prediction kept. Inputs that carry an answer are scored
too (an outside check, never the decision's figures); inputs that are examples of the
pilot's own splits are named, those of the reserved test split with a warning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lorapilot.base.manifest import read_manifest
from lorapilot.data.inputs import Inputs, overlap, read_inputs
from lorapilot.data.rows import skipped_summary
from lorapilot.data.shots import refuse_shots_for_images
from lorapilot.decision.plan import pilot_of_run
from lorapilot.decision.reload import pinned_base
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.evaluate.predictions import prediction_summary
from lorapilot.evaluate.records import test_ledger, write_predictions
from lorapilot.fsutil import atomic_write_bytes
from lorapilot.modality import modality_of
from lorapilot.records import registry
from lorapilot.records.steprun import open_run
from lorapilot.spec import Pilot

PREDICTIONS = "predictions.jsonl"


def default_run(pilot_dir: Path) -> str | None:
    """The adapter the final test confirmed (the decision's), else None (the latest
    completed train run)."""
    for entry in reversed(test_ledger(pilot_dir)):
        rid = entry.get("evaluated")
        if rid in (None, "base"):
            continue
        try:
            rec = registry.get_run(pilot_dir, rid)
        except UsageError:  # its run folder was removed since: the latest completed one
            return None
        return rid if rec.kind == "train" and rec.status == "completed" else None
    return None


def run_predict(
    pilot: Pilot,
    input_path: Path,
    *,
    run_id: str | None = None,
    base: bool = False,
    out: Path | None = None,
    field_name: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    shots: int = 0,
    linear_probe: bool = False,
) -> dict:
    """Predict every input of `input_path` with train run `run_id`'s adapter (default: the one
    the final test confirmed, else the latest completed), or the base with `base=True`
    (`shots`: shown that many training examples first, as `baseline --shots` shows them;
    `linear_probe`: read by the logistic regression `baseline --linear-probe` fits)."""
    say = log or (lambda m: None)
    if base and run_id:
        raise UsageError("--base and --run: choose one (the base model, or a run's adapter)")
    if shots and not base:
        raise UsageError(
            f"--shots {shots}: demonstrations prompt the base model (--base); an adapter is "
            "prompted as it was trained"
        )
    refuse_shots_for_images(pilot.spec.task, shots)
    if linear_probe:
        from lorapilot.evaluate.text_probe import refuse

        refuse(pilot.spec, shots, not base)
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit {limit}: must be a positive number of inputs")
    if out is not None and (Path(out).is_dir() or not Path(out).parent.is_dir()):
        raise UsageError(f"--out {out}: must be a file path in an existing folder")
    parent, adapter = (None, None) if base else registry.adapter_of(
        pilot.dir, run_id or default_run(pilot.dir)
    )  # fmt: skip
    if parent is not None:  # the base loaded as that run's variant loaded it (quantization)
        pilot = pilot_of_run(pilot, parent)
    inputs = read_inputs(pilot, input_path, field_name, answer_field)
    records = inputs.records[:limit] if limit else inputs.records
    with open_run(pilot, "predict", parent=parent) as run:
        loaded = _load(pilot, adapter, shots, linear_probe)
        run.record.data_version = loaded.prepared.version
        seen = overlap(records, loaded.prepared.splits)
        for split, found in seen.items():
            say(f"{found['n']} of the inputs are examples of the pilot's {split} split")
        extras: dict = {}
        if shots or linear_probe:  # an alternative, exactly as `baseline` evaluated it
            protocol = loaded.protocol
            ev, extras = loaded.evaluate_base(
                records, protocol, label="predict", progress=progress, log=log, generation=False
            )
        else:
            ev, protocol = loaded.evaluate(
                loaded.model, records, label="predict", progress=progress, log=log,
                generation=False,
            )  # fmt: skip
        if limit is not None:
            protocol["limit"] = limit
        write_predictions(run.dir / PREDICTIONS, ev.predictions)
        if out is not None:  # the user's copy, written whole or not at all
            atomic_write_bytes(out, (run.dir / PREDICTIONS).read_bytes())
        scored = ev.metrics.get("n", 0)
        summary = prediction_summary(pilot.spec.task, ev.predictions)
        result = {
            "split": "inputs",  # not a split of the pilot: compare never takes it for val
            "input": inputs.record(),
            "n": len(records),
            "n_scored": scored,
            "summary": summary,
            # the inputs that carry an answer, scored as the evaluation scores: an outside
            # check of the adapter, not the decision's validation or test figures
            "metrics": ev.metrics if scored else None,
            "in_pilot_splits": seen,
            "warnings": _warnings(inputs, seen, summary["truncated"]),
            "eval_protocol": protocol["eval_protocol"],
            "protocol": protocol,
            **({"shots": protocol["shots"]} if shots else {}),
            **({"linear_probe": extras["linear_probe"]} if linear_probe else {}),
            "adapter": str(adapter) if adapter else None,
            "train_run": parent,
            "base": loaded.resolved.record(),
            "data_version": loaded.prepared.version,
            "seconds": round(ev.seconds, 3),
            "examples_per_s": round(ev.examples_per_s, 3),
            "device": ev.device,
            "predictions": str(run.dir / PREDICTIONS),
            "out": str(out) if out is not None else None,
        }
        run.update(**result)
    return {"run_id": run.id, "status": run.record.status, **result}


def _load(pilot: Pilot, adapter: Path | None, shots: int = 0, linear_probe: bool = False):
    """The base, with the adapter attached on the base it was trained on (its files, the
    base's weights and quantization, the tokenizer and template checked as `verify` checks
    them): predictions on another base would be another model's, reported as this one's.
    Without an adapter, `shots`: the base's prompt shows that many training examples;
    `linear_probe`: the base's features read by the probe fitted on the training split."""
    if adapter is None:
        return modality_of(pilot).load(shots=shots, linear_probe=linear_probe)
    manifest = read_manifest(adapter)
    resolved, _, problems = pinned_base(pilot, adapter, manifest)
    if not problems:
        loaded = modality_of(pilot).load(adapter, manifest, resolved)
        problems = loaded.problems
    if problems:
        raise CheckFailed(
            f"the adapter {adapter} is not on what it was trained with: " + "; ".join(problems),
            {"problems": problems},
        )
    return loaded


def _warnings(inputs: Inputs, seen: dict, cut: dict) -> list[str]:
    out = []
    if cut["n"]:
        out.append(
            f"{cut['n']} inputs were cut to fit data.max_length (as the pilot cuts its own): "
            f"{', '.join(cut['ids'][:5])}{' ...' if cut['n'] > 5 else ''}; `tokens_cut` in "
            "each prediction says by how much"
        )
    if "test" in seen:
        out.append(
            f"{seen['test']['n']} inputs are examples of the reserved test split: their "
            "predictions are not a test result (the final test is `lorapilot eval --split test "
            "--final`, logged)"
        )
    if "train" in seen:
        out.append(
            f"{seen['train']['n']} inputs are training examples: their predictions say "
            "nothing of how the model does on new inputs"
        )
    if inputs.skipped:
        why = "; ".join(
            f"{g['problem']}: {g['count']}" for g in skipped_summary(inputs.skipped)[:3]
        )
        out.append(
            f"{len(inputs.skipped)} rows of {inputs.path} were set aside ({why}); "
            "input.skipped_by_problem names them"
        )
    if inputs.dropped:
        out.append(f"{len(inputs.dropped)} inputs were empty after the cleaning rules")
    return out
