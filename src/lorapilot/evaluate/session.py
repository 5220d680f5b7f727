"""One evaluation in a run record, shared by the `baseline` and `eval` steps (and `run`'s
final test): evaluate the base (or base + adapter) on a split and keep everything.

Each writes, in its run folder: `predictions.jsonl` (one row per example), `metrics.json`
and `protocol.json` (the evaluation protocol and its hash). The test split is reserved:
only `eval --split test --final` touches it, and every access is appended to
`runs/test_ledger.jsonl` under a lock. The final test of an adapter also evaluates the base
on the same rows in the same access (`baseline_predictions.jsonl`), so the decision can be
confirmed on test with a paired gain. A baseline that fits a linear probe (images; text
with `--linear-probe`) also lists the training examples whose label its features contradict
(`label_issues.jsonl`, evaluate/label_issues.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lorapilot.data.shots import refuse_shots_for_images
from lorapilot.errors import UsageError
from lorapilot.evaluate.label_issues import SUSPECT_ROWS
from lorapilot.evaluate.records import (
    BASELINE_PREDICTIONS,
    record_test_access,
    write_eval_files,
    write_predictions,
)
from lorapilot.modality import modality_of
from lorapilot.records.steprun import open_run
from lorapilot.spec import Pilot

LABEL_ISSUES = "label_issues.jsonl"  # a probe baseline's suspect training labels


def _limit(records: list, limit: int | None) -> list:
    if limit is None:
        return records
    if limit <= 0:
        raise UsageError(f"--limit {limit}: must be a positive number of examples")
    return records[:limit]


def evaluate_split(
    pilot: Pilot,
    kind: str,
    *,
    split: str = "val",
    adapter_dir: Path | None = None,
    parent: str | None = None,
    limit: int | None = None,
    progress: bool = True,
    final: bool = False,
    log: Callable[[str], None] | None = None,
    shots: int = 0,
    linear_probe: bool = False,
) -> dict:
    """Evaluate the base (or base + adapter) on a split inside a run of `kind`; `shots`: the
    base prompted with that many training examples first (a few-shot baseline);
    `linear_probe`: a logistic regression on the base's prompt features, fitted on train
    (the embedding-classifier alternative, evaluate/text_probe.py)."""
    if split == "test" and not final:
        raise UsageError(
            "the test split is reserved: use `lorapilot eval PILOT --split test --final`"
        )
    if split not in ("val", "test"):
        raise UsageError(f"--split {split!r}: must be val or test")
    refuse_shots_for_images(pilot.spec.task, shots)
    if linear_probe:
        from lorapilot.evaluate.text_probe import refuse

        refuse(pilot.spec, shots, adapter_dir is not None)
    if shots and adapter_dir is not None:
        raise UsageError(
            "--shots: few-shot prompting is a baseline of a text pilot's base model; an adapter "
            "is evaluated as it was trained"
        )
    with open_run(pilot, kind, parent=parent) as run:
        if shots:  # on the record from the start: a few-shot run is never taken for zero-shot
            run.update(shots={"k": shots})
        if linear_probe:  # likewise: an alternative, never the zero-shot baseline
            run.update(linear_probe={"fitted_on": {"split": "train"}})
        loaded = modality_of(pilot).load(adapter_dir, shots=shots, linear_probe=linear_probe)
        resolved, model, prepared = loaded.resolved, loaded.model, loaded.prepared
        run.record.data_version = prepared.version
        records = _limit(prepared.splits[split], limit)
        if not records:
            raise UsageError(f"the {split} split is empty; nothing to evaluate")
        if split == "test":
            earlier = record_test_access(pilot.dir, run.id, parent, adapter_dir)
        label = f"{kind} ({split})"
        extras: dict = {}
        if adapter_dir is None:  # the baseline classifier (images: the linear probe)
            # a probe's baseline on validation also reviews the training labels
            result, extras = loaded.evaluate_base(
                records, loaded.protocol, label=label, progress=progress, log=log,
                label_issues=split == "val",
            )  # fmt: skip
            protocol = loaded.protocol
            suspects = extras.pop(SUSPECT_ROWS, None)
            if suspects is not None:
                write_predictions(run.dir / LABEL_ISSUES, suspects)
                extras["label_issues"]["file"] = str(run.dir / LABEL_ISSUES)
        else:
            result, protocol = loaded.evaluate(
                model, records, label=label, progress=progress, log=log
            )
        if limit is not None:
            protocol["limit"] = limit
        write_eval_files(run.dir, result)
        base_out = {}
        if split == "test" and adapter_dir is not None:
            # The base on the same test rows, in the same access (same protocol): the test
            # gain is then paired example by example, like validation's.
            base_result, base_extras = loaded.evaluate_base(
                records, protocol, label="baseline (test)", progress=progress, log=log
            )
            write_predictions(run.dir / BASELINE_PREDICTIONS, base_result.predictions)
            base_out = {
                "baseline_metrics": base_result.metrics,
                "baseline_calibration": base_result.calibration,
                "baseline_generation": base_result.generation,
                "baseline_probe": base_extras.get("probe"),  # images: the probe refitted
                "baseline_seconds": round(base_result.seconds, 3),
                "baseline_predictions": str(run.dir / BASELINE_PREDICTIONS),
            }
        out = {
            "split": split,
            "n": len(records),
            "metrics": result.metrics,
            **extras,
            "eval_protocol": protocol["eval_protocol"],
            "peak_memory_bytes": result.peak_memory_bytes,
            "protocol": protocol,
            "data_version": prepared.version,
            "base": resolved.record(),
            "adapter": str(adapter_dir) if adapter_dir else None,
            "seconds": round(result.seconds, 3),
            "examples_per_s": round(result.examples_per_s, 3),
            "device": result.device,
            "predictions": str(run.dir / "predictions.jsonl"),
            **base_out,
        }
        if "shots" in protocol:
            out["shots"] = protocol["shots"]
        if result.calibration is not None:
            out["calibration"] = result.calibration
        if result.generation is not None:  # eval.generation_check: as a chat server answers
            out["generation"] = result.generation
        if split == "test":
            out["test_accesses_before"] = earlier
        run.update(**out)
    return {"run_id": run.id, "status": run.record.status, **out}
