"""`lorapilot export`: the adapter as a folder of its own, or (`--merge`) a merged model folder
that plain transformers (images: the model's own package or transformers) loads, checked
against the adapter on the validation split."""

from __future__ import annotations

import shutil
from pathlib import Path

from lorapilot.base.manifest import (
    MANIFEST,
    file_problems,
    read_manifest,
    weights_sha256,
)
from lorapilot.base.models import attach_adapter, load_base, resolve_base
from lorapilot.base.precision import base_dtype
from lorapilot.base.quantize import describe, require_trained_base
from lorapilot.data.dataset import formatter_for, prepare_data
from lorapilot.decision.plan import pilot_of_run
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.evaluate.runner import evaluate_records, make_protocol
from lorapilot.export.folder import require_new_folder, write_folder
from lorapilot.export.gguf_export import (
    export_gguf,
    recheck,
    reference_answers,
    refuse_images,
)
from lorapilot.export.merge import merged_weights, only_lora, write_model_folder
from lorapilot.export.weights import read_safetensors
from lorapilot.records import registry
from lorapilot.records.progress import Phase, plain_log

MERGE_TOLERANCE = 1e-3
"""Max |logit| difference allowed between base+adapter and the merged model in fp32: merging
adds B@A*scale into W once instead of computing it per token, which reorders float sums."""


MERGE_DTYPES = ("auto", "float32", "float16", "bfloat16")

MERGE_AGREEMENT_MIN = 0.99
"""A merge of an adapter trained on a quantized base must give the same validation
predictions as the adapter on that base for at least this share of examples."""


def run_export(
    pilot,
    run_id: str | None,
    out: Path | None,
    merge: bool = False,
    *,
    gguf: bool = False,
    gguf_base: str | None = None,
    min_agreement: float | None = None,
    reference: str | None = None,
    check: Path | None = None,
    progress=None,
    merge_dtype: str | None = None,
) -> dict:
    """The adapter folder, its files checked against its manifest (`merge` False), or a merged
    model folder checked against the adapter: logits on validation inputs, and for a quantized
    base (and for images) the validation split's predictions (`merge_agreement`). `gguf`: the
    llama.cpp / Ollama folder, checked in llama.cpp (`export.gguf_export`); `check`: that
    check again on a folder already written."""
    if gguf or check is not None:
        refuse_images(pilot)
    if check is not None:
        return recheck(pilot, check, min_agreement, reference, progress=progress)
    out = require_new_folder(out)
    train_id, adapter_dir = registry.adapter_of(pilot.dir, run_id)
    pilot = pilot_of_run(pilot, train_id)  # a variant's run: its own recipe (quantization)
    manifest = read_manifest(adapter_dir)
    if gguf:
        return export_gguf(
            pilot, train_id, adapter_dir, out, base_type=gguf_base, merge=merge,
            min_agreement=min_agreement, reference=reference, progress=progress,
        )  # fmt: skip
    if not merge:
        return _export_adapter(train_id, adapter_dir, manifest, out)
    if manifest.get("method") != "lora":
        raise UsageError(
            f"--merge: train run {train_id} is a {manifest.get('method')} fine-tune, its "
            "weights are already whole; export it without --merge"
        )
    merge_dtype = merge_dtype or pilot.spec.export.merge_dtype  # the flag, else the spec
    if pilot.spec.task.modality == "image":
        if merge_dtype not in (None, "auto", "float32"):
            raise UsageError(f"--merge-dtype {merge_dtype}: an image model is merged in float32")
        return _merge_image(pilot, train_id, adapter_dir, manifest, out)
    return _merge_text(pilot, train_id, adapter_dir, manifest, out, merge_dtype, progress)


def _export_adapter(train_id: str, adapter_dir: Path, manifest: dict, out: Path) -> dict:
    """A copy of the adapter with its manifest, each file re-hashed against it first: what
    base it needs (weights sha256) and, for a quantized base, the quantization it needs."""
    problems = file_problems(adapter_dir, manifest, unlisted=True)
    if problems:
        raise CheckFailed(
            f"{adapter_dir}: the adapter's files differ from its manifest ({'; '.join(problems)}); "
            "not exported"
        )

    def write(tmp: Path) -> None:
        for name in [*manifest["files"], MANIFEST]:
            shutil.copy2(adapter_dir / name, tmp / name)
        return None  # the adapter's own manifest, copied

    files = write_folder(out, write)
    return {
        "ok": True,
        "out": str(out),
        "train_run": train_id,
        "merged": False,
        "method": manifest.get("method"),
        "base": manifest["base"],
        "needs_quantization": manifest.get("needs_quantization"),
        "files": sorted([*files, MANIFEST]),
    }


