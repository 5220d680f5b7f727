"""train.early_stopping: the count (pure), the loop stopping where the count says, the
adapter holding the best point's weights, and a resumed run stopping as an uninterrupted
one does."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lorapilot.fsutil import read_jsonl
from lorapilot.records.registry import StoppedByLimit
from lorapilot.spec import TrainSpec
from lorapilot.train.early_stop import EarlyStop
from lorapilot.train.loop import train
from tests.train.test_loop import (
    adapter_tensors,
    assert_same_tensors,
    encoded_tickets,
    lora_model,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def examples(tiny_model_dir):
    """test_loop's 12 tickets, encoded as training encodes them."""
    from transformers import AutoTokenizer

    return encoded_tickets(AutoTokenizer.from_pretrained(tiny_model_dir))


def test_the_count_resets_on_a_better_point_and_ignores_step_0():
    es = EarlyStop(patience=2, min_delta=0.05)
    assert not es.observe(0, 0.1) and es.points == 0  # the untrained adapter is never the best
    assert es.observe(10, 1.0) and es.best_step == 10
    assert not es.observe(20, 0.97) and es.bad_points == 1  # better, but not by min_delta
    assert es.observe(30, 0.9) and (es.best_step, es.bad_points) == (30, 0)
    assert not es.observe(40, None) and not es.exhausted  # no val loss: no improvement
    assert not es.observe(50, 0.95) and es.exhausted
    again = EarlyStop.from_dict(es.to_dict())
    assert again == es and again.best_val_loss == 0.9 and again.points == 5


def test_early_stopping_needs_validation_points():
    with pytest.raises(ValidationError, match="set train.eval_every"):
        TrainSpec(early_stopping={"patience": 2})
    spec = TrainSpec(eval_every=5, early_stopping={"patience": 2})
    assert spec.early_stopping.restore_best and spec.early_stopping.min_delta == 0.0
    # omitted from the dump when unset: specs written before it keep their hash
    assert "early_stopping" not in TrainSpec().model_dump(mode="json")


def test_a_variant_that_trains_longer_with_early_stopping_is_one_change():
    from lorapilot.spec.load import variant_label

    diff = {"train.epochs": [1, 4], "train.eval_every": [None, 50],
            "train.early_stopping": [None, {"patience": 2}]}  # fmt: skip
    assert variant_label(diff) == "one_change"
    assert variant_label({**diff, "train.lr": [1e-4, 2e-4]}) == "combined"


# min_delta far above any loss change: only the first point (step 2) is ever "better", so
# with patience 2 the run stops at step 6 of 12 whatever the losses are.
CFG = dict(
    max_steps=12, eval_every=2, save_every=2, lr=1e-2, micro_batch=4, precision="fp32",
    warmup_ratio=0,
)  # fmt: skip
STOPPING = {"patience": 2, "min_delta": 100.0}


def run(tiny_model_dir, examples, out: Path, stopping=STOPPING, **kw):
    return train(
        lora_model(tiny_model_dir, dropout=0.1),
        examples[:8],
        examples[8:],
        TrainSpec(**CFG, early_stopping=stopping),
        out,
        pad_id=2,
        progress=False,
        log=kw.pop("log", lambda m: None),
        **kw,
    )


@pytest.fixture(scope="module")
def step2(tiny_model_dir, examples, tmp_path_factory) -> dict:
    """The adapter's tensors after step 2 of the same 12-step schedule, without early
    stopping (a cost cap stops it there with a checkpoint)."""
    out = tmp_path_factory.mktemp("step2") / "run"
    with pytest.raises(StoppedByLimit):
        run(tiny_model_dir, examples, out, stopping=None,
            cost_check=lambda s: "cap" if s["step"] == 2 else None)  # fmt: skip
    from safetensors.torch import load_file

    return load_file(out / "checkpoints" / "step-2" / "adapter_model.safetensors")


