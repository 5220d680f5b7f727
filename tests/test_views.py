"""The terminal views show each task kind's own metrics (every one is in --json too): a
regex format task's validity and answer match, not an empty line."""

from __future__ import annotations

from rich.console import Console

from lorapilot import views

FORMAT_METRICS = {"n": 90, "format_valid_rate": 0.9, "exact_match": 0.0, "answer_match": 0.04}


def _shown(monkeypatch, view, record: dict) -> str:
    console = Console(record=True, width=160, highlight=False)
    monkeypatch.setattr(views, "stdout", console)
    view(record)
    return console.export_text()


def test_a_format_task_s_metrics_are_shown_by_evaluation_train_and_compare(monkeypatch):
    ev = {"split": "val", "n": 90, "run_id": "eval-1", "eval_protocol": "ep-1",
          "examples_per_s": 1.0, "metrics": FORMAT_METRICS, "predictions": "p.jsonl"}  # fmt: skip
    text = _shown(monkeypatch, views.evaluation, ev)
    assert "format_valid_rate=0.900" in text and "answer_match=0.040" in text

    tr = {"status": "completed", "run_id": "train-1", "variant": "base", "wall_s": 10.0,
          "steps": 90, "update_audit": {"ok": True}, "trainable_params": 1,
          "total_params": 2, "target_modules": ["q_proj"], "initial_val_loss": 1.0,
          "final_val_loss": 0.5, "metrics": FORMAT_METRICS, "adapter_path": "a"}  # fmt: skip
    text = _shown(monkeypatch, views.train, tr)
    assert "format_valid_rate=0.900" in text and "answer_match=0.040" in text

    row = {"id": "train-1", "kind": "train", "status": "completed", "variant": "base",
           "metrics": FORMAT_METRICS,
           "deltas": {"overall": {"format_valid_rate": 0.88, "answer_match": 0.02}}}  # fmt: skip
    compared = {"baseline": "baseline-1", "runs": [row], "decision": None}
    text = _shown(monkeypatch, views.compare, compared)
    assert "format_valid_rate+0.880" in text and "answer_match+0.020" in text
