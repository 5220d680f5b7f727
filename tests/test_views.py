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


def test_export_and_run_show_how_generation_serves_a_scored_classifier(monkeypatch):
    warning = "base+adapter: served as the Modelfile serves it, 104 of 154 ..."
    conf = {"name": "base+adapter", "n_differing": 22, "examples_per_s": 2.1,
            "metrics": {"macro_f1": {"lorapilot": 0.321, "llama_cpp": 0.341}},
            "generation": {"agreement": 0.675, "label_rate": 0.896}}  # fmt: skip
    exported = {"format": "gguf", "out": "served", "files": ["base.gguf"], "ok": True,
                "serving_agreement": 0.99, "serving_agreement_min": 0.98, "n_examples": 154,
                "configs": [conf], "warnings": [warning]}  # fmt: skip
    text = _shown(monkeypatch, views.export, exported)
    assert "generated as the Modelfile serves it: 67.5% the scored label, 89.6% a label" in text
    assert f"warning: {warning}" in text and "constrained by" not in text
    assert "base.gguf:" not in text
    conf["generation"]["constrained"] = {
        "agreement": 0.812,
        "label_rate": 1.0,
        "lorapilot_constrained": {"n": 154, "n_same": 143},
    }
    note = "original.gguf, not the weights the adapter was trained on"
    untrained = {**exported, "base_gguf": {"trained_on": False, "note": note}}
    text = " ".join(_shown(monkeypatch, views.export, untrained).split())
    assert (
        "base+adapter, constrained by labels.gbnf (llama.cpp's grammar sampler): 81.2% the "
        "scored label, 100.0% a label; lorapilot's constrained check answered the same for "
        "143 of 154"
    ) in text
    assert f"base.gguf: {note}" in text  # why its agreement is reported, not gated
    del conf["generation"]["constrained"]
    ran = {"decision": "GO", "selected": "base", "train_run": "train-1", "wall_s": 60.0,
           "reasons": [], "html": "report/index.html", "exports": [exported]}  # fmt: skip
    assert f"warning (gguf export): {warning}" in _shown(monkeypatch, views.run, ran)
    # the report's limitations are shown too, an export's warning once
    lims = [f"the gguf export in deliverable/gguf: {warning}", "the baseline predicted 'x'"]
    text = _shown(monkeypatch, views.run, {**ran, "limitations": lims})
    assert text.count(warning) == 1 and "limitation: the baseline predicted 'x'" in text
    text = _shown(monkeypatch, views.report, {**ran, "limitations": lims, "markdown": "r.md",
                                              "deliverable": "d"})  # fmt: skip
    assert "limitation: the gguf export in deliverable/gguf" in text


