"""The serving check's agreement: per example for label scoring, per token (teacher-forced)
for a generated answer, and what the terminal, the README and the failure message call it."""

from __future__ import annotations

from conftest import EXAMPLES

from lorapilot.data.rows import Record
from lorapilot.export.gguf_export import _compare, _why, generation_warnings
from lorapilot.export.ollama import agreement_of, readme
from lorapilot.spec import load_pilot


def _cases_and_conf():
    spec = load_pilot(EXAMPLES / "gsm8k-format").spec
    golds = ["a\n#### 4", "b\n#### 7", "c\n#### 9"]
    records = [Record(id=f"g{i}", text="q", label=None, target=g, source=f"f:{i}", split="val",
                      category="all") for i, g in enumerate(golds)]  # fmt: skip
    ours = ["x\n#### 4", "y\n#### 7", "z\n#### 1"]
    served = ["x\n#### 4", "w\n#### 8", "z\n#### 1"]  # the second answer drifted
    cases = {
        "records": records,
        "prompt_texts": ["q"] * 3,
        "lorapilot_predictions": {
            f"g{i}": {"parsed": o.split("#### ")[1]} for i, o in enumerate(ours)
        },  # fmt: skip
        "lorapilot_metrics": {"format_valid_rate": 1.0, "answer_match": 2 / 3},
    }
    conf = {"name": "base+adapter", "outputs": served, "forced": [[5, 5], [39, 40], [7, 7]]}
    return spec, cases, conf


def test_a_generated_answer_is_compared_token_by_token():
    spec, cases, conf = _cases_and_conf()
    out = _compare(spec, cases, conf)
    assert out["agreement_unit"] == "tokens"
    assert out["serving_agreement"] == out["token_agreement"] == 51 / 52
    assert (out["tokens_same"], out["tokens_compared"]) == (51, 52)
    assert out["example_agreement"] == 2 / 3 and out["n_differing"] == 1
    assert out["metrics"]["answer_match"] == {"lorapilot": 2 / 3, "llama_cpp": 1 / 3}
    del conf["forced"]  # label scoring, or an old check: examples
    plain = _compare(spec, cases, conf)
    assert plain["agreement_unit"] == "examples" and plain["serving_agreement"] == 2 / 3


def test_the_agreement_is_named_by_what_it_counts():
    tokens = {"n_examples": 90, "agreement_unit": "tokens"}
    assert agreement_of(tokens) == (
        "of the output tokens of 90 validation answers, each from the same preceding tokens"
    )
    assert agreement_of({"n_examples": 36}) == "on 36 validation examples"
    check = {"reference": {"kind": "fp32"}, "serving_agreement": 0.95,
             "serving_agreement_min": 0.98, "agreement_unit": "tokens", "configs": []}  # fmt: skip
    assert "on 95.0% of its output tokens on the validation split" in _why(check)


def _scored_case():
    spec = load_pilot(EXAMPLES / "ticket-triage").spec
    golds = ["billing", "technical", "refund", "shipping"]
    records = [Record(id=f"t{i}", text="q", label=g, target=None, source=f"f:{i}", split="val",
                      category=g) for i, g in enumerate(golds)]  # fmt: skip
    labels = list(spec.task.labels)
    scores = [[0.0 if lab == g else -5.0 for lab in labels] for g in golds]  # scored right
    cases = {
        "records": records,
        "prompt_texts": ["q"] * 4,
        "lorapilot_predictions": {f"t{i}": {"parsed": g} for i, g in enumerate(golds)},
        "lorapilot_metrics": {"accuracy": 1.0, "macro_f1": 1.0},
    }
    # generated freely: one right, one in another case, one another label, one no label
    generated = ["billing", " Technical\n", "account", "shipping address"]
    conf = {"name": "base+adapter", "scores": scores, "generated": generated}
    return spec, cases, conf


