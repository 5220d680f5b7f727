"""`lorapilot verify`: reload the adapter with its pinned base in a fresh process
(`lorapilot.decision.reload`), re-evaluate, and compare with the train run's in-process result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from lorapilot.base.manifest import (
    METRIC_TOLERANCE,
    SCORE_TOLERANCE,
    compare_predictions,
    metrics_equal,
    read_manifest,
)
from lorapilot.errors import CheckFailed, LorapilotError
from lorapilot.fsutil import read_jsonl
from lorapilot.records import registry
from lorapilot.records.steprun import open_run


def run_verify(pilot, run_id: str | None = None, timeout: int = 3600) -> dict:
    """Re-evaluate a train run's adapter in a NEW Python process that only reads from disk,
    and compare with the train run's in-process evaluation."""

    train_id, adapter_dir = registry.adapter_of(pilot.dir, run_id)
    manifest = read_manifest(adapter_dir)
    train_dir = registry.runs_dir(pilot.dir) / train_id
    with open_run(pilot, "verify", parent=train_id) as run:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lorapilot.decision.reload",
                str(pilot.dir),
                str(adapter_dir),
                str(run.dir),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        child_path = run.dir / "verify_child.json"
        if proc.returncode != 0 or not child_path.is_file():
            raise LorapilotError(
                f"the verify process failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            )
        child = json.loads(child_path.read_text())
        run.record.data_version = child.get("data_version")
        out: dict[str, Any] = {
            "train_run": train_id,
            "adapter": str(adapter_dir),
            "base_sha256": child.get("base_sha256"),
            "expected_base_sha256": child.get("expected_base_sha256", manifest["base"]["sha256"]),
            "fresh_process_pid_differs": True,
            "device": child.get("device"),
            "eval_peak_memory_bytes": child.get("eval_peak_memory_bytes"),
            "problems": child.get("problems", []),
        }
        if child.get("refused"):
            out.update(ok=False, metrics_match=False, n_mismatched_predictions=None, metrics=None)
            run.update(**out)
            raise CheckFailed(
                "verify refused: " + "; ".join(out["problems"]), {"run_id": run.id, **out}
            )
        in_proc = json.loads((train_dir / "metrics.json").read_text())
        cmp = compare_predictions(
            read_jsonl(train_dir / "predictions.jsonl"), read_jsonl(run.dir / "predictions.jsonl")
        )
        match, differing = metrics_equal(in_proc, child["metrics"])
        ok = bool(child.get("ok")) and match and cmp["n_mismatched_predictions"] == 0
        out.update(
            ok=ok,
            metrics_match=match,
            metrics_differing=differing,
            metrics=child["metrics"],
            in_process_metrics=in_proc,
            eval_protocol=child.get("eval_protocol"),
            tolerance={
                "metrics": METRIC_TOLERANCE,
                "predictions": "identical",
                "label_scores_reported_not_gated": SCORE_TOLERANCE,
            },
            **cmp,
        )
        run.update(**out)
        if not ok:
            raise CheckFailed(
                f"verify mismatch: {cmp['n_mismatched_predictions']} prediction(s) differ, "
                f"metrics match: {match}"
                + (f"; {'; '.join(out['problems'])}" if out["problems"] else ""),
                {"run_id": run.id, **out},
            )
    return {"run_id": run.id, "status": run.record.status, **out}
