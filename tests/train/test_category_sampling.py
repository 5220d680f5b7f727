"""train.category_sampling: the draw weights, an epoch's draws (seeded, resumable), what the
record says each category gets, and the train verb on a tiny pilot."""

from __future__ import annotations

from collections import Counter

import pytest

from lorapilot.errors import UsageError
from lorapilot.spec import TrainSpec
from lorapilot.train.batches import (
    MicroBatchStream,
    category_weights,
    length_grouped_batches,
    sampling_summary,
)

CATS = ["common"] * 90 + ["rare"] * 10
LENGTHS = [5 + i % 7 for i in range(len(CATS))]


def test_weights_are_inverse_counts_to_the_chosen_power():
    assert category_weights(CATS, "natural") is None
    balanced = category_weights(CATS, "balanced")
    assert balanced[0] == pytest.approx(1 / 90) and balanced[-1] == pytest.approx(1 / 10)
    sqrt = category_weights(CATS, "sqrt")
    assert sqrt[0] == pytest.approx(90**-0.5) and sqrt[-1] == pytest.approx(10**-0.5)
    per = sampling_summary(CATS, balanced)
    assert per["common"] == {"examples": 90, "draws_per_epoch": 50.0, "per_example": 0.556}
    assert per["rare"] == {"examples": 10, "draws_per_epoch": 50.0, "per_example": 5.0}
    per = sampling_summary(CATS, sqrt)  # 90 * 90^-0.5 : 10 * 10^-0.5 = 9.49 : 3.16
    assert per["rare"]["draws_per_epoch"] == pytest.approx(25.0, abs=0.1)
    assert sampling_summary(CATS, None)["rare"] == {
        "examples": 10, "draws_per_epoch": 10, "per_example": 1.0,
    }  # fmt: skip


def test_a_balanced_epoch_draws_each_category_about_equally_and_repeats_exactly():
    w = category_weights(CATS, "balanced")
    drawn: Counter = Counter()
    for epoch in range(20):
        batches = length_grouped_batches(LENGTHS, 8, seed=0, epoch=epoch, weights=w)
        flat = [i for b in batches for i in b]
        assert len(flat) == len(CATS)  # an epoch is still as many examples as the set
        drawn.update(CATS[i] for i in flat)
        assert batches == length_grouped_batches(LENGTHS, 8, seed=0, epoch=epoch, weights=w)
    assert 0.45 < drawn["rare"] / sum(drawn.values()) < 0.55  # natural: 0.10
    natural = [i for b in length_grouped_batches(LENGTHS, 8, 0, 0) for i in b]
    assert sorted(natural) == list(range(len(CATS)))  # natural: each example once


def test_the_stream_resumes_the_same_draws():
    w = category_weights(CATS, "sqrt")
    a = MicroBatchStream(LENGTHS, 8, seed=3, weights=w)
    seen = [a.next() for _ in range(30)]  # crosses an epoch (13 micro-batches each)
    b = MicroBatchStream(LENGTHS, 8, seed=3, weights=w)
    b.seek(a.epoch, a.index)
    assert [a.next() for _ in range(5)] == [b.next() for _ in range(5)]
    assert seen != [MicroBatchStream(LENGTHS, 8, seed=3).next() for _ in range(30)]


def test_the_loop_refuses_a_set_without_categories(tiny_model_dir):
    from lorapilot.data.format import Encoded
    from lorapilot.train.loop import train
    from tests.train.test_loop import lora_model

    cfg = TrainSpec(max_steps=1, category_sampling="balanced", precision="fp32")
    ex = [Encoded(input_ids=[1, 2, 3], labels=[-100, 2, 3], prompt_len=1, answer="x")] * 2
    with pytest.raises(UsageError, match="category_sampling: balanced needs the examples"):
        train(lora_model(tiny_model_dir), ex, ex, cfg, "/nonexistent/x", pad_id=0,
              progress=False, log=lambda m: None)  # fmt: skip


def test_train_verb_records_each_categorys_draws(tiny_model_dir, tmp_path):
    from conftest import init_tiny_pilot, run_cli, run_json

    pilot = init_tiny_pilot(tmp_path, tiny_model_dir, max_steps=2)
    out = run_json("train", str(pilot), "--no-progress", "--set",
                   "train.category_sampling=balanced")  # fmt: skip
    s = out["sampling"]
    assert s["mode"] == "balanced"
    draws = {c: v["draws_per_epoch"] for c, v in s["per_category"].items()}
    assert len(set(draws.values())) == 1  # every category drawn equally often
    n = sum(v["examples"] for v in s["per_category"].values())
    assert sum(draws.values()) == pytest.approx(n, abs=0.5)
    assert run_json("train", str(pilot), "--no-progress")["sampling"] is None  # natural
    bad = run_cli("check", str(pilot), "--set", "train.category_sampling=weighted")
    assert bad.returncode == 2 and "train.category_sampling" in bad.stderr