def _merge_text(
    pilot, train_id: str, adapter_dir: Path, manifest: dict, out: Path,
    merge_dtype: str | None = None, progress=None,
) -> dict:  # fmt: skip
    import torch

    m = pilot.spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    if weights_sha256(resolved.path, m.allow_pickle) != manifest["base"]["sha256"]:
        raise CheckFailed(
            f"the base weights in {resolved.path} are not the ones the adapter was trained on"
        )
    require_trained_base(manifest, m.quantization)  # as verify tests it
    adapter_w = read_safetensors(adapter_dir / "adapter_model.safetensors")
    dtype = _merged_dtype(merge_dtype, m.quantization is not None, adapter_w)
    if dtype != "float32":
        return _merge_streamed(
            pilot, train_id, adapter_dir, manifest, out, resolved, adapter_w, dtype, progress
        )
    _, base, tok = load_base(pilot, resolved, use="exact")  # the merge adds in fp32
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    prompts = [
        fmt.encode_prompt(r.text, prepared.answer_budget, r.context)
        for r in prepared.splits["val"][:4]
    ]
    extra: dict = {}
    quantized = pilot.spec.model.quantization is not None
    if not quantized:
        model = attach_adapter(base, adapter_dir).float()
        with torch.no_grad():
            before = [_last_logits(model, p) for p in prompts]
            merged = model.merge_and_unload()
            after = [_last_logits(merged, p) for p in prompts]
        tolerance = MERGE_TOLERANCE
    else:
        merged, before, after, extra, later = _merge_quantized(
            pilot, base, tok, fmt, prompts, adapter_dir, prepared
        )
        tolerance = None  # logits are reported; the gate is the predictions' agreement
    max_diff = max(float((a - b).abs().max()) for a, b in zip(before, after, strict=True))

    extra["merged_dtype"] = "float32"

    def write(tmp: Path) -> dict:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        return _merged_manifest(train_id, manifest, max_diff=max_diff, tolerance=tolerance, **extra)

    files = write_folder(out, write)
    if quantized:
        ok = extra["merge_agreement"] >= MERGE_AGREEMENT_MIN
        if later is not None:  # reported, not gated: see _merge_quantized
            extra["merge_agreement_in_protocol_precision"] = later()
    else:
        ok = max_diff <= MERGE_TOLERANCE
    result = _merged_result(out, train_id, files, max_diff, tolerance, extra) | {"ok": ok}
    if not ok:
        why = (
            f"the merged model agrees with the adapter on {extra['merge_agreement']:.1%} of the "
            f"validation predictions (< {MERGE_AGREEMENT_MIN:.0%})"
            if quantized
            else f"merged model differs from base+adapter by {max_diff:.2e} > {MERGE_TOLERANCE}"
        )
        raise CheckFailed(why, result)
    return result


def _merged_dtype(asked: str | None, quantized: bool, adapter_w: dict) -> str:
    """The dtype the merged weights are written in: `--merge-dtype`, float32 by default (the
    exact merge). A 16-bit merge is written from the base's files one tensor at a time; it
    rounds W + B@A to 16 bits, which in bfloat16 (8 bits of mantissa) loses much of a LoRA
    update: measured, not assumed (the check's `merge_agreement`)."""
    if asked in (None, "auto", "float32"):
        return "float32"
    if asked not in MERGE_DTYPES:
        raise UsageError(f"--merge-dtype {asked}: use {', '.join(MERGE_DTYPES)}")
    if quantized:
        raise UsageError(
            f"--merge-dtype {asked}: a quantized base is merged onto its dequantized weights "
            "in memory, in float32"
        )
    if not only_lora(adapter_w):
        raise UsageError(
            f"--merge-dtype {asked}: an adapter with whole trained modules (modules_to_save) "
            "is merged in memory, in float32"
        )
    return asked