def test_a_scored_label_is_also_generated_as_the_modelfile_serves_it():
    spec, cases, conf = _scored_case()
    out = _compare(spec, cases, conf)
    assert out["serving_agreement"] == 1.0 and out["agreement_unit"] == "examples"
    g = out["generation"]
    assert (g["n_same"], g["n_labels"]) == (2, 3)  # "Technical" is the label, by case
    assert g["agreement"] == 0.5 and g["label_rate"] == 0.75
    assert g["not_labels"] == [["shipping address", 1]]
    assert [d["id"] for d in g["differing"]] == ["t2", "t3"]
    assert g["metrics"]["accuracy"] == {"lorapilot": 1.0, "llama_cpp": 0.5}
    (warning,) = generation_warnings([out], 0.98)
    assert "2 of 4 validation answers are the label lorapilot scored (50.0% < 98%)" in warning
    assert "1 are no label at all ('shipping address' x1)" in warning
    assert "eval.mode: generate" in warning and "classify.py" not in warning
    (served,) = generation_warnings([out], 0.98, classifier=True)
    assert "serve it with classify.py (the folder's label scoring)" in served
    assert generation_warnings([out], 0.5) == []  # at the minimum: no warning
    del conf["generated"]  # an old check, or a generation task: nothing to add
    assert _compare(spec, cases, conf)["generation"] is None


def test_the_labels_constrained_by_the_grammar_are_counted_and_named():
    """labels.gbnf in llama.cpp: every answer a label, counted against the scored one and
    against lorapilot's own constrained check where the train run recorded it."""
    spec, cases, conf = _scored_case()
    for i, held in enumerate(["billing", "technical", "account", "shipping"]):
        cases["lorapilot_predictions"][f"t{i}"]["constrained_label"] = held
    del cases["lorapilot_predictions"]["t3"]["constrained_label"]  # not recorded: not compared
    conf.update(constrained=["billing", "technical", "account", "refund"],
                constrained_seconds=1.5, generation_seconds=2.5)  # fmt: skip
    g = _compare(spec, cases, conf)["generation"]
    assert g["seconds"] == 2.5
    h = g["constrained"]
    assert "labels.gbnf in llama.cpp's grammar sampler" in h["what"] and h["seconds"] == 1.5
    assert (h["n_same"], h["n_labels"], h["n"]) == (2, 4, 4)
    assert [d["id"] for d in h["differing"]] == ["t2", "t3"]
    assert h["lorapilot_constrained"] == {"n": 3, "n_same": 3}
    (warning,) = generation_warnings([_compare(spec, cases, conf)], 0.98)
    said = "Constrained by labels.gbnf in llama.cpp's grammar sampler, 2 of 4 are (50.0%)"
    assert said in warning
    assert "--grammar-file" not in warning  # constraining agrees no better: not offered
    conf["constrained"] = ["billing", "technical", "refund", "shipping"]
    (warning,) = generation_warnings([_compare(spec, cases, conf)], 0.98)
    assert "serve it with --grammar-file labels.gbnf, " in warning
    del conf["constrained"]  # an export before labels.gbnf: free generation alone
    assert "constrained" not in _compare(spec, cases, conf)["generation"]