def test_the_run_stops_after_patience_points_and_keeps_the_best_weights(
    tiny_model_dir, examples, tmp_path, step2
):
    out = tmp_path / "run"
    messages: list[str] = []
    result = run(tiny_model_dir, examples, out, log=messages.append)
    assert result.steps == 6 and result.total_steps == 12
    assert [r["step"] for r in read_jsonl(out / "steps.jsonl")] == list(range(1, 7))
    val = {r["step"]: r["val_loss"] for r in read_jsonl(out / "val.jsonl")}
    assert sorted(val) == [0, 2, 4, 6]
    es = result.early_stopping
    assert es == {
        "patience": 2, "min_delta": 100.0, "restore_best": True, "stopped_early": True,
        "stopped_at_step": 6, "best_step": 2, "best_val_loss": val[2], "last_val_loss": val[6],
        "restored": True, "points": 3, "bad_points": 2,
    }  # fmt: skip
    # the adapter is step 2's, bit for bit; the run's own val loss is the best point's
    assert_same_tensors(adapter_tensors(out), step2)
    assert result.final_val_loss == val[2]
    # the last step stays the checkpoint to resume from; the best folder is kept beside it
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["best-step-2", "latest.json", "step-4", "step-6"]
    assert any("stopping after step 6 of 12" in m for m in messages)
    assert any("adapter is step 2's" in m for m in messages)


def test_restore_best_false_keeps_the_last_steps_weights(tiny_model_dir, examples, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    result = run(tiny_model_dir, examples, out, stopping={**STOPPING, "restore_best": False})
    assert result.steps == 6 and result.early_stopping["restored"] is False
    last = load_file(out / "checkpoints" / "step-6" / "adapter_model.safetensors")
    assert_same_tensors(adapter_tensors(out), last)
    assert not list((out / "checkpoints").glob("best-step-*"))  # nothing kept to restore
    assert result.final_val_loss == result.early_stopping["last_val_loss"]


def test_a_resumed_run_stops_and_restores_as_the_uninterrupted_one(
    tiny_model_dir, examples, tmp_path, step2
):
    out = tmp_path / "run"
    with pytest.raises(StoppedByLimit, match="after step 5"):
        run(tiny_model_dir, examples, out, cost_check=lambda s: "cap" if s["step"] == 5 else None)
    result = run(tiny_model_dir, examples, out, resume=True)
    assert result.resumed_from == 5 and result.steps == 6
    assert result.early_stopping["best_step"] == 2 and result.early_stopping["points"] == 3
    assert_same_tensors(adapter_tensors(out), step2)


def test_a_resume_without_the_best_weights_is_refused(tiny_model_dir, examples, tmp_path):
    import shutil

    from lorapilot.errors import UsageError

    out = tmp_path / "run"
    with pytest.raises(StoppedByLimit):
        run(tiny_model_dir, examples, out, cost_check=lambda s: "cap" if s["step"] == 5 else None)
    shutil.rmtree(out / "checkpoints" / "best-step-2")
    with pytest.raises(
        UsageError, match=r"best weights of this run \(step 2\).*missing; start a new run"
    ):
        run(tiny_model_dir, examples, out, resume=True)
    assert (out / "checkpoints" / "step-5").is_dir()  # the refusal leaves the checkpoint


def test_train_verb_reports_it_and_the_report_names_the_adapters_step(tiny_model_dir, tmp_path):
    from conftest import init_tiny_pilot, run_cli, run_json

    pilot = init_tiny_pilot(
        tmp_path, tiny_model_dir, max_steps=8, eval_every=2,
        early_stopping={"patience": 1, "min_delta": 100.0},
    )  # fmt: skip
    out = run_json("train", str(pilot), "--no-progress")
    es = out["early_stopping"]
    assert out["steps"] == 4 and out["total_steps"] == 8
    assert (es["stopped_early"], es["best_step"], es["restored"]) == (True, 2, True)
    assert out["final_val_loss"] == es["best_val_loss"] != es["last_val_loss"]
    record = __import__("json").loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert record["result"]["train"]["early_stopping"] == es
    # the variant's step shape ignores it: runs with and without it share one probe
    from lorapilot.decision.plan import step_shape

    without = {**record["config"], "train": {**record["config"]["train"]}}
    without["train"].pop("early_stopping")
    assert step_shape(record["config"]) == step_shape(without)
    report = run_json("report", str(pilot))
    md = Path(report["markdown"]).read_text()
    assert "adapter weights (train.early_stopping)" in md
    assert "step 2 (best val loss); stopped early at 4" in md
    text = run_cli("train", str(pilot), "--no-progress").stdout
    assert "early stopping: stopped early at step 4 of 8; adapter from step 2" in text