def _merge_streamed(
    pilot, train_id: str, adapter_dir: Path, manifest: dict, out: Path, resolved,
    adapter_w: dict, dtype: str, progress=None,
) -> dict:  # fmt: skip
    """The adapter merged into the base's weights and written in `dtype` one tensor at a
    time (export.merge), never the whole model in float32; then checked like with like: the
    merged folder, loaded by plain transformers, against the adapter on its base, both as the
    pilot's evaluation holds and computes them, on the validation split. The gate: the share
    of predictions that are the adapter's; for generated answers the share of the adapter's
    answer tokens the merged model predicts the same from the same preceding tokens (one
    near-tie does not make the rest of an answer differ, as in the GGUF check), the answers
    reported. The last-token logits of four prompts are reported: a merged weight rounded
    to `dtype` moves logits by more than the fp32 tolerance."""
    import gc
    import json

    import torch
    from transformers import AutoModelForCausalLM

    say = progress or (lambda m: None)
    spec = pilot.spec
    held = base_dtype(spec, "eval")
    _, base, tok = load_base(pilot, resolved, use="eval")
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    protocol = make_protocol(spec, tok, prepared)
    records = prepared.splits["val"]
    prompts = [fmt.encode_prompt(r.text, prepared.answer_budget, r.context) for r in records]
    adapted = attach_adapter(base, adapter_dir)
    adapted.eval()
    say(f"the adapter on its base ({held}): {len(records)} validation examples")
    on_adapter = evaluate_records(
        adapted, tok, fmt, spec, records, protocol, progress=False, label="export (adapter)"
    )
    # generated answers: the adapter's own, fed back after each prompt to both models
    forced = []
    if protocol["mode"] == "generate":
        answers = [p.get("raw_output") or "" for p in on_adapter.predictions]
        refs = reference_answers(tok, answers, int(protocol.get("max_new_tokens") or 0))
        forced = [(p, r["ids"]) for p, r in zip(prompts, refs, strict=True)]
    before, adapter_next = _logits_and_next(adapted, prompts[:4], forced)
    del adapted, base
    gc.collect()
    adapter_cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    weights = merged_weights(resolved.path, adapter_w, adapter_cfg)
    checks: dict = {}

    def write(tmp: Path) -> dict:
        label = f"writing the merged weights ({dtype})"
        phase = Phase(label, len(weights), bar=False, log=plain_log(say))
        try:
            write_model_folder(resolved.path, tmp, weights, dtype, phase.advance)
        finally:
            phase.close()
        tok.save_pretrained(tmp)
        say(f"the merged model, loaded by transformers ({held}): the same examples")
        merged = AutoModelForCausalLM.from_pretrained(
            tmp, dtype=getattr(torch, held), use_safetensors=True, local_files_only=True,
            trust_remote_code=False,
        )  # fmt: skip
        merged.eval()
        after, merged_next = _logits_and_next(merged, prompts[:4], forced)
        on_merged = evaluate_records(
            merged, tok, fmt, spec, records, protocol, progress=False, label="export (merged)"
        )
        del merged
        gc.collect()
        same = sum(
            a["parsed"] == b["parsed"]
            for a, b in zip(on_adapter.predictions, on_merged.predictions, strict=True)
        )
        checks.update(
            merged_dtype=dtype,
            merge_max_logit_diff=max(
                (float((a - b).abs().max()) for a, b in zip(before, after, strict=True)),
                default=0.0,
            ),
            merge_agreement=same / max(len(records), 1),
            merge_agreement_precision=protocol["precision"],
            merge_agreement_examples=len(records),
            merge_agreement_min=MERGE_AGREEMENT_MIN,
            merge_weights_held=held,
        )
        if forced:
            pairs = [
                (x == y) for a, b in zip(adapter_next, merged_next, strict=True)
                for x, y in zip(a, b, strict=True)
            ]  # fmt: skip
            checks.update(
                merge_token_agreement=sum(pairs) / max(len(pairs), 1),
                merge_tokens_compared=len(pairs),
            )
        checks["merge_agreement_unit"] = "tokens" if forced else "examples"
        # what the rounding does to the pilot's own metrics (reported)
        checks["merge_metrics"] = {
            k: {"adapter": v, "merged": on_merged.metrics.get(k)}
            for k, v in on_adapter.metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "n"
        }
        rest = {k: v for k, v in checks.items() if k != "merge_max_logit_diff"}
        return _merged_manifest(
            train_id, manifest, max_diff=checks["merge_max_logit_diff"], tolerance=None, **rest
        )

    files = write_folder(out, write)
    gated = checks.get("merge_token_agreement", checks["merge_agreement"])
    ok = gated >= MERGE_AGREEMENT_MIN
    extra = {k: v for k, v in checks.items() if k != "merge_max_logit_diff"}
    result = _merged_result(out, train_id, files, checks["merge_max_logit_diff"], None, extra)
    result["ok"] = ok
    if not ok:
        what = (
            "of the adapter's answer tokens (each predicted from the same preceding ones)"
            if forced
            else "of the validation predictions"
        )
        raise CheckFailed(
            f"the merged model ({dtype}) agrees with the adapter on {gated:.1%} {what} "
            f"(< {MERGE_AGREEMENT_MIN:.0%}; the merged logits moved by up to "
            f"{checks['merge_max_logit_diff']:.2f}): rounding W + B@A to {dtype} lost part of "
            "the update. Merge in float16 or float32 (--merge-dtype), or serve the adapter "
            "unmerged",
            result,
        )
    return result