def test_the_readme_and_the_failure_say_how_generation_serves_the_labels():
    spec, cases, conf = _scored_case()
    result = _compare(spec, cases, conf)
    check = {"ok": True, "serving_agreement": 1.0, "serving_agreement_min": 0.98,
             "n_examples": 4, "generation_agreement": 0.5, "generation_label_rate": 0.75,
             "warnings": generation_warnings([result], 0.98), "configs": [result],
             "reference": {"kind": "recorded", "precision": "fp32"}}  # fmt: skip
    text = readme(pilot="tt", train_run="r1", base_file="base.gguf", base_note="q",
                  adapter_file="adapter.gguf", merged_file=None, system="s",
                  user_template="{text}", check=check)  # fmt: skip
    assert "50.0% of the answers are the label lorapilot scored and 75.0% are one of" in text
    assert "\n\n**Warning**: base+adapter: served as the Modelfile serves it" in text
    text = readme(pilot="tt", train_run="r1", base_file="base.gguf", base_note="q",
                  adapter_file="adapter.gguf", merged_file=None, system="s",
                  user_template="{text}", check=check, classifier="classify.py")  # fmt: skip
    assert "## Classify as the pilot did" in text and "python classify.py --jsonl" in text
    assert "predicted for 100.0% of the examples." in text  # every answer the same
    tied = {**result, "example_agreement": 0.75, "n_differing": 1, "ties": {"near_ties": 1}}
    text = readme(pilot="tt", train_run="r1", base_file="base.gguf", base_note="q",
                  adapter_file="adapter.gguf", merged_file=None, system="s",
                  user_template="{text}", check=check | {"configs": [tied]},
                  classifier="classify.py")  # fmt: skip
    assert "predicted for 75.0% of the examples, the others near-ties within" in text
    text = readme(pilot="tt", train_run="r1", base_file="base.gguf", base_note="q",
                  adapter_file="adapter.gguf", merged_file=None, system="s",
                  user_template="{text}", grammar="labels.gbnf",
                  check=check | {"constrained_agreement": 0.75, "constrained_label_rate": 1.0},
                  )  # fmt: skip
    assert "Constrained to the labels (`labels.gbnf`, below), 75.0% are the scored" in text
    assert "## Constrained to the labels" in text and "75.0% of the answers are the label" in text
    assert "llama-server -m base.gguf --lora adapter.gguf --grammar-file labels.gbnf" in text
    assert "- `labels.gbnf`: the labels as a llama.cpp grammar" in text
    assert "Ollama takes no grammar file" in text
    failed = _why(check | {"ok": False, "serving_agreement": 0.9})
    assert "generated freely as the Modelfile serves it, 50.0% of the answers" in failed
    assert "constrained by" not in failed
    failed = _why(check | {"ok": False, "serving_agreement": 0.9, "constrained_agreement": 0.75})
    assert "of the answers are the scored label (the folder's README.md)" in failed
    assert failed.endswith("; constrained by labels.gbnf, 75.0%")


def test_classify_py_is_written_only_where_a_script_can_build_the_pilots_prompt(
    default_model_dir,
):
    from transformers import AutoTokenizer

    from lorapilot.export.gguf_export import classifier_config

    pilot = load_pilot(EXAMPLES / "ticket-triage")
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    records = [Record(id=f"t{i}", text=t, label="billing", target=None, source=f"f:{i}",
                      split="val", category="billing")
               for i, t in enumerate(["plain", "  padded with spaces \n"])]  # fmt: skip
    cases = {"mode": "score", "content_free": [], "records": records, "labels": [[1, 2]],
             "answer_budget": 4, "truncation_side": "left"}  # fmt: skip
    config, note = classifier_config(pilot, tok, cases)
    assert config is not None and note.startswith("classify.py")
    assert config["prompt_head"].endswith("Ticket:\n") and config["prompt_tail"].startswith(
        "\n\nCategory:<|im_end|>"
    )
    assert (config["label_ids"], config["answer_budget"]) == ([[1, 2]], 4)
    assert config["n_ctx"] == config["max_length"] == 256  # the spec's data.max_length
    # a template that rewrites the content (here: collapses double spaces)
    rewrite = "(message['content'] | replace('  ', ' '))"
    tok.chat_template = tok.chat_template.replace("message['content']", rewrite)
    config, note = classifier_config(pilot, tok, cases)
    assert config is None and "changes the input text (example 't1')" in note
    assert classifier_config(pilot, tok, cases | {"mode": "generate"})[0] is None
    assert classifier_config(pilot, tok, cases | {"content_free": [{"id": "c"}]})[0] is None


