"""`smoke` on the real default model: it overfits a few examples and catches shifted labels.

A file of its own so that the two-worker test run (`make test`) can put it beside the other
long default-model tests instead of after them.
"""

from __future__ import annotations

import pytest
from conftest import run_cli, run_json


@pytest.mark.slow
def test_smoke_passes_and_catches_shifted_labels(tmp_path, default_model_dir, monkeypatch):
    from lorapilot.data import format as fmt_mod
    from lorapilot.spec import load_pilot
    from lorapilot.steps.smoke import run_smoke

    # `init`'s pilot (3 labels, short prompts): the wiring on the real model, in little time
    run_json("init", "q", "--dir", str(tmp_path))
    pilot = tmp_path / "q"
    ok = run_json("smoke", str(pilot), "--per-category", "1", "--steps", "30", "--no-progress")
    # 3 categories x 1, topped up to smoke.min_examples (8) from the other training examples
    assert ok["ok"] and ok["n_correct"] == ok["n_examples"] == 8 and ok["final_loss"] < 0.1
    assert ok["status"] == "completed"
    # overfit within a few steps (loss < 0.01 at step 8 of 30 in the suite's runs): no more
    assert ok["stopped_early"] and ok["steps"] < ok["max_steps"] == 30

    real_encode = fmt_mod.PromptFormatter.encode

    def shifted(self, text, answer, budget, context=()):
        enc = real_encode(self, text, answer, budget, context)
        enc.labels = enc.labels[1:] + [fmt_mod.IGNORE_INDEX]  # the classic off-by-one
        return enc

    monkeypatch.setattr(fmt_mod.PromptFormatter, "encode", shifted)
    bad = run_smoke(
        load_pilot(pilot), per_category=1, max_steps=10, progress=False, log=lambda m: None
    )
    assert not bad["ok"] and bad["n_correct"] < bad["n_examples"]
    assert bad["status"] == "failed"  # a check that did not pass is listed as failed
    listed = run_json("runs", str(pilot))
    smokes = [r for r in listed["runs"] if r["kind"] == "smoke"]
    assert [r["status"] for r in smokes] == ["completed", "failed"]
    assert "could not overfit" in smokes[-1]["error"]
    human = run_cli("runs", str(pilot))
    assert human.returncode == 0