def _logits_and_next(model, prompts: list, forced: list) -> tuple[list, list[list[int]]]:
    """The last-token logits of `prompts`, and for each (prompt, answer) of `forced` the
    model's likeliest next token at every answer position and after it (teacher-forced)."""
    import torch

    device = next(model.parameters()).device
    nexts = []
    with torch.no_grad():
        logits = [_last_logits(model, p) for p in prompts]
        for prompt, answer in forced:
            ids = torch.tensor([prompt + answer], device=device)
            out = model(input_ids=ids).logits[0, len(prompt) - 1 :]
            nexts.append(out.argmax(-1).tolist())
    return logits, nexts


def _merge_image(pilot, train_id: str, adapter_dir: Path, manifest: dict, out: Path) -> dict:
    """LoRA folded into the classifier, the trained head in place; the folder written is read
    back from its files and must give the adapter's logits on the whole validation split."""
    import numpy as np

    from lorapilot.evaluate.image_predict import logits_of
    from lorapilot.modality import modality_of
    from lorapilot.modality.image_export import load_exported, merged_classifier, save_classifier

    modality = modality_of(pilot)
    problems = modality.adapter_problems(adapter_dir, manifest)  # before PEFT trips on them
    if not problems:
        loaded = modality.load(adapter_dir, manifest)
        problems = loaded.problems
        if loaded.resolved.weights_sha256 != manifest["base"]["sha256"]:
            problems.append(
                f"the base weights in {loaded.resolved.path} are not the ones the adapter was "
                "trained on"
            )
    if problems:
        raise CheckFailed("; ".join(problems) + "; not exported")
    data = modality.examples(loaded.prepared.splits["val"])  # type: ignore[attr-defined]
    adapted = loaded.model.float()
    before = logits_of(adapted, data, "fp32")
    merged = merged_classifier(adapted)
    labels = list(pilot.spec.task.labels or [])
    pipe = modality.pipeline  # type: ignore[attr-defined]
    kind = merged.kind
    checks = {
        "merge_agreement_examples": len(data),
        "loads_with": (
            "efficientnet_lite_pytorch EfficientNet.from_name('efficientnet-lite0', "
            f"num_classes={len(labels)}).load_state_dict(safetensors)"
            if kind == "efficientnet"
            else "transformers AutoModelForImageClassification.from_pretrained"
        ),
    }

    def write(tmp: Path) -> dict:
        """Save, read the folder back from its files alone and check it; a failed check
        raises here, before the rename, so a failed export leaves nothing at --out."""
        save_classifier(merged, tmp, labels, pipe, loaded.resolved.path)
        after = logits_of(load_exported(tmp, kind, len(labels)), data, "fp32")
        checks["max_logit_diff"] = float(np.abs(before - after).max()) if len(data) else 0.0
        agree = float((before.argmax(1) == after.argmax(1)).mean()) if len(data) else 1.0
        checks["merge_agreement"] = agree
        diff = checks["max_logit_diff"]
        if diff > MERGE_TOLERANCE or agree < 1.0:
            result = _merged_result(out, train_id, [], diff, MERGE_TOLERANCE, checks)
            raise CheckFailed(
                f"the exported model, read back, differs from the adapter by {diff:.2e} in "
                f"logits (tolerance {MERGE_TOLERANCE}) and agrees on {agree:.1%} of the "
                "validation predictions; not exported",
                result | {"ok": False},
            )
        return _merged_manifest(
            train_id, manifest, max_diff=diff, tolerance=MERGE_TOLERANCE, **checks
        )

    files = write_folder(out, write)
    diff = checks.pop("max_logit_diff")
    return _merged_result(out, train_id, files, diff, MERGE_TOLERANCE, checks)


def _merged_manifest(train_id: str, manifest: dict, *, max_diff=None, tolerance, **extra):
    return {
        "manifest_version": 1,
        "kind": "merged",
        "train_run": train_id,
        "base": manifest["base"],
        "base_identity": manifest.get("base_identity"),
        "adapter_manifest": {
            k: manifest.get(k) for k in ("data_version", "eval_protocol", "metrics", "method")
        },
        "merge_max_logit_diff": max_diff,
        "merge_tolerance": tolerance,
        **extra,
    }


