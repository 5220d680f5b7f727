"""Text pilots: the prompt template, tokenisation and the loss mask (data/format.py) are the
preprocessing; `inspect` shows the tokens that carry the loss and checks they decode to the
answer."""

from __future__ import annotations

import contextlib
from functools import cached_property
from pathlib import Path
from typing import Any

from lorapilot.base.chat_template import FILE as CHAT_TEMPLATE_FILE
from lorapilot.base.models import load_tokenizer
from lorapilot.data.audit import example_view, sample_per_category
from lorapilot.data.dataset import PreparedData, encode_records, formatter_for, prepare_data
from lorapilot.data.summary import data_report, truncation_failure
from lorapilot.modality.trainee import Loaded, Trainee, training_records
from lorapilot.spec import AdapterSpec, Pilot


class TextModality:
    def __init__(self, pilot: Pilot):
        self.pilot = pilot

    @cached_property
    def tokenizer(self) -> Any:
        return load_tokenizer(self.pilot)[1]

    def prepare(self, *, enforce_leakage: bool = True) -> PreparedData:
        return prepare_data(self.pilot, self.tokenizer, enforce_leakage=enforce_leakage)

    def data_report(self, prepared: PreparedData) -> dict[str, Any]:
        return data_report(self.pilot, prepared, self.tokenizer)

    def failed_check(self, report: dict[str, Any]) -> str | None:
        if not report["mask_audit"]["ok"]:
            return "the loss-mask audit failed (see mask_audit)"
        return truncation_failure(report.get("truncation") or {})

    def inspect(
        self,
        prepared: PreparedData,
        split: str,
        per_category: int,
        seed: int,
        out: Path | None,
        shots: int = 0,
    ) -> dict[str, Any]:
        spec = self.pilot.spec
        fmt = formatter_for(self.pilot, self.tokenizer)
        shot_info = None
        if shots:  # the prompts as `baseline --shots` builds them
            fmt, shot_info = self._few_shot(fmt, prepared, shots)
        recs = prepared.splits.get(split) or []
        views = []
        for rec in sample_per_category(recs, per_category, seed):
            enc = encode_records(fmt, spec.task, [rec], prepared.answer_budget)[0]
            views.append(example_view(fmt, rec, enc, split))
        return {
            "ok": all(v["match"] for v in views),
            "version": prepared.version,
            "split": split,
            "categories": sorted({r.category for r in recs}),
            # which chat template renders the prompts: model.chat_template, or the base's own
            "chat_template": spec.model.chat_template or "base",
            # a template that takes no system turn: the system text opens the first user turn
            "system_folded": fmt.fold_system,
            "examples": views,
            **({"shots": shot_info} if shot_info else {}),
        }

    def _few_shot(self, fmt: Any, prepared: PreparedData, shots: int) -> tuple[Any, dict]:
        """`fmt` with `shots` training examples before every prompt, and their record."""
        from lorapilot.data.dataset import model_context
        from lorapilot.data.shots import few_shot_formatter

        spec = self.pilot.spec
        return few_shot_formatter(
            fmt, prepared.splits.get("train") or [], spec.task, shots, spec.train.seed,
            prepared.answer_budget, model_context(fmt.tok), spec.eval.few_shot_selection,
        )  # fmt: skip

    def _evaluator(self, tok: Any, fmt: Any, prepared: PreparedData):
        """(model, records, label=, progress=, log=) -> (EvalResult, protocol)."""
        from lorapilot.evaluate.runner import evaluate_records, make_protocol

        spec = self.pilot.spec

        def evaluate(
            model, records, *, label="eval", progress=True, log=None, plain=False, generation=None
        ):
            """`generation`: the generation check (None: eval.generation_check; the smoke's
            `plain` question and verify's reload leave it out)."""
            protocol = make_protocol(spec, tok, prepared)
            if plain:  # the labels the model itself ranks first (the smoke's question)
                protocol.pop("label_scoring", None)
            check = spec.eval.generation_check if generation is None else generation
            ev = evaluate_records(
                model, tok, fmt, spec, records, protocol, progress=progress, label=label,
                log=log, generation_check=check and not plain,
            )  # fmt: skip
            return ev, protocol

        return evaluate

    def trainee(
        self, *, adapter: AdapterSpec | None = None, smoke_per_category: int | None = None
    ) -> Trainee:
        """The base and tokenizer, the prompts encoded with their loss masks, LoRA attached."""
        from lorapilot.base.adapter import build_adapter
        from lorapilot.base.models import load_base, pad_id_of
        from lorapilot.base.precision import hold_for_training
        from lorapilot.data.format import template_hash, tokenizer_hash
        from lorapilot.train.examples import TextExamples

        pilot, spec = self.pilot, self.pilot.spec
        adapter = adapter or spec.adapter
        resolved, model, tok = load_base(pilot, use="train")
        prepared = prepare_data(pilot, tok)
        fmt = formatter_for(pilot, tok)
        train_recs, val_recs = training_records(
            prepared, smoke_per_category, spec.train.seed, spec.smoke
        )
        pad_id = pad_id_of(tok)

        def examples(records: list) -> TextExamples:
            return TextExamples(
                encode_records(fmt, spec.task, records, prepared.answer_budget), pad_id,
                [r.category for r in records],
            )  # fmt: skip

        train_set, val_set = examples(train_recs), examples(val_recs)
        model, info = build_adapter(
            model, adapter, seed=spec.train.seed,
            grad_checkpointing=spec.train.grad_checkpointing,
        )  # fmt: skip
        info.update(hold_for_training(model, spec, adapter.method))

        evaluate = self._evaluator(tok, fmt, prepared)

        return Trainee(
            resolved=resolved,
            model=model,
            adapter_info=info,
            prepared=prepared,
            train_records=train_recs,
            train_set=train_set,
            val_set=val_set,
            evaluate=evaluate,
            manifest_hashes={
                "tokenizer_sha256": tokenizer_hash(tok),
                "template_sha256": template_hash(tok, spec.task),
            },
            adapter_texts=(
                {CHAT_TEMPLATE_FILE: tok.chat_template} if spec.model.chat_template else {}
            ),
        )

    def adapter_problems(self, adapter_dir: Path, manifest: dict) -> list[str]:
        return []  # the tokenizer, template and files are checked where they are loaded

    def load(
        self,
        adapter_dir: Path | None = None,
        manifest: dict | None = None,
        resolved: Any = None,
        shots: int = 0,
        linear_probe: bool = False,
    ) -> Loaded:
        """`shots`: the base evaluated (`evaluate_base`) with that many demonstrations from
        the training split before every prompt: a few-shot baseline. `linear_probe`:
        `evaluate_base` is a logistic regression on the frozen base's prompt features,
        fitted on the training split (evaluate/text_probe.py)."""
        from lorapilot.base.models import attach_adapter, is_full_finetune, load_base
        from lorapilot.data.format import template_hash, tokenizer_hash
        from lorapilot.evaluate.runner import evaluate_records, make_protocol

        pilot, spec = self.pilot, self.pilot.spec
        resolved, model, tok = load_base(pilot, resolved)
        full = adapter_dir is not None and is_full_finetune(Path(adapter_dir))
        problems = []
        if manifest is not None:
            for what, now, then in (
                ("tokenizer", tokenizer_hash(tok), manifest.get("tokenizer_sha256")),
                ("chat template", template_hash(tok, spec.task), manifest.get("template_sha256")),
            ):
                if now != then:
                    problems.append(
                        f"{what} sha256 {now} differs from the one trained with ({then})"
                    )
        if adapter_dir is not None:
            model = attach_adapter(model, Path(adapter_dir))
        prepared = prepare_data(pilot, tok)
        fmt = formatter_for(pilot, tok)
        base_fmt, shot_info = fmt, None
        if shots:
            base_fmt, shot_info = self._few_shot(fmt, prepared, shots)

        evaluate = self._evaluator(tok, fmt, prepared)

        def evaluate_base(
            records, protocol, *, label="baseline", progress=True, log=None, generation=None,
            label_issues=False,
        ):  # fmt: skip
            # an attached adapter switched off: the same model, protocol and rows; a full
            # fine-tune replaced the weights, so the base is loaded again beside it
            base = load_base(pilot, resolved)[1] if full else model
            if linear_probe:
                from lorapilot.evaluate.feature_cache import cache_path
                from lorapilot.evaluate.text_probe import probe_evaluation

                train = prepared.splits.get("train") or []
                first = next(base.parameters())
                cache = cache_path(pilot.dir, {  # what the training prompts' features hold
                    "eval_protocol": protocol.get("eval_protocol"),
                    "base": resolved.weights_sha256, "ids": [r.id for r in train],
                    "dtype": str(first.dtype), "device": first.device.type,
                })  # fmt: skip
                return probe_evaluation(
                    base, tok, fmt, spec, train, records, prepared.answer_budget, protocol,
                    progress=progress, label=label, log=log, issues=label_issues, cache=cache,
                )  # fmt: skip
            lora = adapter_dir is not None and not full
            with model.disable_adapter() if lora else contextlib.nullcontext():
                ev = evaluate_records(
                    base, tok, base_fmt, spec, records, protocol, progress=progress, label=label,
                    log=log,
                    generation_check=spec.eval.generation_check if generation is None
                    else generation,
                )  # fmt: skip
            return ev, {}

        probe = None
        if linear_probe:
            from lorapilot.evaluate.text_probe import protocol_of

            probe = protocol_of(spec.task)
        protocol = make_protocol(spec, tok, prepared, shot_info, probe)
        return Loaded(resolved, model, prepared, evaluate, evaluate_base, problems, protocol)
