"""The deliverable: an adapter bound to its exact base, and its fresh-process verification.

`lorapilot.json` beside the PEFT files pins the base (id, path, revision, weights sha256),
the tokenizer and chat template, the spec, data version, eval protocol and the metrics at
save time, plus the sha256 of every adapter file, so a reload can prove it is the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot import __version__, environment
from lorapilot.fsutil import atomic_write_json, sha256_file

MANIFEST = "lorapilot.json"


def adapter_files(adapter_dir: Path) -> dict[str, str]:
    """sha256 of every weight/config file of the adapter (the manifest itself excluded)."""
    return {
        p.name: sha256_file(p)
        for p in sorted(Path(adapter_dir).iterdir())
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }


def write_adapter_manifest(
    adapter_dir: Path,
    *,
    base: dict,
    spec: dict,
    data_version: str,
    eval_protocol: dict,
    metrics: dict,
    tokenizer_sha256: str,
    template_sha256: str,
    adapter_info: dict,
    run_id: str,
) -> dict:
    env = environment.snapshot()
    manifest: dict[str, Any] = {
        "manifest_version": 1,
        "lorapilot": __version__,
        "run_id": run_id,
        "base": base,
        "tokenizer_sha256": tokenizer_sha256,
        "template_sha256": template_sha256,
        "method": adapter_info.get("method"),
        "adapter": {k: v for k, v in adapter_info.items() if k != "trainable_tensors"},
        "spec": spec,
        "data_version": data_version,
        "eval_protocol": eval_protocol,
        "metrics": metrics,
        "libraries": env["libraries"],
        "files": adapter_files(adapter_dir),
    }
    atomic_write_json(Path(adapter_dir) / MANIFEST, manifest)
    return manifest


# --------------------------------------------------------------------------- verify

METRIC_TOLERANCE = 1e-9
"""Metrics are computed from predictions; identical predictions give identical metrics, so
the only slack allowed is float summation order (none in practice)."""
SCORE_TOLERANCE = 1e-2
"""Label log-probabilities are reported, not gated: a fresh process on the same machine
computes them bit for bit, but a different thread count can reorder bf16 reductions."""


def read_manifest(adapter_dir: Path) -> dict:
    import json

    from lorapilot.errors import UsageError

    path = Path(adapter_dir) / MANIFEST
    if not path.is_file():
        raise UsageError(
            f"{path}: missing; this folder is not a lorapilot adapter (or its train run did not finish)"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None


def weights_sha256(model_dir: Path, allow_pickle: bool = False) -> str:
    """Hash the base weights as they are on disk now (never trusting a stored manifest)."""
    from lorapilot.models import _weights_of, combined_sha256

    _, files = _weights_of(Path(model_dir), allow_pickle, str(model_dir))
    return combined_sha256({n: sha256_file(Path(model_dir) / n) for n in files})


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_leaves(v, f"{prefix}{k}."))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.update(_leaves(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def metrics_equal(a: dict, b: dict, tol: float = METRIC_TOLERANCE) -> tuple[bool, list[str]]:
    """Same keys, numbers within `tol`, everything else equal -> (ok, differing keys)."""
    la, lb = _leaves(a), _leaves(b)
    diff = sorted(set(la) ^ set(lb))
    for k in set(la) & set(lb):
        x, y = la[k], lb[k]
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if abs(x - y) > tol:
                diff.append(k)
        elif x != y:
            diff.append(k)
    return not diff, sorted(diff)


def compare_predictions(first: list[dict], second: list[dict]) -> dict:
    """Per-example agreement of two evaluations of the same examples."""
    by_id = {r["id"]: r for r in second}
    mismatched, max_score_diff = [], 0.0
    for r in first:
        other = by_id.get(r["id"])
        if (
            other is None
            or other.get("parsed") != r.get("parsed")
            or other.get("raw_output") != r.get("raw_output")
        ):
            mismatched.append(r["id"])
        if other is not None and r.get("scores") and other.get("scores"):
            max_score_diff = max(
                max_score_diff, *(abs(r["scores"][k] - other["scores"][k]) for k in r["scores"])
            )
    missing = sorted(set(by_id) - {r["id"] for r in first})
    return {
        "n_mismatched_predictions": len(mismatched) + len(missing),
        "mismatched_ids": (mismatched + missing)[:50],
        "max_label_score_diff": max_score_diff,
    }


def verify_child(pilot_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """What the fresh process does: pin checks, load base + adapter from disk, re-evaluate."""
    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.data.format import template_hash, tokenizer_hash
    from lorapilot.evaluate.runner import evaluate_records, make_protocol
    from lorapilot.evaluate.stage import attach_adapter, quiet_transformers, write_eval_files
    from lorapilot.models import load_model, resolve_base
    from lorapilot.spec import Pilot, PilotSpec

    quiet_transformers()
    manifest = read_manifest(adapter_dir)
    problems: list[str] = []
    files_now = adapter_files(adapter_dir)
    for name, sha in manifest["files"].items():
        if files_now.get(name) != sha:
            problems.append(
                f"adapter file {name}: sha256 {files_now.get(name, 'missing')} != manifest {sha}"
            )
    spec = PilotSpec.model_validate(manifest["spec"])
    pilot = Pilot(Path(pilot_dir), Path(pilot_dir) / "pilot.yaml", spec, {})
    m = spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    base_sha = weights_sha256(resolved.path, m.allow_pickle)
    expected = manifest["base"]["sha256"]
    result: dict[str, Any] = {
        "base_sha256": base_sha,
        "expected_base_sha256": expected,
        "base_path": str(resolved.path),
    }
    if base_sha != expected:
        result.update(
            ok=False,
            refused=True,
            problems=problems
            + [
                f"base weights in {resolved.path} have sha256 {base_sha}, but the adapter was trained on {expected}"
            ],
        )
        return result
    if problems:
        result.update(ok=False, refused=True, problems=problems)
        return result
    model, tok = load_model(resolved, m.dtype, m.trust_remote_code)
    for what, now, then in (
        ("tokenizer", tokenizer_hash(tok), manifest["tokenizer_sha256"]),
        ("chat template", template_hash(tok, spec.task), manifest["template_sha256"]),
    ):
        if now != then:
            problems.append(f"{what} sha256 {now} differs from the one trained with ({then})")
    model = attach_adapter(model, Path(adapter_dir))
    prepared = prepare_data(pilot, tok)
    if prepared.version != manifest["data_version"]:
        problems.append(
            f"data version {prepared.version} differs from the trained one ({manifest['data_version']})"
        )
    protocol = make_protocol(spec, tok, prepared)
    if protocol["eval_protocol"] != manifest["eval_protocol"]["eval_protocol"]:
        from lorapilot.compare import protocol_differences

        keys = protocol_differences(manifest["eval_protocol"], protocol)
        problems.append(
            f"eval protocol {protocol['eval_protocol']} differs from {manifest['eval_protocol']['eval_protocol']}"
            + (f" (trained vs now: {', '.join(keys)})" if keys else "")
        )
    ev = evaluate_records(
        model,
        tok,
        formatter_for(pilot, tok),
        spec,
        prepared.splits["val"],
        protocol,
        progress=False,
        label="verify",
    )
    write_eval_files(out_dir, ev)
    result.update(
        ok=not problems,
        refused=False,
        problems=problems,
        metrics=ev.metrics,
        eval_protocol=protocol["eval_protocol"],
        data_version=prepared.version,
        seconds=round(ev.seconds, 3),
        device=ev.device,
    )
    return result


def _child_main(argv: list[str]) -> int:
    import json

    from lorapilot.errors import LorapilotError
    from lorapilot.fsutil import atomic_write_json

    pilot_dir, adapter_dir, out_dir = (Path(a) for a in argv)
    try:
        res = verify_child(pilot_dir, adapter_dir, out_dir)
    except LorapilotError as e:
        res = {"ok": False, "refused": True, "problems": [str(e)], "exit_code": e.exit_code}
    atomic_write_json(out_dir / "verify_child.json", res)
    print(json.dumps({"ok": res.get("ok")}))
    return 0


def run_verify(pilot, run_id: str | None = None, timeout: int = 3600) -> dict:
    """Re-evaluate a train run's adapter in a NEW Python process that only reads from disk,
    and compare with the train run's in-process evaluation."""
    import json
    import os
    import subprocess
    import sys

    from lorapilot import registry
    from lorapilot.errors import CheckFailed, LorapilotError
    from lorapilot.evaluate.stage import adapter_of
    from lorapilot.fsutil import read_jsonl

    train_id, adapter_dir = adapter_of(pilot, run_id)
    manifest = read_manifest(adapter_dir)
    train_dir = registry.runs_dir(pilot.dir) / train_id
    with registry.open_run(
        pilot.dir,
        "verify",
        parent=train_id,
        spec_hash=pilot.spec.spec_hash(),
        config=pilot.spec.model_dump(mode="json"),
        environment=environment.snapshot(),
    ) as run:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lorapilot.export",
                str(pilot.dir),
                str(adapter_dir),
                str(run.dir),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        child_path = run.dir / "verify_child.json"
        if proc.returncode != 0 or not child_path.is_file():
            raise LorapilotError(
                f"the verify process failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            )
        child = json.loads(child_path.read_text())
        run.record.data_version = child.get("data_version")
        out: dict[str, Any] = {
            "train_run": train_id,
            "adapter": str(adapter_dir),
            "base_sha256": child.get("base_sha256"),
            "expected_base_sha256": child.get("expected_base_sha256", manifest["base"]["sha256"]),
            "fresh_process_pid_differs": True,
            "device": child.get("device"),
            "problems": child.get("problems", []),
        }
        if child.get("refused"):
            out.update(ok=False, metrics_match=False, n_mismatched_predictions=None, metrics=None)
            run.update(**out)
            raise CheckFailed(
                "verify refused: " + "; ".join(out["problems"]), {"run_id": run.id, **out}
            )
        in_proc = json.loads((train_dir / "metrics.json").read_text())
        cmp = compare_predictions(
            read_jsonl(train_dir / "predictions.jsonl"), read_jsonl(run.dir / "predictions.jsonl")
        )
        match, differing = metrics_equal(in_proc, child["metrics"])
        ok = bool(child.get("ok")) and match and cmp["n_mismatched_predictions"] == 0
        out.update(
            ok=ok,
            metrics_match=match,
            metrics_differing=differing,
            metrics=child["metrics"],
            in_process_metrics=in_proc,
            eval_protocol=child.get("eval_protocol"),
            tolerance={
                "metrics": METRIC_TOLERANCE,
                "predictions": "identical",
                "label_scores_reported_not_gated": SCORE_TOLERANCE,
            },
            **cmp,
        )
        run.update(**out)
        if not ok:
            raise CheckFailed(
                f"verify mismatch: {cmp['n_mismatched_predictions']} prediction(s) differ, metrics match: {match}"
                + (f"; {'; '.join(out['problems'])}" if out["problems"] else ""),
                {"run_id": run.id, **out},
            )
    return {"run_id": run.id, "status": run.record.status, **out}


MERGE_TOLERANCE = 1e-3
"""Max |logit| difference allowed between base+adapter and the merged model in fp32: merging
adds B@A*scale into W once instead of computing it per token, which reorders float sums."""


def run_export(pilot, run_id: str | None, out: Path, merge: bool = True) -> dict:
    """A merged model folder (safetensors, config, tokenizer) that plain transformers loads,
    checked against the adapter on validation prompts."""
    import shutil
    import tempfile

    import torch

    from lorapilot.data.dataset import formatter_for, prepare_data
    from lorapilot.errors import CheckFailed, UsageError
    from lorapilot.evaluate.stage import adapter_of, attach_adapter, load_base

    if not merge:
        raise UsageError(
            "export writes a merged model; pass --merge (the adapter itself is in the train run)"
        )
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: exists and is not empty; choose a new folder")
    train_id, adapter_dir = adapter_of(pilot, run_id)
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


if __name__ == "__main__":
    import sys as _sys

    raise SystemExit(_child_main(_sys.argv[1:]))