def test_a_difference_within_the_runtimes_score_noise_is_a_near_tie():
    """Label scoring: the same label's score differs between the runtimes by up to the noise
    measured on the examples they agree on; a different answer whose served margin is within
    it is a near-tie (agreeing, for the gate), one beyond it a real difference."""
    spec = load_pilot(EXAMPLES / "ticket-triage").spec
    labels = list(spec.task.labels)
    golds = ["billing", "technical", "refund", "shipping"]
    records = [Record(id=f"t{i}", text="q", label=g, target=None, source=f"f:{i}", split="val",
                      category=g) for i, g in enumerate(golds)]  # fmt: skip
    own = {"t0": ("billing", -0.1), "t1": ("technical", -0.2), "t2": ("refund", -0.4),
           "t3": ("shipping", -0.3)}  # fmt: skip
    cases = {
        "records": records,
        "prompt_texts": ["q"] * 4,
        "lorapilot_predictions": {
            k: {"parsed": lab, "scores": {lab: s}} for k, (lab, s) in own.items()
        },
        "lorapilot_metrics": {"accuracy": 1.0, "macro_f1": 1.0},
    }  # fmt: skip

    def served(picks: dict[int, tuple[str, float]]) -> list:
        rows = []
        for i in range(4):
            lab, s = picks[i]
            rows.append([s if x == lab else None for x in labels])
        return rows

    # t0, t1 agree (noise 0.2 and 0.1); t2 flips by 0.1 (within), t3 by 1.7 (beyond)
    picks = {0: ("billing", -0.3), 1: ("technical", -0.3), 2: ("technical", -0.5),
             3: ("account", -0.2)}  # fmt: skip
    conf = {"name": "base+adapter", "scores": served(picks),
            "reference_scores": [-0.3, -0.3, -0.6, -1.9]}  # fmt: skip
    out = _compare(spec, cases, conf)
    assert out["example_agreement"] == 0.5 and out["n_differing"] == 2
    ties = out["ties"]
    assert ties["score_noise_max"] == 0.2 and ties["near_ties"] == 1
    assert ties["served_margins"] == [0.1, 1.7]
    assert out["serving_agreement"] == 0.75  # t0, t1 and the near-tie t2
    check = {"n_examples": 4, "configs": [out], "serving_agreement": 0.75,
             "serving_agreement_min": 0.98, "reference": {"kind": "recorded"}}  # fmt: skip
    assert "near-ties within the two runtimes' score noise counted as agreeing" in agreement_of(
        check
    )
    assert "base+adapter: 1 of 2 differing examples beyond the runtimes' score noise" in _why(check)
    # noise past the limit: no runtime that far off is trusted to call anything a near-tie
    conf["reference_scores"][0] = -1.5
    loud = _compare(spec, cases, conf)
    assert loud["ties"]["near_ties"] == 0 and loud["serving_agreement"] == 0.5


def test_an_extractions_answers_held_to_fields_gbnf_are_scored_beside_the_free_ones():
    """fields.gbnf in llama.cpp: the constrained answers scored with the pilot's metrics,
    counted against lorapilot's and the free ones; named in the README, reported not gated."""
    import json

    pilot = load_pilot(EXAMPLES / "invoice-fields")
    spec = pilot.spec
    rows = [json.loads(x) for x in (pilot.dir / "data" / "invoices.jsonl").open()][:3]
    records = [Record(id=r["id"], text=r["text"], label=None, target=r["target"], source="f",
                      split="val", category="all") for r in rows]  # fmt: skip
    from lorapilot.data.format import answer_text

    good = [answer_text(spec.task, None, r["target"]) for r in rows]
    cases = {
        "records": records,
        "prompt_texts": ["q"] * 3,
        "grammar_file": "fields.gbnf",
        "mode": "generate",
        "lorapilot_predictions": {r["id"]: {"parsed": r["target"]} for r in rows},
        "lorapilot_metrics": {"json_valid_rate": 1.0, "leaf_f1": 1.0},
    }
    free = [good[0], good[1][:-9], good[2]]  # the second cut short: not JSON
    held = [good[0], good[1], good[2].replace(rows[2]["target"]["vendor"], "Someone")]
    conf = {"name": "base+adapter", "outputs": free, "forced": [[9, 9]] * 3,
            "constrained": held, "constrained_seconds": 4.0}  # fmt: skip
    out = _compare(spec, cases, conf)
    h = out["constrained"]
    assert h["file"] == "fields.gbnf" and "--grammar-file fields.gbnf" in h["what"]
    assert (h["n_same"], h["n_same_as_free"], h["n"]) == (2, 1, 3) and h["agreement"] == 2 / 3
    assert h["metrics"]["json_valid_rate"] == {
        "lorapilot": 1.0, "llama_cpp": 2 / 3, "llama_cpp_constrained": 1.0
    }  # fmt: skip
    assert [d["id"] for d in h["differing"]] == [rows[2]["id"]] and h["seconds"] == 4.0
    assert out["serving_agreement"] == 1.0  # the gate stays the free answers' tokens
    check = {"n_examples": 3, "agreement_unit": "tokens", "serving_agreement": 1.0,
             "serving_agreement_min": 0.98, "configs": [out], "reference": {}}  # fmt: skip
    text = readme(pilot="p", train_run="t", base_file="base.gguf", base_note="n",
                  adapter_file="adapter.gguf", merged_file=None, system=None,
                  user_template="{text}", check=check, grammar="fields.gbnf",
                  schema="schema.json")  # fmt: skip
    assert "## Constrained to the fields" in text and "2 of 3 answers are lorapilot's" in text
    assert "--grammar-file fields.gbnf" in text and "`schema.json`" in text
    assert "json_valid_rate 1.000 (free 0.667, lorapilot 1.000)" in text
    del conf["constrained"]  # an export before fields.gbnf
    assert "constrained" not in _compare(spec, cases, conf)


