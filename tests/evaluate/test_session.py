"""`baseline` and `eval` end to end (subprocess, --json): outputs kept, protocol hashed,
the test split reserved and every access logged."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import EXAMPLES, run_cli, run_json

from lorapilot.records.environment import cpu_has_fast_bf16


def _tiny_pilot(tmp_path, example: str, tiny_model_dir, **overrides):
    pilot = tmp_path / example
    shutil.copytree(EXAMPLES / example, pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    for key, value in overrides.items():
        section, name = key.split("__")
        spec.setdefault(section, {})[name] = value
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


@pytest.mark.slow
def test_baseline_ticket_triage_real_model(tmp_path, default_model_dir):
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["sample"] = {"val": 36}  # 6 per label: the real model, in the suite's time
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_json("baseline", str(pilot), "--no-progress")
    m = out["metrics"]
    labels = yaml.safe_load((pilot / "pilot.yaml").read_text())["task"]["labels"]
    assert set(m["per_category"]) == set(labels)
    assert 0 <= m["accuracy"] <= 1 and 0 <= m["macro_f1"] <= 1
    run_dir = pilot / "runs" / out["run_id"]
    rows = [json.loads(x) for x in (run_dir / "predictions.jsonl").read_text().splitlines()]
    data = run_json("data", str(pilot))
    assert len(rows) == data["splits"]["val"] == m["n"]
    assert set(rows[0]) >= {"id", "prompt", "raw_output", "parsed", "gold", "correct", "scores"}
    for r in rows:  # best-first label search: the scores it computed, the prediction's among them
        assert r["parsed"] in r["scores"] and set(r["scores"]) <= set(labels)
        assert r["all_labels_scored"] == (set(r["scores"]) == set(labels))
        assert r["scores"][r["parsed"]] == max(r["scores"].values())
    proto = json.loads((run_dir / "protocol.json").read_text())
    assert (
        proto["eval_protocol"] == out["eval_protocol"] and proto["data_version"] == data["version"]
    )
    assert json.loads((run_dir / "metrics.json").read_text())["accuracy"] == m["accuracy"]

    # The generation check: the same prompts generated greedily parse to exactly what an
    # evaluation with eval.mode generate predicts, row by row and in every metric; an answer
    # is cut where it can no longer be a label (the zero-shot base chats), so its text is
    # the start of the whole one.
    g = out["generation"]
    assert g["n"] == m["n"] and set(g["metrics"]) == {"macro_f1", "accuracy"}
    assert all(v["scored"] == m[k] for k, v in g["metrics"].items())
    assert g["n_same"] == sum(r["generated_label"] == r["parsed"] for r in rows)
    assert g["n_labels"] == sum(r["generated_label"] in labels for r in rows)
    # constrained to the labels' text, every answer is a label, counted the same way
    c = g["constrained"]
    assert all(r["constrained_label"] in labels for r in rows) and c["n_labels"] == c["n"]
    assert c["n_same"] == sum(r["constrained_label"] == r["parsed"] for r in rows)
    assert c["seconds"] >= 0 and c["metrics"]["macro_f1"]["scored"] == m["macro_f1"]
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["eval"]["mode"] = "generate"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    gen = run_json("baseline", str(pilot), "--no-progress")
    assert "generation" not in gen  # generating already: nothing to check
    for k, v in g["metrics"].items():
        assert gen["metrics"][k] == v["generated"]
    gen_rows = (pilot / "runs" / gen["run_id"] / "predictions.jsonl").read_text().splitlines()
    by_id = {r["id"]: r for r in map(json.loads, gen_rows)}
    for r in rows:
        whole = by_id[r["id"]]["raw_output"]
        assert whole == r["generated"] if r["generated_label"] else whole.startswith(r["generated"])
        assert by_id[r["id"]]["parsed"] == r["generated_label"]
    assert sum(len(r["generated"]) < len(by_id[r["id"]]["raw_output"]) for r in rows) > 0


def test_baseline_extraction_tiny(tmp_path, tiny_model_dir):
    pilot = _tiny_pilot(tmp_path, "invoice-fields", tiny_model_dir, eval__max_new_tokens=8)
    out = run_json("baseline", str(pilot), "--limit", "6", "--no-progress")
    m = out["metrics"]
    for key in (
        "json_valid_rate",
        "required_fields_rate",
        "per_field",
        "field_f1",
        "schema_valid_rate",
    ):
        assert key in m
    top = {"vendor", "invoice_number", "date", "total", "currency", "due_date", "po_number"}
    items = {"line_items[].description", "line_items[].quantity", "line_items[].amount"}
    assert top | {"line_items"} <= set(m["per_field"]) <= top | {"line_items"} | items
    assert "leaf_f1" in m
    rows = (pilot / "runs" / out["run_id"] / "predictions.jsonl").read_text().splitlines()
    assert len(rows) == 6 and out["protocol"]["limit"] == 6
    assert out["device"] == "cpu"  # no accelerator here


def test_evaluation_moves_a_cpu_model_to_the_accelerator(monkeypatch):
    """Baseline, eval and verify load the base on the CPU; on a GPU machine evaluation
    must not run there. (No GPU here: torch.cuda is faked and the moves recorded.)"""
    import torch

    from lorapilot.evaluate.runner import cast_for_eval

    class Model:
        def __init__(self):
            self.moves, self.p = [], torch.zeros(1)

        def parameters(self):
            return iter([self.p])

        def to(self, arg):
            self.moves.append(arg)
            return self

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    m = cast_for_eval(Model(), "bf16")
    # cast first, on the CPU: the GPU never holds a full-precision copy of the base
    assert m.moves == [torch.bfloat16, torch.device("cuda", 0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cast_for_eval(Model(), "fp32").moves == []


def test_protocol_is_stable_and_sensitive(tmp_path, tiny_model_dir):
    pilot = _tiny_pilot(tmp_path, "ticket-triage", tiny_model_dir)
    a = run_json("baseline", str(pilot), "--limit", "4", "--no-progress")
    b = run_json("baseline", str(pilot), "--limit", "4", "--no-progress")
    c = run_json(
        "baseline", str(pilot), "--limit", "4", "--no-progress", "--set", "eval.batch_size=3"
    )
    assert a["eval_protocol"] == b["eval_protocol"] != c["eval_protocol"]
    assert a["metrics"] == b["metrics"]
    # eval.precision is `auto` in the example: the protocol holds what this CPU ran
    proto = json.loads((pilot / "runs" / a["run_id"] / "protocol.json").read_text())
    assert proto["precision"] == ("bf16" if cpu_has_fast_bf16() else "fp32")
    assert a["peak_memory_bytes"] > 0  # evaluation's own peak (RSS on a CPU), for the limits


def test_eval_shared_prefix_off_is_in_the_protocol_and_predicts_the_same(tmp_path, tiny_model_dir):
    """Without the prefix cache every batch computes the prefix: the same predictions in
    fp32, a different protocol (in bf16 the summation order may flip a close call)."""
    pilot = _tiny_pilot(tmp_path, "ticket-triage", tiny_model_dir)
    args = ("baseline", str(pilot), "--limit", "6", "--no-progress", "--set", "eval.precision=fp32",
            "--set", "eval.batch_size=4")  # fmt: skip
    cached = run_json(*args)
    plain = run_json(*args, "--set", "eval.shared_prefix=off")
    assert cached["eval_protocol"] != plain["eval_protocol"]
    protos = [
        json.loads((pilot / "runs" / r["run_id"] / "protocol.json").read_text())
        for r in (cached, plain)
    ]
    assert [p["shared_prefix_cache"] for p in protos] == [True, False]
    rows = [
        [json.loads(line) for line in (pilot / "runs" / r["run_id"] / "predictions.jsonl").open()]
        for r in (cached, plain)
    ]
    assert [r["parsed"] for r in rows[0]] == [r["parsed"] for r in rows[1]]
    assert cached["metrics"] == plain["metrics"]


def test_test_split_is_reserved_and_logged(tmp_path, tiny_model_dir):
    pilot = _tiny_pilot(tmp_path, "ticket-triage", tiny_model_dir)
    refused = run_json("eval", str(pilot), "--base", "--split", "test", expect=2)
    assert "--final" in refused["error"]
    first = run_json(
        "eval", str(pilot), "--base", "--split", "test", "--final", "--limit", "3", "--no-progress"
    )
    assert first["test_accesses_before"] == []
    second = run_cli(
        "eval",
        str(pilot),
        "--base",
        "--split",
        "test",
        "--final",
        "--limit",
        "3",
        "--no-progress",
        "--json",
    )
    assert (
        second.returncode == 0
        and "already used 1 time" in second.stderr
        and first["run_id"] in second.stderr
    )
    ledger = [
        json.loads(x) for x in (pilot / "runs" / "test_ledger.jsonl").read_text().splitlines()
    ]
    assert [e["run"] for e in ledger] == [first["run_id"], json.loads(second.stdout)["run_id"]]


def test_eval_without_train_run_is_a_clear_error(tmp_path, tiny_model_dir):
    pilot = _tiny_pilot(tmp_path, "ticket-triage", tiny_model_dir)
    out = run_json("eval", str(pilot), expect=2)
    assert "no completed train run" in out["error"]


def _slot_rows(n: int) -> str:
    cities, days, songs = (
        ["Oslo", "Rome", "Lima", "Kyiv"],
        ["monday", "friday"],
        ["Hey Jude", "Yesterday"],
    )
    rows = []
    for i in range(n):
        city, day, song = cities[i % 4], days[i % 2], songs[i % 2]
        if i % 3 == 0:
            text, target = (
                f"book a table in {city} on {day} #{i}",
                {"intent": "book", "slots": {"city": city, "day": day}},
            )
        elif i % 3 == 1:
            text, target = (
                f"weather in {city} please #{i}",
                {"intent": "weather", "slots": {"city": city}},
            )
        else:
            text, target = f"play {song} now #{i}", {"intent": "play", "slots": {"song": song}}
        rows.append(json.dumps({"id": f"s{i}", "text": text, "target": target}))
    return "\n".join(rows) + "\n"


def test_slot_filling_baseline_and_eval_have_leaf_metrics_per_slot_and_per_intent(
    tmp_path, tiny_model_dir
):
    """The issue's acceptance: fields intent + slots (a map), data.category: target.intent."""
    from conftest import write_pilot

    spec = {
        "name": "slots",
        "hypothesis": "LoRA fills slots better than the base model.",
        "task": {
            "kind": "extraction",
            "fields": [{"name": "intent"}, {"name": "slots", "type": "map", "values": "string"}],
            "grounded": True,
            "system": "Answer with JSON: {fields}.",
        },
        "model": {"base": str(tiny_model_dir)},
        "data": {
            "source": "generated in this test",
            "permission": "test data",
            "file": "data.jsonl",
            "category": "target.intent",
            "split": {"val": 0.3, "test": 0.2},
        },
        "eval": {"max_new_tokens": 6, "precision": "fp32"},
        "success": {"metric": "leaf_f1", "min_gain": 0.05},
        "guards": [{"metric": "ungrounded_value_rate", "max": 0.5}],
    }
    pilot = write_pilot(tmp_path / "slots", spec, {"data.jsonl": _slot_rows(60)})
    data = run_json("data", str(pilot))
    assert data["grounding"]["n_ungrounded"] == 0 and data["grounding"]["n_values"] > 60
    assert set(data["per_category"]) == {"book", "weather", "play"}
    for verb in (("baseline",), ("eval", "--base")):
        out = run_json(*verb, str(pilot), "--no-progress")
        m = out["metrics"]
        assert {"leaf_f1", "leaf_precision", "leaf_recall", "ungrounded_value_rate"} <= set(m)
        assert {"slots.city", "slots.day", "slots.song", "intent", "slots"} <= set(m["per_field"])
        assert set(m["per_category"]) == {"book", "weather", "play"}
        assert all("leaf_f1" in c for c in m["per_category"].values())


def test_the_generation_check_adds_figures_and_changes_no_scored_prediction(
    tmp_path, tiny_model_dir
):
    on = _tiny_pilot(tmp_path / "on", "ticket-triage", tiny_model_dir)
    off = _tiny_pilot(tmp_path / "off", "ticket-triage", tiny_model_dir,
                      eval__generation_check=False)  # fmt: skip
    a = run_json("baseline", str(on), "--limit", "8", "--no-progress")
    b = run_json("baseline", str(off), "--limit", "8", "--no-progress")
    assert a["metrics"] == b["metrics"] and a["eval_protocol"] == b["eval_protocol"]
    assert a["generation"]["n"] == 8 and "generation" not in b

    def rows(out, p):
        return [json.loads(x) for x in (p / "runs" / out["run_id"] / "predictions.jsonl").open()]

    ra, rb = rows(a, on), rows(b, off)
    assert [r["parsed"] for r in ra] == [r["parsed"] for r in rb]
    assert all("generated" in r and "generated_label" in r for r in ra)
    assert not any("generated" in r for r in rb)
