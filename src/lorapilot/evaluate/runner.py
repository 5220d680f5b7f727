"""One evaluation procedure for the baseline, every variant, the fresh-process verify and the
final test: same prompts, same decoding, same metrics, described by an *evaluation protocol*
whose hash decides whether two results may be compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lorapilot.base.models import pad_id_of
from lorapilot.base.precision import TORCH_DTYPE_NAMES, default_device_type, resolve
from lorapilot.data.dataset import PreparedData
from lorapilot.data.format import PromptFormatter, answer_text, template_hash
from lorapilot.data.rows import Record, answer_of, conversation_text
from lorapilot.evaluate import predict
from lorapilot.evaluate.metrics import (
    CONTENT_FREE,
    calibration_offsets,
    classification_metrics,
    label_set_invalid,
    multi_label_metrics,
    parse_label_set,
)
from lorapilot.evaluate.served import (
    CONSTRAINED,
    LabelChoice,
    could_be_label,
    generation_figures,
    token_bytes,
)
from lorapilot.evaluate.structured import Scorer, extraction_metrics, format_metrics
from lorapilot.fsutil import sha256_json
from lorapilot.records.progress import Phase
from lorapilot.spec import PilotSpec
from lorapilot.train.meter import PeakMemory

GENERATION_MARGIN = 16  # tokens beyond the longest target: room for a slightly longer answer


def prefix_cache_on(setting: str, device_type: str | None = None) -> bool:
    """eval.shared_prefix resolved for the device evaluation runs on. `auto` is on on a CPU
    (1.2-5x faster there) and off on a GPU: on an H200 the cache's extra pass cost more than
    it saved in every measured case but one (an 8B model with a 450-token prefix),
    bench/README.md "The shared-prefix paths at 1-8B parameters on a GPU"."""
    if setting != "auto":
        return setting == "on"
    return (device_type or default_device_type()) == "cpu"


def make_protocol(
    spec: PilotSpec,
    tokenizer: Any,
    prepared: PreparedData,
    shots: dict | None = None,
    linear_probe: dict | None = None,
) -> dict:
    """Everything that changes predictions, and its hash `eval_protocol`; `shots`: a few-shot
    baseline's demonstrations (k, seed, ids, the tokens they add); `linear_probe`: the
    embedding-classifier alternative's classifier (evaluate/text_probe.py)."""
    task, ev = spec.task, spec.eval
    mode = ev.mode if task.kind == "classification" else "generate"
    max_new = ev.max_new_tokens or (prepared.answer_budget + GENERATION_MARGIN)
    proto = {
        "task": task.kind,
        "mode": mode,
        "decoding": "label_scoring" if mode == "score" else "greedy",
        # The shared prompt prefix's KV cache is computed once and reused (same results in
        # fp32; in bf16 a different summation order can flip a greedy token, so it is part
        # of the procedure and results from before it are not silently compared).
        "shared_prefix_cache": prefix_cache_on(ev.shared_prefix),
        "max_new_tokens": None if mode == "score" else max_new,
        "batch_size": ev.batch_size,
        "precision": resolve(ev.precision),  # `auto` as this machine runs it
        "normalize": ev.normalize.model_dump(),
        "template_hash": template_hash(tokenizer, task),
        "answer_budget": prepared.answer_budget,
        "max_length": spec.data.max_length,
        "truncation_side": spec.data.truncation_side,
        "labels": task.labels,
        "seed": spec.train.seed,
        "data_version": prepared.version,
    }
    if spec.eval.label_scoring != "sum":  # absent at the default: older hashes hold
        proto["label_scoring"] = spec.eval.label_scoring
    if shots:  # absent for every zero-shot evaluation: their hashes hold
        proto["shots"] = shots
    if linear_probe:  # the same prompts, read by a classifier fitted on their features
        proto["linear_probe"] = linear_probe
    held = held_weights(spec, proto["precision"])
    if held is not None:  # weights rounded below the evaluation's precision (explicit dtype)
        proto["weights_dtype"] = held
    proto["eval_protocol"] = "ep-" + sha256_json(proto)[:16]
    return proto


def held_weights(spec: PilotSpec, precision: str) -> str | None:
    """The dtype the base is loaded in when it is narrower than the evaluation's precision
    (an explicit `model.dtype: bfloat16` evaluated in fp32 or fp16 computes with weights
    rounded to bf16 first), else None: the protocol's `precision` is then the dtype every
    weight is evaluated in.
    A quantized base is named by the base identity instead."""
    dtype = spec.model.dtype
    if dtype == "auto" or spec.model.quantization is not None:
        return None
    return dtype if dtype not in ("float32", TORCH_DTYPE_NAMES[precision]) else None


