"""`lorapilot export`: a merged model folder that plain transformers loads, checked against
the adapter on validation prompts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lorapilot import registry
from lorapilot.data.dataset import formatter_for, prepare_data
from lorapilot.errors import CheckFailed, UsageError
from lorapilot.fsutil import atomic_write_json
from lorapilot.manifest import MANIFEST, adapter_files, read_manifest, weights_sha256
from lorapilot.models import attach_adapter, load_base

MERGE_TOLERANCE = 1e-3
"""Max |logit| difference allowed between base+adapter and the merged model in fp32: merging
adds B@A*scale into W once instead of computing it per token, which reorders float sums."""


def run_export(pilot, run_id: str | None, out: Path, merge: bool = True) -> dict:
    """A merged model folder (safetensors, config, tokenizer) that plain transformers loads,
    checked against the adapter on validation prompts."""

    import torch

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
    model = attach_adapter(base, adapter_dir).float()
    prepared = prepare_data(pilot, tok)
    fmt = formatter_for(pilot, tok)
    prompts = [
        fmt.encode_prompt(r.text, prepared.answer_budget) for r in prepared.splits["val"][:4]
    ]
    with torch.no_grad():
        before = [model(input_ids=torch.tensor([p])).logits[0, -1].clone() for p in prompts]
        merged = model.merge_and_unload()
        after = [merged(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts]
    max_diff = max(float((a - b).abs().max()) for a, b in zip(before, after, strict=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        files = adapter_files(tmp)
        atomic_write_json(
            tmp / MANIFEST,
            {
                "manifest_version": 1,
                "kind": "merged",
                "train_run": train_id,
                "base": manifest["base"],
                "adapter_manifest": {
                    k: manifest[k] for k in ("data_version", "eval_protocol", "metrics", "method")
                },
                "merge_max_logit_diff": max_diff,
                "merge_tolerance": MERGE_TOLERANCE,
                "files": files,
            },
        )
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    ok = max_diff <= MERGE_TOLERANCE
    result = {
        "ok": ok,
        "out": str(out),
        "train_run": train_id,
        "max_logit_diff": max_diff,
        "tolerance": MERGE_TOLERANCE,
        "files": sorted(files),
    }
    if not ok:
        raise CheckFailed(
            f"merged model differs from base+adapter by {max_diff:.2e} > {MERGE_TOLERANCE}", result
        )
    return result
