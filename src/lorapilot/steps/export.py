"""`lorapilot export`: a merged model folder that plain transformers loads, checked against
the adapter on validation prompts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lorapilot import registry
from lorapilot.data.dataset import formatter_for, prepare_data
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.evaluate.runner import evaluate_records, make_protocol
from lorapilot.fsutil import atomic_write_json
from lorapilot.manifest import MANIFEST, adapter_files, read_manifest, weights_sha256
from lorapilot.models import attach_adapter, load_base, require_text
from lorapilot.quantize import describe, identity, identity_differences

MERGE_TOLERANCE = 1e-3
"""Max |logit| difference allowed between base+adapter and the merged model in fp32: merging
adds B@A*scale into W once instead of computing it per token, which reorders float sums."""


MERGE_AGREEMENT_MIN = 0.99
"""A merge of an adapter trained on a quantized base must give the same validation
predictions as the adapter on that base for at least this share of examples."""


def run_export(pilot, run_id: str | None, out: Path, merge: bool = True) -> dict:
    """A merged model folder (safetensors, config, tokenizer) that plain transformers loads,
    checked against the adapter: on validation prompts' logits, and for a quantized base on
    the validation split's predictions (`merge_agreement`)."""
    import torch

    require_text(pilot, "`export`")  # merging into an image model is not built yet
    if not merge:
        raise UsageError(
            "export writes a merged model; pass --merge (the adapter itself is in the train run)"
        )
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: exists and is not empty; choose a new folder")
    train_id, adapter_dir = registry.adapter_of(pilot.dir, run_id)
    manifest = read_manifest(adapter_dir)
    resolved, base, tok = load_base(pilot)
    if weights_sha256(resolved.path, pilot.spec.model.allow_pickle) != manifest["base"]["sha256"]:
        raise CheckFailed(
            f"the base weights in {resolved.path} are not the ones the adapter was trained on"
        )
    # The same test as verify's: weights, quantization and bitsandbytes version.
    trained = manifest.get("base_identity") or identity(manifest["base"]["sha256"], None)
    now = identity(manifest["base"]["sha256"], pilot.spec.model.quantization)
    differs = identity_differences(trained, now)
    if differs:
        raise CheckFailed(
            "the base is not the one the adapter was trained on: " + "; ".join(differs)
            + "; export with the spec it was trained with"
        )  # fmt: skip
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    prompts = [
        fmt.encode_prompt(r.text, prepared.answer_budget) for r in prepared.splits["val"][:4]
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
        merged, before, after, extra = _merge_quantized(
            pilot, base, tok, fmt, prompts, adapter_dir, prepared
        )
        tolerance = None  # logits are reported; the gate is the predictions' agreement
    max_diff = max(float((a - b).abs().max()) for a, b in zip(before, after, strict=True))
    files = _write_merged(out, merged, tok, {
        "manifest_version": 1,
        "kind": "merged",
        "train_run": train_id,
        "base": manifest["base"],
        "base_identity": manifest.get("base_identity"),
        "adapter_manifest": {
            k: manifest[k] for k in ("data_version", "eval_protocol", "metrics", "method")
        },
        "merge_max_logit_diff": max_diff,
        "merge_tolerance": tolerance,
        **extra,
    })  # fmt: skip
    if quantized:
        ok = extra["merge_agreement"] >= MERGE_AGREEMENT_MIN
    else:
        ok = max_diff <= MERGE_TOLERANCE
    result = {
        "ok": ok,
        "out": str(out),
        "train_run": train_id,
        "max_logit_diff": max_diff,
        "tolerance": tolerance,
        "files": sorted(files),
        **extra,
    }
    if not ok:
        why = (
            f"the merged model agrees with the adapter on {extra['merge_agreement']:.1%} of the "
            f"validation predictions (< {MERGE_AGREEMENT_MIN:.0%})"
            if quantized
            else f"merged model differs from base+adapter by {max_diff:.2e} > {MERGE_TOLERANCE}"
        )
        raise CheckFailed(why, result)
    return result


def _last_logits(model, prompt: list[int]):
    import torch

    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([prompt], device=device)).logits[0, -1].float().cpu()


def _merge_quantized(pilot, base, tok, fmt, prompts: list, adapter_dir: Path, prepared):
    """Merge an adapter trained on a quantized base onto the *dequantized* weights it was
    trained against (not the original fp16/fp32 ones), and measure how often the merged
    model predicts what the adapter on the quantized base predicts, on the validation split."""
    import torch

    spec = pilot.spec
    protocol = make_protocol(spec, tok, prepared)
    records = prepared.splits["val"]
    adapted = attach_adapter(base, adapter_dir)
    with torch.no_grad():
        before = [_last_logits(adapted, p) for p in prompts]
    on_quantized = evaluate_records(
        adapted,
        tok,
        fmt,
        spec,
        records,
        protocol,
        progress=False,
        label="export (adapter on the quantized base)",
    )
    # unload() takes the LoRA layers out again, leaving the quantized base; transformers'
    # dequantize() then replaces every bitsandbytes layer by a plain Linear holding exactly
    # the weights the 4-bit/8-bit matmul computed with, in the base's dtype.
    dequantized = adapted.unload().dequantize()
    merged = attach_adapter(dequantized, adapter_dir).merge_and_unload()
    merged.eval()
    with torch.no_grad():
        after = [_last_logits(merged, p) for p in prompts]
    on_merged = evaluate_records(
        merged, tok, fmt, spec, records, protocol, progress=False, label="export (merged)"
    )
    same = sum(
        a["parsed"] == b["parsed"]
        for a, b in zip(on_quantized.predictions, on_merged.predictions, strict=True)
    )
    agreement = same / max(len(records), 1)
    return (
        merged,
        before,
        after,
        {
            "merge_agreement": agreement,
            "merge_agreement_examples": len(records),
            "merge_agreement_min": MERGE_AGREEMENT_MIN,
            "merged_onto": "the dequantized weights the adapter was trained against "
            f"({describe(spec.model.quantization)}), in {spec.model.dtype}",
        },
    )


def _write_merged(out: Path, merged, tok, manifest: dict) -> dict:
    """Save the merged model, tokenizer and manifest into a temp folder, then rename it into
    place (a killed export leaves no half folder)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        files = adapter_files(tmp)
        atomic_write_json(tmp / MANIFEST, {**manifest, "files": files})
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files