def cast_for_eval(model: Any, precision: str) -> Any:
    """Evaluation runs the whole model in the protocol's dtype (weights cast once, no autocast):
    on CPU this is ~2x faster than autocast, which re-casts every weight at every call, and a
    fresh-process reload that casts the same saved weights computes exactly the same thing.

    A model still on the CPU moves to the accelerator when there is one (CUDA or ROCm):
    baseline, eval and verify load the base on the CPU, and evaluating there on a GPU
    machine would waste the rental. CUDA_VISIBLE_DEVICES="" keeps it on the CPU."""
    import torch

    from lorapilot.base.quantize import is_quantized

    if is_quantized(model):  # loaded on its device, quantized: it runs under autocast as it is
        return model
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    # A trained model holds its frozen linears in 16 bits and the rest in fp32 (model.dtype
    # auto): every parameter is checked. Cast before the move, so that a GPU never holds a
    # full-precision copy of a base loaded in fp32.
    if any(p.dtype != dtype for p in model.parameters()):
        model = model.to(dtype)
    first = next(model.parameters())
    if first.device.type == "cpu" and torch.cuda.is_available():
        model = model.to(torch.device("cuda", torch.cuda.current_device()))
    return model


@dataclass
class EvalResult:
    metrics: dict
    predictions: list[dict]
    seconds: float
    examples_per_s: float
    protocol: dict = field(default_factory=dict)
    device: str = "cpu"
    peak_memory_bytes: int | None = None  # CPU: peak RSS; CUDA: max reserved (memmeter)
    peak_increase_bytes: int | None = None  # CPU: the RSS increase; CUDA: max allocated
    calibration: dict | None = None  # eval.label_scoring: calibrated (`calibration_record`)
    generation: dict | None = None  # eval.generation_check: `evaluate.served` figures


def evaluate_records(
    model: Any,
    tokenizer: Any,
    fmt: PromptFormatter,
    spec: PilotSpec,
    records: list[Record],
    protocol: dict,
    *,
    progress: bool = True,
    label: str = "eval",
    log: Callable[[str], None] | None = None,
    generation_check: bool = False,
) -> EvalResult:
    """Predict every record with the protocol's procedure and compute the task's metrics.
    `generation_check` (label scoring only): also generate every answer greedily, as a chat
    server would serve the model (`evaluate.served`); its time is in `seconds`, so that the
    probe's evaluation rate, which the budget plans with, includes it."""
    budget = protocol["answer_budget"]
    model = cast_for_eval(model, protocol["precision"])
    model.eval()  # dropout off: evaluation is deterministic
    fitted = [fmt.prompt_and_cut(r.text, budget, r.context) for r in records]
    prompts = [ids for ids, _ in fitted]
    pad_id = pad_id_of(tokenizer)
    t0 = time.perf_counter()
    # Evaluation has its own peak (KV caches of a batch, the label tree, generation): a
    # memory limit covers it too, not only the training step's.
    meter = PeakMemory(next(model.parameters()).device)
    calibration = scores = outputs = greedy = None
    stop = stop_token_ids(tokenizer, fmt)
    with (
        meter,
        Phase(
            label, len(records), bar=progress, log=log if progress else None, field_names=("rate",)
        ) as phase,
    ):

        def tick(n: int) -> None:
            rate = (phase.done + n) / max(time.perf_counter() - t0, 1e-9)
            phase.advance(n=n, rate=f"{rate:.1f} ex/s")

        if protocol["mode"] == "score":
            if generation_check:  # decoded from the caches scoring computes, batch by batch
                max_new = spec.eval.max_new_tokens or budget + GENERATION_MARGIN
                alive = _label_prefix(tokenizer, spec.task.labels)
                choice = LabelChoice(token_bytes(tokenizer), spec.task.labels or [], stop)
                greedy = predict.Greedy(max_new, stop, alive, choice)  # as eval.mode generate
            scores, calibration = _score(model, fmt, spec, prompts, protocol, pad_id, tick, greedy)
        else:
            gen = predict.generate(
                model,
                prompts,
                max_new_tokens=protocol["max_new_tokens"],
                stop_ids=stop,
                pad_id=pad_id,
                batch_size=protocol["batch_size"],
                progress=tick,
                share_prefix=protocol["shared_prefix_cache"],
            )
            outputs = [tokenizer.decode(g, skip_special_tokens=True) for g in gen]
    seconds = time.perf_counter() - t0

    prompt_texts = [tokenizer.decode(p) for p in prompts]
    offsets = None if calibration is None else calibration["offsets"]
    metrics, rows = score_predictions(spec, records, prompt_texts, scores, outputs, offsets)
    metrics["n"] = sum(answer_of(r) is not None for r in records)
    for row, (_, cut) in zip(rows, fitted, strict=True):
        row["tokens_cut"] = cut  # the input's tokens cut to fit data.max_length
    if hasattr(fmt, "shot_ids_for"):  # demonstrations chosen per input: which ones
        for row, r in zip(rows, records, strict=True):
            row["shot_ids"] = fmt.shot_ids_for(r.text)
    generation = None
    if greedy is not None:
        texts, held = (
            [tokenizer.decode(ids[i], skip_special_tokens=True) for i in range(len(prompts))]
            for ids in (greedy.ids, greedy.constrained)
        )
        generation = _generation(spec, records, prompt_texts, rows, metrics, texts, held)
        generation["seconds"] = round(greedy.seconds, 3)  # of `seconds`: the check's cost
        generation["constrained"]["seconds"] = round(greedy.constrained_seconds, 3)
    device = str(next(model.parameters()).device)
    return EvalResult(
        metrics, rows, seconds, len(records) / max(seconds, 1e-9), protocol, device,
        meter.total, meter.peak, calibration, generation,
    )  # fmt: skip


