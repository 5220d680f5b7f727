"""The serving check's agreement: per example for label scoring, per token (teacher-forced)
for a generated answer, and what the terminal, the README and the failure message call it."""

from __future__ import annotations

from conftest import EXAMPLES

from lorapilot.data.rows import Record
from lorapilot.export.gguf_export import _compare, _why
from lorapilot.export.ollama import agreement_of
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
