"""The whole spec (`PilotSpec`): its sections, the rules that span sections, its hash."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from lorapilot.fsutil import sha256_json
from lorapilot.spec.checks import SmokeSpec
from lorapilot.spec.common import _NAME_RE, IMAGE_BASE, _Strict
from lorapilot.spec.data import DataSpec
from lorapilot.spec.evaluation import ALTERNATIVE_KEYS, EvalSpec, GuardSpec, SuccessSpec
from lorapilot.spec.export import ExportSpec
from lorapilot.spec.limits import LimitsSpec
from lorapilot.spec.model import ModelSpec
from lorapilot.spec.plan import SelectionSpec, VariantSpec
from lorapilot.spec.task import FieldSpec, TaskSpec
from lorapilot.spec.train import AdapterSpec, TrainSpec


def drop_additions(resolved: dict) -> dict:
    """A spec dump without the keys that only add runs of their own (the alternatives'
    baselines, `eval` ALTERNATIVE_KEYS; more seeds, `selection.seeds`, each run recording its
    seed): for the spec hash and `run`'s phase inputs, so adding them redoes nothing."""
    for key in ALTERNATIVE_KEYS:
        resolved["eval"].pop(key, None)
    resolved["selection"].pop("seeds", None)
    return resolved


class PilotSpec(_Strict):
    """The whole pilot.yaml."""

    name: str = Field(description="Pilot name: letters, digits, . _ - (used in paths).")
    hypothesis: str = Field(min_length=1, description="The behaviour to improve, in words.")
    task: TaskSpec
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec
    adapter: AdapterSpec = Field(default_factory=AdapterSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    success: SuccessSpec | None = None
    guards: list[GuardSpec] = Field(default_factory=list)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    smoke: SmokeSpec = Field(
        default_factory=SmokeSpec, description="How the smoke test sizes itself to the task."
    )
    tracking: list[Literal["mlflow", "tensorboard"]] = Field(
        default_factory=list,
        description="Mirror every run to these trackers (optional extras: pip install "
        "'lorapilot[mlflow]' / 'lorapilot[tensorboard]'). The run records stay the source of "
        "truth; `lorapilot sync` mirrors existing ones.",
    )
    variants: list[VariantSpec] = Field(
        default_factory=list,
        description="Pre-registered experiments besides `base` (the recipe as written), run "
        "in order by `lorapilot run`.",
    )
    selection: SelectionSpec = Field(default_factory=SelectionSpec)
    export: ExportSpec = Field(
        default_factory=ExportSpec,
        description="The formats `run` exports and checks for the deliverable.",
    )

    @field_validator("variants")
    @classmethod
    def _unique(cls, v: list[VariantSpec]) -> list[VariantSpec]:
        seen: set[str] = set()
        for i, var in enumerate(v):
            if var.name in seen:
                raise ValueError(f"[{i}].name {var.name!r} is given twice")
            seen.add(var.name)
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("must be 1-64 of letters, digits, '.', '_', '-' (no path separators)")
        return v

    @field_validator("hypothesis")
    @classmethod
    def _hyp(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must state the behaviour to improve (non-empty)")
        return v

    @model_validator(mode="after")
    def _quantized_base_takes_an_adapter(self) -> PilotSpec:
        if self.model.quantization is None:
            return self
        if self.adapter.method == "full":
            raise ValueError(
                "model.quantization: a quantized base cannot be fine-tuned in full "
                "(adapter.method: full); use adapter.method: lora, or drop the quantization"
            )
        if self.train.distributed == "fsdp":
            raise ValueError(
                "model.quantization: a quantized base is not sharded with FSDP here; use "
                "train.distributed: ddp (each GPU holds the whole quantized base)"
            )
        return self

    @model_validator(mode="after")
    def _text_keys_are_for_text(self) -> PilotSpec:
        """Keys only a text pilot reads, refused on an image pilot, saying what it has (and
        the image path's template on a text pilot)."""
        if self.task.modality != "image":
            if self.data.fields.image_template is not None:
                raise ValueError(
                    "data.fields.image_template builds an image's path; a text pilot's input "
                    "is text (data.fields.text, or text_template)"
                )
            return self
        refused = [
            (self.eval.few_shot is not None,
             "eval.few_shot: prompting with examples is a text pilot's alternative; an image "
             "pilot's baseline is a linear probe on the frozen features"),
            (self.data.fields.text_template is not None,
             "data.fields.text_template builds a text input from columns; an image pilot's "
             "input is the image (data.fields.image)"),
            (self.data.fields.messages is not None,
             "data.fields.messages reads chat conversations; an image pilot's input is the "
             "image (data.fields.image)"),
            (self.model.chat_template is not None,
             "model.chat_template sets a text model's prompt format; an image pilot has no "
             "prompt (remove the key)"),
            ("gguf" in self.export.formats,
             "export.formats: gguf is llama.cpp's format for text models; an image pilot "
             "exports peft or merged"),
        ]  # fmt: skip
        for is_set, why in refused:
            if is_set:
                raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _linear_probe_is_for_text_classification(self) -> PilotSpec:
        if self.eval.linear_probe and not (self.task.labelled and self.task.modality == "text"):
            raise ValueError(
                "eval.linear_probe: a logistic regression on the base's features picks from "
                f"task.labels: a text classification's alternative, not a {self.task.kind}'s"
                + (
                    " (an image pilot's baseline already is a linear probe)"
                    if self.task.modality == "image"
                    else ""
                )
            )
        return self

    @model_validator(mode="after")
    def _gguf_has_no_dora(self) -> PilotSpec:
        if "gguf" in self.export.formats and self.adapter.dora:
            raise ValueError(
                "export.formats: gguf: a DoRA adapter (adapter.dora) has no GGUF LoRA form in "
                "llama.cpp; export merged (export --merge, or formats: [peft, merged])"
            )
        return self

    @model_validator(mode="after")
    def _calibration_is_for_label_scoring(self) -> PilotSpec:
        if self.eval.label_scoring == "calibrated" and (
            self.task.kind != "classification" or self.eval.mode != "score"
        ):
            raise ValueError(
                "eval.label_scoring: calibrated re-weights the scores of a text classification's "
                f"labels (task.kind: classification, eval.mode: score); this pilot has "
                f"task.kind: {self.task.kind}, eval.mode: {self.eval.mode}"
            )
        return self

    @model_validator(mode="after")
    def _label_separator(self) -> PilotSpec:
        sep = self.data.fields.label_separator
        if "label_separator" in self.data.fields.model_fields_set and not self.task.multi_label:
            raise ValueError(
                "data.fields.label_separator splits a multi-label example's labels "
                f"(task.kind: multi_label_classification); this pilot has task.kind: "
                f"{self.task.kind}"
            )
        holding = [lab for lab in self.task.labels or [] if self.task.multi_label and sep in lab]
        if holding:
            raise ValueError(
                f"data.fields.label_separator {sep!r} occurs in the label {holding[0]!r}, "
                "so a label cell could not be split; choose another separator"
            )
        return self

    @model_validator(mode="after")
    def _multi_label_generates(self) -> PilotSpec:
        if self.task.multi_label and self.eval.mode == "score":
            if "mode" in self.eval.model_fields_set:
                raise ValueError(
                    "eval.mode: score ranks single labels; a multi_label_classification task "
                    "generates its list of labels (eval.mode: generate, or leave it out)"
                )
            self.eval.__dict__["mode"] = "generate"
        return self

    @model_validator(mode="after")
    def _category_source(self) -> PilotSpec:
        by = self.data.category
        if by is None:
            return self
        if self.task.labelled:
            raise ValueError("data.category: a classification example's category is its label")
        if by.startswith("target.") and self.task.fields:
            fields: list[FieldSpec] | None = self.task.fields
            for key in by[len("target.") :].split("."):
                field = next((f for f in fields or [] if f.name == key), None)
                if field is None or field.type in ("list", "map"):
                    raise ValueError(
                        f"data.category: {by!r} is not a field path of task.fields (an object's "
                        "fields may be named by dots, e.g. target.intent; lists and maps not)"
                    )
                fields = field.fields
            if fields is not None:
                raise ValueError(f"data.category: {by!r} is an object, not a category value")
        return self

    @model_validator(mode="after")
    def _metrics_exist(self) -> PilotSpec:
        """The success metric and every guard name a metric this task kind produces."""
        from lorapilot.spec.metric_names import ANSWER_GROUP, problem

        fields = [f.name for f in self.task.fields or []]
        fields += [p for f in self.task.fields or [] for p in f.leaf_paths(f.name) if p != f.name]
        subtrees = [f.name for f in self.task.fields or [] if f.has_leaves]
        named = [("success.metric", self.success.metric)] if self.success is not None else []
        named += [(f"guards[{i}].metric", g.metric) for i, g in enumerate(self.guards)]
        if self.selection.metric is not None:
            named.append(("selection.metric", self.selection.metric))
        for key, name in named:
            why = problem(
                name, self.task.kind, self.task.labels, fields, self.task.grounded, subtrees
            )
            if why:
                raise ValueError(f"{key}: {why}")
            if name in ANSWER_GROUP and not self.task.answer_group:
                raise ValueError(
                    f"{key}: {name} compares the part of the output that task.regex marks "
                    "with a named group `answer`, e.g. '(?s).*\\n#### (?P<answer>-?[0-9.,]+)', "
                    "and the regex has none (a regex-only format task: no task.json_schema or "
                    "task.fields)"
                )
        return self

    @model_validator(mode="after")
    def _defaults_by_task(self) -> PilotSpec:
        if self.task.modality == "image" and "base" not in self.model.model_fields_set:
            self.model.__dict__["base"] = IMAGE_BASE
        if self.success is None:
            metric = "macro_f1" if self.task.labelled else "field_f1"
            object.__setattr__(self, "success", SuccessSpec(metric=metric, min_gain=0.05))
        return self

    @property
    def selection_metric(self) -> str:
        assert self.success is not None
        return self.selection.metric or self.success.metric

    def variant_names(self) -> list[str]:
        """The plan, in order: `base` first."""
        return ["base", *(v.name for v in self.variants)]

    def spec_hash(self) -> str:
        """Hash of the resolved spec, `tracking` held at its default, `export`,
        `limits.gpu_prices`, `eval.few_shot`, `eval.linear_probe` and `selection.seeds` left
        out: where runs are mirrored, what is exported, what a GPU would cost, whether a
        few-shot baseline or a linear probe is also evaluated (its own run records it) and how
        many seeds each variant trains (each run records its seed) change no other result, so
        changing them keeps reuse, resume and the smoke gate working. `smoke` counts only
        when it differs from its defaults, so that specs written before it existed
        keep their hash. `model.dtype: auto` hashes as `float32`, the default it replaced: it
        computes exactly what an fp32 base under autocast computes (tests/base/test_frozen.py),
        so a result is reused across the two."""
        resolved = self.model_dump(mode="json")
        if resolved["model"]["dtype"] == "auto":
            resolved["model"]["dtype"] = "float32"
        resolved["tracking"] = []
        resolved.pop("export", None)
        resolved["limits"].pop("gpu_prices", None)
        drop_additions(resolved)
        if resolved.get("smoke") == SmokeSpec().model_dump(mode="json"):
            resolved.pop("smoke")
        return sha256_json(resolved)