def _label_prefix(tokenizer, labels) -> Callable[[list[int]], bool]:
    """The generation check needs only the label an answer parses to: a row ends once its
    text can no longer be one (a chatty zero-shot base: after a token or two)."""
    folded = {lab.casefold() for lab in labels or []}
    return lambda ids: could_be_label(tokenizer.decode(ids, skip_special_tokens=True), folded)


def _score(
    model, fmt, spec, prompts, protocol, pad_id, tick, greedy=None
) -> tuple[np.ndarray, dict | None]:
    """Every label's log-probability after every prompt (calibrated: with the offsets of the
    content-free inputs) -> (scores, the calibration record or None); `greedy`: each
    prompt also decoded greedily (the generation check)."""
    task, budget = spec.task, protocol["answer_budget"]
    label_ids = label_token_ids(fmt, task, budget)
    offsets = calibration = None
    if protocol.get("label_scoring") == "calibrated":
        free = [fmt.encode_prompt(text, budget) for text in CONTENT_FREE]
        free_scores = predict.score_labels(
            model, free, label_ids, batch_size=len(free), pad_id=pad_id,
            share_prefix=False, search="all",
        )  # fmt: skip
        offsets = calibration_offsets(free_scores)
        calibration = calibration_record(task.labels or [], free_scores, offsets)
    scores = predict.score_labels(
        model,
        prompts,
        label_ids,
        batch_size=protocol["batch_size"],
        pad_id=pad_id,
        progress=tick,
        search=spec.eval.label_search,
        share_prefix=protocol["shared_prefix_cache"],
        offsets=offsets,
        greedy=greedy,
    )
    return scores, calibration


def _generation(spec, records, prompt_texts, rows: list[dict], metrics: dict, texts, held) -> dict:
    """The generation check's figures, free (`texts`) and constrained to the labels (`held`,
    in `constrained`); each prediction row gets its `generated` text, the label it parses to
    (`generated_label`, None when it is none) and the label constrained decoding ends in
    (`constrained_label`)."""
    gen_metrics, gen_rows = score_predictions(spec, records, prompt_texts, None, texts)
    held_metrics, held_rows = score_predictions(spec, records, prompt_texts, None, held)
    for row, g, h in zip(rows, gen_rows, held_rows, strict=True):
        row["generated"], row["generated_label"] = g["raw_output"], g["parsed"]
        row["constrained_label"] = h["parsed"]
    keys = list(dict.fromkeys((spec.success.metric, "accuracy", "macro_f1")))
    keys = [k for k in keys if isinstance(gen_metrics.get(k), int | float)]
    out = generation_figures(rows, gen_rows, metrics, gen_metrics, keys)
    out["constrained"] = generation_figures(
        rows, held_rows, metrics, held_metrics, keys, what=CONSTRAINED
    )
    return out


def calibration_record(labels: list[str], free_scores: np.ndarray, offsets: np.ndarray) -> dict:
    """What calibrated scoring used, written beside the predictions (calibration.json)."""
    return {
        "method": "contextual calibration (Zhao et al. 2021)",
        "content_free": list(CONTENT_FREE),
        "content_free_scores": [
            {lab: round(float(x), 6) for lab, x in zip(labels, row, strict=True)}
            for row in free_scores
        ],
        "offsets": {lab: float(x) for lab, x in zip(labels, offsets, strict=True)},
    }


def label_token_ids(fmt: PromptFormatter, task, budget: int) -> list[list[int]]:
    """Each label's tokens as scored after a prompt: the answer and the end of its turn."""
    encs = [fmt.encode("x", lab, budget) for lab in task.labels]
    return [e.input_ids[e.prompt_len :] for e in encs]