def test_a_generated_classification_is_held_to_labels_gbnf_too():
    """A classification evaluated by generation (eval.mode: generate) gets labels.gbnf as well,
    its answers under it scored beside the free ones, in lorapilot's words ("generated")."""
    from lorapilot.export.gguf_export import _grammar_of

    spec, cases, conf = _scored_case()
    assert _grammar_of(spec)[0] == "labels.gbnf" and _grammar_of(spec)[2] is None
    assert _grammar_of(load_pilot(EXAMPLES / "invoice-fields").spec)[0] == "fields.gbnf"
    cases.update(mode="generate", grammar_file="labels.gbnf")  # as export_gguf sets them
    del conf["scores"], conf["generated"]
    conf.update(outputs=["billing", "nothing", "refund", "shipping address"],
                constrained=["billing", "technical", "refund", "shipping"])  # fmt: skip
    held = _compare(spec, cases, conf)["constrained"]
    assert (held["n_same"], held["n_same_as_free"], held["file"]) == (4, 2, "labels.gbnf")
    assert held["metrics"]["accuracy"] == {
        "lorapilot": 1.0, "llama_cpp": 0.5, "llama_cpp_constrained": 1.0
    }  # fmt: skip
    check = {"n_examples": 4, "serving_agreement": 1.0, "serving_agreement_min": 0.98,
             "constrained_agreement": 1.0, "constrained_label_rate": None,
             "configs": [], "reference": {}}  # fmt: skip
    text = readme(pilot="p", train_run="t", base_file="base.gguf", base_note="n",
                  adapter_file="adapter.gguf", merged_file=None, system=None,
                  user_template="{text}", check=check, grammar="labels.gbnf")  # fmt: skip
    assert "100.0% of the answers are the label lorapilot generated." in text


def test_a_multi_label_export_states_its_grammar_as_lists_of_labels():
    """A multi-label pilot's labels.gbnf holds the ordered label lists; the README says so."""
    from lorapilot.export.gguf_export import _grammar_of
    from lorapilot.spec import PilotSpec

    spec = PilotSpec.model_validate({
        "name": "m", "hypothesis": "h", "data": {"file": "d.jsonl"},
        "task": {"kind": "multi_label_classification", "labels": ["a", "b"]},
    })  # fmt: skip
    file, grammar, schema = _grammar_of(spec)
    assert (file, schema) == ("labels.gbnf", None)
    assert grammar.splitlines()[:2] == ["root ::= l0 | l1", 'l0 ::= "a" (", " (l1))?']
    check = {"n_examples": 4, "serving_agreement": 1.0, "serving_agreement_min": 0.98,
             "constrained_agreement": 0.75, "constrained_label_rate": None,
             "configs": [], "reference": {}}  # fmt: skip
    text = readme(pilot="p", train_run="t", base_file="base.gguf", base_note="n",
                  adapter_file="adapter.gguf", merged_file=None, system=None,
                  user_template="{text}", check=check, grammar="labels.gbnf",
                  label_sets=True)  # fmt: skip
    assert "75.0% of the answers are the labels lorapilot generated." in text
    assert "one or more of the labels' exact texts" in text and "answers only a label" not in text
