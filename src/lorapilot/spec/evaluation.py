"""How the adapter is judged: the evaluation protocol, the success criterion and the guards
on what must not degrade."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    model_serializer,
    model_validator,
)

from lorapilot.spec.common import AutoOnOff, _Strict


class EvalNormalize(_Strict):
    """How predicted and gold values are normalised before they are compared."""

    case: bool = Field(True, description="Compare strings casefolded.")
    whitespace: bool = Field(True, description="Strip strings and collapse their whitespace.")
    list_order: bool = Field(True, description="Compare lists as sorted (any order).")


ALTERNATIVE_KEYS = ("few_shot", "few_shot_selection", "linear_probe")
"""eval keys that only add an alternative to adapting (its own baseline run, which records
them): not part of the spec hash, of `run`'s phase inputs or of a training step's shape."""


class EvalSpec(_Strict):
    """The evaluation protocol: how predictions are made and compared (hashed into every
    result as `eval_protocol`)."""

    mode: Literal["score", "generate"] = Field(
        "score", description="Classification: score every label (no parse failures) or generate."
    )
    batch_size: int = Field(16, gt=0, description="Prompts per evaluation batch.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Autocast precision of evaluation, resolved as train.precision; the "
        "resolved value is recorded in the eval protocol.",
    )
    max_new_tokens: int | None = Field(None, gt=0, description="Default: longest target + margin.")
    normalize: EvalNormalize = Field(
        default_factory=EvalNormalize, description="Normalisation of values before comparing."
    )
    min_support: int = Field(
        5,
        ge=1,
        description="Below this support (the examples or values a guard's metric is computed "
        "over: a category's examples, the gold or predicted values of an F1 or precision, the "
        "values a grounding rate checked) a guard is 'insufficient data', not judged.",
    )
    label_search: Literal["best_first", "all"] = Field(
        "best_first",
        description="Label scoring: best_first scores only the labels the argmax needs (a "
        "label's log-probability can only fall as its tokens are added: the same prediction, "
        "much faster with many labels; predictions.jsonl keeps the scores computed); all "
        "scores every label.",
    )
    label_scoring: Literal["sum", "calibrated"] = Field(
        "sum",
        description="Classification by scoring: sum ranks the labels by the log-probability "
        "of their tokens; calibrated (contextual calibration, Zhao et al. 2021) first scores "
        "every label after content-free inputs (N/A, an empty text, [MASK]) and divides each "
        "label's probability by its average there, so a label the model prefers whatever the "
        "input (the first in the list, the one capitalised) loses that head start. Applied "
        "alike to the baseline and every adapter (each with its own content-free scores), "
        "recorded in calibration.json; part of the eval protocol.",
    )
    shared_prefix: AutoOnOff = Field(
        "auto",
        description="on: the prompt prefix every prompt shares is computed once and its "
        "key/value cache reused by every batch; off: each batch computes it; auto: on on a "
        "CPU, off on a GPU (where the extra pass cost more than it saved in all but one "
        "measured case: bench/README.md). Part of the eval protocol, resolved: in bf16 the "
        "summation order can flip a close prediction.",
    )
    generation_check: bool = Field(
        True,
        description="Classification by scoring: also generate every answer greedily to the "
        "end of the turn, as a chat server (vLLM, TGI, Ollama, a transformers pipeline) "
        "serves the model, freely and constrained to the labels' text (vLLM guided_choice, a "
        "grammar), and report how often that is the scored label, how often any label, and "
        "the metrics of the generated answers (`generation` in every evaluation's result, "
        "`generated` and `constrained_label` in predictions.jsonl; the report warns below 98% "
        "agreement). "
        "Reported, not gated, not part of the eval protocol; false saves its time.",
    )
    few_shot: int | None = Field(
        None,
        ge=1,
        le=64,
        description="K: the prompting alternative, pre-registered. `lorapilot run` also "
        "evaluates the base shown K training examples before every prompt (`baseline --shots "
        "K`: the categories in turn, seeded by train.seed), and `compare` and the report set "
        "the chosen adapter against it (gain, paired CI, whether it reaches success.min_gain). "
        "Text pilots; reported beside the decision, which stays against the zero-shot "
        "baseline.",
    )

    few_shot_selection: Literal["fixed", "similar"] = Field(
        "fixed",
        description="Which training examples a few-shot prompt shows (`eval.few_shot`, "
        "`baseline --shots K`): fixed, the same K for every input (the categories in turn); "
        "similar, each input's K most similar by TF-IDF word cosine, the nearest last "
        "(retrieval-augmented prompting, the stronger alternative).",
    )

    linear_probe: bool = Field(
        False,
        description="The embedding-classifier alternative, pre-registered (text "
        "classification, single- or multi-label: one probe per label): `lorapilot run` also "
        "fits a logistic regression on the frozen base's features of each prompt on the "
        "training split (`baseline --linear-probe`), "
        "and `compare` and the report set the chosen adapter against it on validation (gain, "
        "paired CI, whether it reaches success.min_gain). Reported beside the decision, which "
        "stays against the zero-shot baseline.",
    )

    # omitted from the spec hash at their defaults: specs written before them hash the same
    _omitted_at: ClassVar[dict[str, tuple]] = {
        "label_search": ("best_first",),  # same argmax
        "label_scoring": ("sum",),
        "shared_prefix": ("auto",),
        "generation_check": (True,),
        "few_shot": (None,),
        "few_shot_selection": ("fixed",),
        "linear_probe": (False,),
    }


class SuccessSpec(_Strict):
    """The pre-registered success criterion: a metric and the gain over the baseline it needs."""

    metric: str = Field(description="Main metric, e.g. macro_f1, accuracy, field_f1.")
    min_gain: float = Field(description="Required absolute gain over the baseline.")


GUARD_RULES = ("max_drop", "min", "min_gain", "max", "max_rise")


class GuardSpec(_Strict):
    """A must-not-degrade rule. Give exactly one of max_drop, min, min_gain (metrics where
    higher is better) or max, max_rise (rates where lower is better: invalid_rate,
    ungrounded_value_rate)."""

    metric: str = Field(
        description="A metric name, or `per_category.<m>` / `per_field.<m>` for every one."
    )
    max_drop: float | None = Field(None, ge=0, description="base - candidate <= this.")
    min: float | None = Field(None, description="candidate >= this.")
    min_gain: float | None = Field(None, description="candidate - base >= this.")
    max: float | None = Field(None, description="candidate <= this.")
    max_rise: float | None = Field(None, ge=0, description="candidate - base <= this.")

    @model_validator(mode="after")
    def _one_rule(self) -> GuardSpec:
        given = [k for k in GUARD_RULES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a guard needs exactly one of " + ", ".join(GUARD_RULES))
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for key in ("max", "max_rise"):  # unset: left out, so older specs keep their hash
            if out.get(key, 0) is None:
                del out[key]
        return out
