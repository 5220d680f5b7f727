"""`baseline --linear-probe`: a logistic regression on the frozen base's prompt features, the
embedding-classifier alternative; its features, its run (never the zero-shot baseline), and
compare and the report setting the adapter against it. Tiny random models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from conftest import init_tiny_pilot, run_cli, run_json

from lorapilot.spec import load_pilot


@pytest.fixture(scope="module")
def pilot(tmp_path_factory, tiny_model_dir):
    return init_tiny_pilot(tmp_path_factory.mktemp("probe"), tiny_model_dir, max_steps=3)


def test_features_are_the_final_hidden_state_at_each_prompts_last_token(pilot):
    """Batched and right-padded, each prompt's feature is what the model alone computes at
    its last token (the final norm applied: the LM head's input)."""
    from lorapilot.base.models import load_base, pad_id_of
    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.evaluate.text_probe import prompt_features

    p = load_pilot(pilot)
    _, model, tok = load_base(p)
    model.float().eval()
    prepared = prepare_data(p, tok)
    recs = prepared.splits["train"][:5]
    fmt = formatter_for(p, tok)
    feats, ids, cuts = prompt_features(
        model, fmt, pad_id_of(tok), recs, prepared.answer_budget, "fp32", batch_size=4
    )
    assert feats.shape == (5, model.config.hidden_size) and cuts == [0] * 5
    assert len({len(i) for i in ids}) > 1  # prompts of different lengths share batches
    for row, prompt in enumerate(ids):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
        alone = out.hidden_states[-1][0, -1].double().numpy()
        assert np.allclose(feats[row], alone, atol=1e-5)


def test_the_probe_is_an_alternative_set_beside_the_adapter(pilot):
    zero = run_json("baseline", str(pilot), "--no-progress")
    probe = run_json("baseline", str(pilot), "--linear-probe", "--no-progress")
    lp = probe["linear_probe"]
    record = json.loads((pilot / "runs" / probe["run_id"] / "run.json").read_text())
    assert lp["fitted_on"]["split"] == "train" and lp["fitted_on"]["n"] > 0
    assert lp["hidden_size"] == 32 and lp["iterations"] > 0 and record["status"] == "completed"
    assert record["result"]["linear_probe"] == lp
    assert probe["protocol"]["linear_probe"]["classifier"] == "logistic regression"
    assert "linear_probe" not in zero["protocol"] and probe["n"] == zero["n"]
    rows = [json.loads(x) for x in open(probe["predictions"])]
    labels = load_pilot(pilot).spec.task.labels
    for r in rows:  # every label scored (the probe's logits), the argmax the prediction
        assert r["all_labels_scored"] and set(r["scores"]) == set(labels)
        assert r["parsed"] == max(r["scores"], key=r["scores"].get) and "tokens_cut" in r
    acc = sum(r["correct"] for r in rows) / len(rows)
    assert probe["metrics"]["accuracy"] == pytest.approx(acc)
    # the probe also reviews the training labels: every suspect in label_issues.jsonl
    li = probe["label_issues"]
    suspects = [json.loads(x) for x in open(li["file"])]
    assert li["n"] == lp["fitted_on"]["n"] and li["n_suspects"] == len(suspects)
    assert li == record["result"]["label_issues"] and "label_issues" not in zero
    assert li["suspects"] == suspects[:20] and li["folds"] == 5
    for s in suspects:  # each names its training example and a likelier other label
        assert s["label"] != s["suggested"] and s["p_suggested"] > s["p_label"]
        assert s["id"] and s["source"].startswith("data/")

    # the alternative on new inputs: the same probe (refitted: deterministic), the same answers
    new = pilot / "new.jsonl"
    new.write_text("".join(json.dumps({"id": f"n{i}", "text": r["text"], "label": r["gold"]})
                           + "\n" for i, r in enumerate(rows)))  # fmt: skip
    out = run_json("predict", str(pilot), "--input", str(new), "--base", "--linear-probe",
                   "--no-progress")  # fmt: skip
    assert out["eval_protocol"] == probe["eval_protocol"]
    # the training prompts' features kept by the baseline: read back, not computed again
    assert lp["train_features_reused"] is False and (pilot / lp["train_features"]).is_file()
    assert out["linear_probe"] == {**lp, "train_features_reused": True}
    got = [json.loads(x) for x in open(out["predictions"])]
    assert [g["parsed"] for g in got] == [r["parsed"] for r in rows]
    assert out["metrics"]["macro_f1"] == pytest.approx(probe["metrics"]["macro_f1"])
    res = run_cli("predict", str(pilot), "--input", str(new), "--linear-probe")
    assert res.returncode == 2 and "alternative to adapting" in res.stderr

    train = run_json("train", str(pilot), "--no-progress")
    cmp = run_json("compare", str(pilot))
    assert cmp["baseline"] == zero["run_id"]  # the later probe run is not the baseline
    row = next(r for r in cmp["runs"] if r["id"] == probe["run_id"])
    assert row["variant"] == "linear probe (base features)" and "deltas" not in row
    p = cmp["linear_probe"]
    assert p["run_id"] == probe["run_id"] and p["adapted_run"] == train["run_id"]
    assert p["why_not"] is None and p["metric"] == "macro_f1"
    assert p["fitted_on"] == lp["fitted_on"]["n"]
    assert p["probe"] == pytest.approx(probe["metrics"]["macro_f1"])
    assert p["gain"] == pytest.approx(p["adapted"] - p["probe"], abs=1e-6)
    assert p["ci_low"] <= p["gain"] <= p["ci_high"]
    assert p["adapter_beats_probe"] == (p["gain"] >= 0.10 and p["ci_low"] > 0)
    rep = run_json("report", str(pilot))
    assert rep["linear_probe"] == p
    md = open(rep["markdown"]).read()
    if li["n_suspects"]:
        assert "### Suspect training labels" in md and f"Baseline run {probe['run_id']}" in md
    assert "### Against an embedding classifier: a linear probe on the base's features" in md
    assert f"| linear-probe run | {probe['run_id']} |" in md
    if not p["adapter_beats_probe"]:
        assert any("an embedding classifier may serve" in x for x in rep["limitations"])
    text = run_cli("compare", str(pilot)).stdout
    assert f"against a linear probe on the base's features ({probe['run_id']})" in text


def test_the_probe_is_refused_where_it_has_no_meaning(pilot, tmp_path, tiny_model_dir):
    both = run_cli("baseline", str(pilot), "--linear-probe", "--shots", "2")
    assert both.returncode == 2 and "--linear-probe: it reads the zero-shot prompt" in both.stderr
    run_json("init", "ex", "--dir", str(tmp_path), "--task", "extraction")
    ex = tmp_path / "ex"
    spec = yaml.safe_load((ex / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    (ex / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_cli("baseline", str(ex), "--linear-probe")
    assert out.returncode == 2 and "classification and multi-label only" in out.stderr
    assert not list(ex.glob("runs/baseline-*"))  # refused before a run is opened
    bad = run_cli("check", str(ex), "--set", "eval.linear_probe=true")
    assert bad.returncode == 2 and "eval.linear_probe" in bad.stderr
    # pre-registered in the spec: not part of the spec hash (results stay reusable)
    a = load_pilot(pilot).spec
    assert a.model_copy(update={"eval": a.eval.model_copy(update={"linear_probe": True})}
                        ).spec_hash() == a.spec_hash()  # fmt: skip
