"""`baseline --shots K`: the base prompted with K training examples, the prompting alternative
an adapter must beat; recorded as a baseline run of its own, never taken for the zero-shot
baseline of the success criterion; compare and the report set the chosen adapter against
it. Tiny random models."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import EXAMPLES, init_tiny_pilot, run_cli, run_json

from lorapilot.data.rows import Record
from lorapilot.data.shots import pick_shots
from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot


def _rec(i: int, cat: str) -> Record:
    return Record(id=f"r{i:02d}", text=f"text {i}", label=cat, target=None, source=f"f:{i}",
                  split="train", category=cat)  # fmt: skip


RECORDS = [_rec(i, c) for i, c in enumerate("aaaaaabbbc")]


def test_shots_take_the_categories_in_turn_commonest_first_and_are_seeded():
    three = pick_shots(RECORDS, 3, seed=0)
    assert sorted(r.category for r in three) == ["a", "b", "c"]
    five = pick_shots(RECORDS, 5, seed=0)
    assert sorted(r.category for r in five) == ["a", "a", "b", "b", "c"]
    assert len({r.id for r in pick_shots(RECORDS, 10, seed=0)}) == 10
    assert len(pick_shots(RECORDS, 50, seed=0)) == 10  # no more than there are
    assert [r.id for r in pick_shots(RECORDS, 5, seed=0)] == [r.id for r in five]
    assert {r.id for r in pick_shots(RECORDS, 5, seed=1)} != {r.id for r in five}
    assert pick_shots(RECORDS, 0, seed=0) == []
    two = pick_shots(RECORDS, 2, seed=0)  # fewer than the categories: the commonest
    assert sorted(r.category for r in two) == ["a", "b"]


@pytest.fixture(scope="module")
def pilot(tmp_path_factory, tiny_model_dir):
    return init_tiny_pilot(tmp_path_factory.mktemp("shots"), tiny_model_dir, max_steps=3)


def test_a_few_shot_baseline_shows_the_examples_and_stays_beside_the_decision(pilot):
    zero = run_json("baseline", str(pilot), "--no-progress")
    few = run_json("baseline", str(pilot), "--shots", "3", "--no-progress")
    shots = few["shots"]
    assert shots["k"] == 3 and len(shots["ids"]) == 3 and shots["seed"] == 0
    assert sorted(shots["categories"]) == ["complaint", "praise", "question"]
    assert shots["prompt_tokens_added"] > 0
    assert few["protocol"]["shots"] == shots and "shots" not in zero["protocol"]
    assert few["eval_protocol"] != zero["eval_protocol"] and few["n"] == zero["n"]
    data = json.loads((pilot / "runs" / zero["run_id"] / "run.json").read_text())
    rows = [json.loads(x) for x in (pilot / "data" / "examples.jsonl").read_text().splitlines()]
    texts = {r["id"]: r["text"] for r in rows}
    preds = [json.loads(x) for x in open(few["predictions"])]
    for p in preds:  # every prompt: the three demonstrations, then the input, as the template
        for sid in shots["ids"]:
            assert f"Message:\n{texts[sid]}\n\nCategory:" in p["prompt"]
        assert p["prompt"].count("Category:") == 4
    zero_preds = [json.loads(x) for x in open(zero["predictions"])]
    assert [p["id"] for p in preds] == [p["id"] for p in zero_preds]
    assert all(p["prompt"].count("Category:") == 1 for p in zero_preds)
    assert data["status"] == "completed"

    # inspect --shots: the same demonstrations before every example, the loss on its answer
    ins = run_json("inspect", str(pilot), "--shots", "3", "--per-category", "1")
    assert ins["ok"] and ins["shots"] == shots and len(ins["examples"]) == 3
    for ex in ins["examples"]:
        assert ex["rendered"].count("Category:") == 4 and ex["match"]
        assert all(f"Message:\n{texts[sid]}\n\nCategory:" in ex["rendered"] for sid in shots["ids"])
    assert "shots" not in run_json("inspect", str(pilot), "--per-category", "1")
    # the prompting alternative on new inputs: the same prompts, the same predictions
    new = pilot / "new.jsonl"
    new.write_text("".join(json.dumps({"id": f"n{i}", "text": p["text"], "label": p["gold"]})
                           + "\n" for i, p in enumerate(preds)))  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(new), "--base", "--shots", "3",
                   "--no-progress")  # fmt: skip
    assert out["shots"] == shots and out["eval_protocol"] == few["eval_protocol"]
    assert out["metrics"]["macro_f1"] == pytest.approx(few["metrics"]["macro_f1"])
    got = [json.loads(x) for x in open(out["predictions"])]
    assert [g["parsed"] for g in got] == [p["parsed"] for p in preds]
    assert [g["prompt"] for g in got] == [p["prompt"] for p in preds]
    res = run_cli("predict", str(pilot), "--input", str(new), "--shots", "3")
    assert res.returncode == 2 and "--shots 3: demonstrations prompt the base model" in res.stderr

    train = run_json("train", str(pilot), "--no-progress")
    cmp = run_json("compare", str(pilot))
    assert cmp["baseline"] == zero["run_id"]  # the later few-shot run is not the baseline
    row = next(r for r in cmp["runs"] if r["id"] == few["run_id"])
    assert row["variant"] == "3-shot prompt" and "deltas" not in row
    p = cmp["prompting"]
    assert p["run_id"] == few["run_id"] and p["adapted_run"] == train["run_id"]
    assert p["shots"] == 3 and p["why_not"] is None and p["metric"] == "macro_f1"
    assert p["gain"] == pytest.approx(p["adapted"] - p["few_shot"], abs=1e-6)
    assert p["few_shot"] == pytest.approx(few["metrics"]["macro_f1"])
    assert p["ci_low"] <= p["gain"] <= p["ci_high"]
    assert p["adapter_beats_prompting"] == (p["gain"] >= 0.10 and p["ci_low"] > 0)
    rep = run_json("report", str(pilot))
    assert rep["prompting"] == p
    md = open(rep["markdown"]).read()
    assert "### Against prompting: the base shown 3 training examples" in md
    assert f"| few-shot run | {few['run_id']} |" in md
    # 3 steps of a tiny random model gain nothing over its own few-shot prompt
    assert p["adapter_beats_prompting"] is False
    assert any("a few-shot prompt may serve" in x for x in rep["limitations"])
    assert "`lorapilot predict PILOT --base --shots 3 --input FILE`" in md


def test_too_many_shots_for_the_context_are_refused(pilot):
    # data.max_length auto: the model's whole context, no room left for demonstrations
    res = run_cli(
        "baseline", str(pilot), "--shots", "2", "--set", "data.max_length=auto", "--no-progress"
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--shots 2: the 2 demonstrations add" in res.stderr
    assert "more than the model's context" in res.stderr
    res = run_cli("baseline", str(pilot), "--shots", "-1")
    assert res.returncode == 2


def test_an_image_pilot_has_no_few_shot_baseline(tmp_path):
    from lorapilot.evaluate.session import evaluate_split

    image = load_pilot(EXAMPLES / "fashion-items")
    with pytest.raises(UsageError, match="few-shot prompting is a baseline of a text pilot"):
        evaluate_split(image, "baseline", shots=3)
    spec = yaml.safe_load((EXAMPLES / "fashion-items" / "pilot.yaml").read_text())
    spec["eval"] = {**(spec.get("eval") or {}), "few_shot": 3}
    (tmp_path / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    res = run_cli("check", str(tmp_path))
    assert res.returncode == 2 and "eval.few_shot" in res.stdout + res.stderr


def test_an_extraction_pilot_s_demonstrations_answer_in_json(tmp_path, tiny_model_dir):
    """Generated answers: each demonstration's assistant turn is its target as the pilot
    trains it (compact JSON in the spec's field order); the input's answer is generated."""
    run_json("init", "x", "--dir", str(tmp_path), "--task", "extraction")
    pilot = tmp_path / "x"
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["train"].update(precision="fp32")
    spec["eval"] = {**spec.get("eval", {}), "max_new_tokens": 4}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    few = run_json("baseline", str(pilot), "--shots", "2", "--limit", "3", "--no-progress")
    rows = {
        r["id"]: r
        for r in map(json.loads, (pilot / "data" / "examples.jsonl").read_text().splitlines())
    }
    assert few["protocol"]["mode"] == "generate" and few["shots"]["k"] == 2
    preds = [json.loads(x) for x in open(few["predictions"])]
    assert len(preds) == 3
    for p in preds:
        for sid in few["shots"]["ids"]:
            target = rows[sid]["target"]
            first = next(iter(target))  # the answer as trained: its first field comes first
            assert f"Order:\n{rows[sid]['text']}\n\nJSON:" in p["prompt"]
            assert f'{{"{first}": {json.dumps(target[first])}' in p["prompt"]


def test_nearest_shots_are_the_most_similar_training_inputs_nearest_last():
    from lorapilot.data.shots import NearestShots

    recs = [
        Record(id=i, text=t, label="x", target=None, source="f", split="train", category="x")
        for i, t in [("a", "refund for my broken phone"), ("b", "my phone screen is broken"),
                     ("c", "where is my parcel"), ("d", "Where is my parcel?"),
                     ("e", "how do I reset my password")]
    ]  # fmt: skip
    near = NearestShots(recs)
    got = [r.id for r in near.pick("the phone arrived broken, I want a refund", 2)]
    assert got == ["b", "a"]  # the nearest (two words shared, one rare) last
    # an input's own text (casefolded, stripped) is never shown to it: its twin is
    assert [r.id for r in near.pick("where is my parcel", 1)] == ["d"]
    assert [r.id for r in near.pick("zzz unrelated", 2)] == ["b", "a"]  # no overlap: by id
    assert len(near.pick("phone", 10)) == 5


def test_a_similar_shots_baseline_shows_each_input_its_neighbours(pilot):
    few = run_json("baseline", str(pilot), "--shots", "2", "--shot-selection", "similar",
                   "--no-progress")  # fmt: skip
    shots = few["shots"]
    assert shots["selection"] == "similar" and shots["k"] == 2
    assert shots["prompt_tokens_added_max"] > 0 and "ids" not in shots
    rows = [json.loads(x) for x in (pilot / "data" / "examples.jsonl").read_text().splitlines()]
    texts = {r["id"]: r["text"] for r in rows}
    preds = [json.loads(x) for x in open(few["predictions"])]
    assert len({tuple(p["shot_ids"]) for p in preds}) > 1  # chosen per input
    for p in preds:
        assert len(p["shot_ids"]) == 2 and p["prompt"].count("Category:") == 3
        last = p["prompt"].rfind(f"Message:\n{texts[p['shot_ids'][1]]}\n\nCategory:")
        first = p["prompt"].find(f"Message:\n{texts[p['shot_ids'][0]]}\n\nCategory:")
        assert 0 <= first < last < p["prompt"].rfind(f"Message:\n{p['text']}")
    new = pilot / "new_similar.jsonl"
    new.write_text("".join(json.dumps({"id": f"n{i}", "text": p["text"]}) + "\n"
                           for i, p in enumerate(preds)))  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(new), "--base", "--shots", "2",
                   "--shot-selection", "similar", "--no-progress")  # fmt: skip
    assert out["eval_protocol"] == few["eval_protocol"]
    got = [json.loads(x) for x in open(out["predictions"])]
    assert [g["prompt"] for g in got] == [p["prompt"] for p in preds]
    assert [g["shot_ids"] for g in got] == [p["shot_ids"] for p in preds]
    view = run_cli("predict", str(pilot), "--input", str(new), "--base", "--shots", "2",
                   "--shot-selection", "similar", "--no-progress")  # fmt: skip
    assert view.returncode == 0
    assert "the base model shown each input's 2 most similar training examples" in " ".join(
        view.stdout.split()
    )
    ins = run_json("inspect", str(pilot), "--shots", "2", "--shot-selection", "similar",
                   "--per-category", "1")  # fmt: skip
    assert ins["ok"] and ins["shots"]["selection"] == "similar"
    res = run_cli("baseline", str(pilot), "--shot-selection", "similar")
    assert res.returncode == 2 and "add --shots" in res.stderr
    cmp = run_json("compare", str(pilot))
    row = next(r for r in cmp["runs"] if r["id"] == few["run_id"])
    assert row["variant"] == "2-shot prompt (similar examples)"
    if cmp["prompting"] and cmp["prompting"]["run_id"] == few["run_id"]:
        assert cmp["prompting"]["selection"] == "similar"