def test_evaluation_train_and_compare_show_the_generation_check(monkeypatch):
    g = {"agreement": 0.753, "label_rate": 0.922, "n": 154, "n_same": 116, "n_labels": 142,
         "metrics": {"macro_f1": {"scored": 0.251, "generated": 0.263}}}  # fmt: skip
    metrics = {"n": 154, "accuracy": 0.279, "macro_f1": 0.251}
    ev = {"split": "val", "n": 154, "run_id": "eval-1", "eval_protocol": "ep-1",
          "examples_per_s": 2.3, "metrics": metrics, "predictions": "p.jsonl",
          "generation": g}  # fmt: skip
    line = ("generated (as a chat server answers): 116 of 154 the scored label (75.3%), 142 a "
            "label; macro_f1 0.263")  # fmt: skip
    assert line in _shown(monkeypatch, views.evaluation, ev)
    tr = {"status": "completed", "run_id": "train-1", "variant": "base", "wall_s": 10.0,
          "steps": 77, "update_audit": {"ok": True}, "trainable_params": 1,
          "total_params": 2, "target_modules": ["q_proj"], "initial_val_loss": 1.0,
          "final_val_loss": 0.5, "metrics": metrics, "adapter_path": "a",
          "generation": g}  # fmt: skip
    assert line in _shown(monkeypatch, views.train, tr)
    assert "generated (as" not in _shown(monkeypatch, views.train, {**tr, "generation": None})
    rows = [{"id": "train-1", "kind": "train", "status": "completed", "metrics": metrics,
             "generation": g}, {"id": "eval-2", "kind": "eval", "status": "completed"}]  # fmt: skip
    text = _shown(monkeypatch, views.compare, {"baseline": "b-1", "runs": rows, "decision": None})
    assert "generated = scored" in text and "116/154 (75%)" in text
    # constrained to the labels: a line of its own, and after the free figure in compare
    c = {"agreement": 0.974, "n": 154, "n_same": 150, "n_labels": 154, "metrics": {}}
    held = {**ev, "generation": {**g, "constrained": c}}
    line = ("constrained to the labels (as a server with a choice or grammar answers): 150 of "
            "154 the scored label (97.4%)")  # fmt: skip
    assert line in _shown(monkeypatch, views.evaluation, held)
    assert "constrained to" not in _shown(monkeypatch, views.evaluation, ev)
    rows[0]["generation"] = held["generation"]
    text = _shown(monkeypatch, views.compare, {"baseline": "b-1", "runs": rows, "decision": None})
    assert "116/154 (75%) | 150/154" in text


def test_a_merged_export_names_its_dtype_and_agreement(monkeypatch):
    merged = {"ok": True, "out": "m16", "merged": True, "merged_dtype": "float16",
              "max_logit_diff": 0.0175, "merge_agreement": 1.0,
              "merge_agreement_examples": 108}  # fmt: skip
    text = _shown(monkeypatch, views.export, merged)
    assert "exported m16 (float16, max logit diff 1.8e-02, agreement 100.0% of 108)" in text
    assert "merged, on the validation split" not in text
    generated = {**merged, "merge_agreement": 0.875, "merge_agreement_examples": 56,
                 "merge_token_agreement": 0.99655, "merge_tokens_compared": 2032,
                 "merge_metrics": {"leaf_f1": {"adapter": 0.325, "merged": 0.31},
                                   "leaf_predicted": {"adapter": 172, "merged": 173},
                                   "json_valid_rate": {"adapter": 1.0, "merged": 1.0}}}  # fmt: skip
    text = _shown(monkeypatch, views.export, generated)
    assert "agreement 87.5% of 56 (99.66% of 2032 tokens))" in text
    assert "merged, on the validation split: leaf_f1 0.310 (adapter 0.325)" in text
    assert "json_valid_rate" not in text and "leaf_predicted" not in text


def test_predict_shows_the_busiest_labels_and_what_it_warns(monkeypatch):
    """77 labels: the ten most predicted, how many more, how many never; the validity rates
    of an extraction; the warnings."""
    counts = {f"intent_{i:02d}": (i % 3) * i for i in range(77)}
    r = {"n": 400, "input": {"file": "t.csv"}, "train_run": "train-1", "run_id": "predict-1",
         "eval_protocol": "ep-1", "examples_per_s": 4.0, "metrics": None, "n_scored": 0,
         "summary": {"predicted": counts, "not_a_label": 0}, "warnings": ["2 inputs are x"],
         "out": None, "predictions": "p.jsonl"}  # fmt: skip
    text = " ".join(_shown(monkeypatch, views.prediction, r).split())
    assert "predicted: intent_74 148 intent_71 142" in text
    busy = sum(1 for v in counts.values() if v)
    assert f"(+{busy - 10} more labels); {77 - busy} labels never predicted" in text
    assert "warning: 2 inputs are x" in text and "predictions: p.jsonl" in text
    r["summary"] = {"n": 2, "json_valid_rate": 0.5, "format_valid_rate": 0.25}
    r["train_run"] = None
    text = " ".join(_shown(monkeypatch, views.prediction, r).split())
    assert "the base model" in text and "json_valid_rate=0.500 format_valid_rate=0.250" in text