def _merged_result(out: Path, train_id: str, files, max_diff, tolerance, extra) -> dict:
    return {
        "ok": True,
        "out": str(out),
        "train_run": train_id,
        "merged": True,
        "max_logit_diff": max_diff,
        "tolerance": tolerance,
        "files": sorted(files),
        **extra,
    }


def _last_logits(model, prompt: list[int]):
    import torch

    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([prompt], device=device)).logits[0, -1].float().cpu()


def _merge_quantized(pilot, base, tok, fmt, prompts: list, adapter_dir: Path, prepared):
    """Merge an adapter trained on a quantized base onto the *dequantized* weights it was
    trained against (not the original fp16/fp32 ones), and measure how often the merged
    model predicts what the adapter on the quantized base predicts, on the validation split.

    Like with like: a 4-bit layer computes in its compute dtype (bf16 on a CPU with fast
    bf16) around fp32 modules, which no cast of the merged model reproduces, so near-tied
    predictions flipped for the precision alone (0.981 on ticket-triage). The gate compares
    both in fp32 (the 4-bit layers computing in fp32: the exact dequantized weights); the
    agreement in the protocol's precision, as evaluation runs each model, is reported beside
    it (`merge_agreement_in_protocol_precision`, measured after the folder is written: that
    evaluation casts the merged model in place, and the folder holds it as merged).
    -> (merged, logits before, logits after, the checks, that later measurement or None)."""
    import torch

    spec = pilot.spec
    protocol = make_protocol(spec, tok, prepared)
    exact = {**protocol, "precision": "fp32"}
    records = prepared.splits["val"]
    adapted = attach_adapter(base, adapter_dir)
    four_bit = _four_bit_layers(adapted)
    kept = [m.compute_dtype for m in four_bit]
    for m in four_bit:
        m.compute_dtype = torch.float32
    with torch.no_grad():  # the logits compared with the merged model's, also in fp32
        before = [_last_logits(adapted, p) for p in prompts]
    on_quantized = evaluate_records(
        adapted, tok, fmt, spec, records, exact, progress=False,
        label="export (adapter on the quantized base, fp32)",
    )  # fmt: skip
    for m, dtype in zip(four_bit, kept, strict=True):
        m.compute_dtype = dtype
    as_evaluated = None
    if protocol["precision"] != "fp32":
        as_evaluated = evaluate_records(
            adapted, tok, fmt, spec, records, protocol, progress=False,
            label="export (adapter on the quantized base)",
        )  # fmt: skip
    # unload() takes the LoRA layers out again, leaving the quantized base; transformers'
    # dequantize() then replaces every bitsandbytes layer by a plain Linear holding exactly
    # the weights the 4-bit/8-bit matmul computed with, in the base's dtype.
    dequantized = adapted.unload().dequantize()
    merged = attach_adapter(dequantized, adapter_dir).merge_and_unload()
    merged.eval()
    with torch.no_grad():
        after = [_last_logits(merged, p) for p in prompts]
    on_merged = evaluate_records(
        merged, tok, fmt, spec, records, exact, progress=False, label="export (merged, fp32)"
    )

    def agreement(a: list[dict], b: list[dict]) -> float:
        same = sum(x["parsed"] == y["parsed"] for x, y in zip(a, b, strict=True))
        return same / max(len(records), 1)

    def in_protocol_precision() -> float:
        assert as_evaluated is not None
        merged_eval = evaluate_records(
            merged, tok, fmt, spec, records, protocol, progress=False, label="export (merged)"
        )
        return agreement(as_evaluated.predictions, merged_eval.predictions)

    checks = {
        "merge_agreement": agreement(on_quantized.predictions, on_merged.predictions),
        "merge_agreement_precision": "fp32",
        "merge_agreement_examples": len(records),
        "merge_agreement_min": MERGE_AGREEMENT_MIN,
        "merged_onto": "the dequantized weights the adapter was trained against "
        f"({describe(spec.model.quantization)}), in "
        + (spec.model.dtype if spec.model.dtype != "auto" else "float32"),
    }
    later = in_protocol_precision if as_evaluated is not None else None
    return merged, before, after, checks, later


def _four_bit_layers(model) -> list:
    """The bitsandbytes 4-bit linears: each dequantizes to its `compute_dtype` per product
    (8-bit layers compute in int8 whatever is asked: none to switch)."""
    import bitsandbytes as bnb

    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