def stop_token_ids(tokenizer: Any, fmt: PromptFormatter) -> list[int]:
    """Greedy generation stops at the tokenizer's eos or the token that ends an answer."""
    ends = fmt.completion_ids(fmt.prompt_text("x"), fmt.full_text("x", "y"), "y")[1]
    return sorted({i for i in (tokenizer.eos_token_id, ends) if i is not None})


def _row_head(r: Record, prompt: str, raw_output: Any) -> dict:
    """The keys every prediction row starts with, whatever the task."""
    return {"id": r.id, "category": r.category, "text": r.text, "prompt": prompt,
            "raw_output": raw_output}  # fmt: skip


def score_predictions(
    spec: PilotSpec,
    records: list[Record],
    prompt_texts: list[str],
    scores: np.ndarray | None,
    outputs: list[str] | None,
    offsets: dict[str, float] | None = None,
) -> tuple[dict, list[dict]]:
    """(metrics, prediction rows) from label scores or generated texts: one definition of
    what a prediction is, whichever runtime computed the scores or the text (lorapilot's
    torch evaluation, or llama.cpp in the serving check). With `offsets` (calibrated
    scoring, by label) the prediction is the argmax of score + offset."""
    task = spec.task
    rows: list[dict] = []
    # inputs to predict may come without an answer: the metrics are over the ones that have
    # one (every row in an evaluation), each row's `correct` None where there is none
    known = [i for i, r in enumerate(records) if answer_of(r) is not None]
    if task.kind == "classification":
        labels = list(task.labels or [])
        if scores is not None:
            shift = np.array([offsets[lab] for lab in labels]) if offsets else 0.0
            preds = [labels[int(i)] for i in np.nanargmax(scores + shift, axis=1)]
        else:
            lookup = {lab.casefold(): lab for lab in labels}
            preds = [lookup.get(o.strip().casefold()) for o in outputs]
        metrics = classification_metrics(
            [records[i].label for i in known], [preds[i] for i in known], labels
        )
        for i, r in enumerate(records):
            row = {
                **_row_head(r, prompt_texts[i], outputs[i] if outputs is not None else preds[i]),
                "parsed": preds[i],
                "gold": r.label,
                "correct": None if r.label is None else preds[i] == r.label,
            }
            if scores is not None:  # best-first search: the labels it scored, said so
                row["scores"] = {
                    lab: round(float(s), 6)
                    for lab, s in zip(labels, scores[i], strict=True)
                    if not np.isnan(s)
                }
                row["all_labels_scored"] = len(row["scores"]) == len(labels)
            rows.append(row)
    elif task.multi_label:
        assert outputs is not None
        labels = list(task.labels or [])
        parsed = [parse_label_set(o, labels) for o in outputs]
        invalid = [label_set_invalid(p, unknown) for p, unknown in parsed]
        metrics = multi_label_metrics(
            [records[i].target for i in known],
            [parsed[i][0] for i in known],
            labels,
            [invalid[i] for i in known],
        )
        for i, r in enumerate(records):
            named, unknown = parsed[i]
            rows.append(
                {
                    **_row_head(r, prompt_texts[i], outputs[i]),
                    "parsed": named,
                    "unknown_labels": unknown,
                    "gold": r.target,
                    "correct": None if r.target is None else set(named or ()) == set(r.target),
                }
            )
    else:
        assert outputs is not None
        sub = [records[i] for i in known]
        gold, outs = [r.target for r in sub], [outputs[i] for i in known]
        # a value is grounded where the conversation said it, in any turn
        cats, texts = [r.category for r in sub], [conversation_text(r) for r in sub]
        if task.kind == "extraction":
            metrics = extraction_metrics(
                gold, outs, task, spec.eval.normalize, categories=cats, texts=texts
            )
        else:
            metrics = format_metrics(
                outs, task, gold, spec.eval.normalize, categories=cats, texts=texts
            )
        n = len(records)
        parsed, correct, errors = [None] * n, [None] * n, [None] * n
        for key, into in (("parsed", parsed), ("correct", correct), ("parse_errors", errors)):
            for i, v in zip(known, metrics.pop(key, [None] * len(known)), strict=True):
                into[i] = v
        metrics.pop("valid", None)
        if len(known) < n:  # the unanswered rows: parsed as extraction_metrics parses one
            scorer = Scorer(task, spec.eval.normalize)
            answered = set(known)
            for i in (i for i in range(n) if i not in answered):
                _, parsed[i], errors[i] = scorer.counts(None, outputs[i], text=records[i].text)
        for i, r in enumerate(records):
            rows.append(
                {
                    **_row_head(r, prompt_texts[i], outputs[i]),
                    "parsed": parsed[i],
                    "parse_error": errors[i],
                    "gold": r.target,
                    "gold_answer": None
                    if r.target is None
                    else answer_text(task, r.label, r.target),
                    "correct": None if r.target is None else bool(correct[i]),
                }
            )
    return metrics, rows
