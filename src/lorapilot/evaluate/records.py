"""An evaluation's files (predictions, metrics, protocol) and the test-split ledger."""

from __future__ import annotations

import json
from pathlib import Path

from lorapilot.evaluate.runner import EvalResult
from lorapilot.fsutil import append_jsonl, atomic_write_bytes, atomic_write_json, locked, read_jsonl
from lorapilot.records import registry

LEDGER = "test_ledger.jsonl"


BASELINE_PREDICTIONS = "baseline_predictions.jsonl"
CALIBRATION = "calibration.json"  # eval.label_scoring: calibrated


def write_predictions(path: Path, rows: list[dict]) -> None:
    lines = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    atomic_write_bytes(path, lines.encode("utf-8"))


def write_eval_files(run_dir: Path, result: EvalResult) -> None:
    write_predictions(run_dir / "predictions.jsonl", result.predictions)
    atomic_write_json(run_dir / "metrics.json", result.metrics)
    atomic_write_json(run_dir / "protocol.json", result.protocol)
    if result.calibration is not None:
        atomic_write_json(run_dir / CALIBRATION, result.calibration)


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
