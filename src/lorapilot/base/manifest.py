"""The adapter manifest: an adapter bound to its exact base, and how two results are compared.

`lorapilot.json` beside the PEFT files pins the base (id, path, revision, weights sha256),
the tokenizer and chat template, the spec, data version, eval protocol and the metrics at
save time, plus the sha256 of every adapter file, so a reload can prove it is the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapilot import __version__
from lorapilot.fsutil import atomic_write_json, sha256_file
from lorapilot.records import environment

MANIFEST = "lorapilot.json"


def adapter_files(adapter_dir: Path) -> dict[str, str]:
    """sha256 of every weight/config file of the adapter (the manifest itself excluded)."""
    return {
        p.name: sha256_file(p)
        for p in sorted(Path(adapter_dir).iterdir())
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }


def file_problems(adapter_dir: Path, manifest: dict, *, unlisted: bool = False) -> list[str]:
    """Each file the manifest pins whose bytes are not the ones it recorded (empty: all are);
    `unlisted`: also each file in the folder that the manifest does not pin."""
    now = adapter_files(adapter_dir)
    problems = [
        f"adapter file {name}: sha256 {now.get(name, 'missing')} != manifest {sha}"
        for name, sha in manifest["files"].items()
        if now.get(name) != sha
    ]
    if unlisted:
        problems += [
            f"adapter file {n}: not in the manifest" for n in now if n not in manifest["files"]
        ]
    return problems


def write_adapter_manifest(
    adapter_dir: Path,
    *,
    base: dict,
    spec: dict,
    data_version: str,
    eval_protocol: dict,
    metrics: dict,
    adapter_info: dict,
    run_id: str,
    base_identity: dict | None = None,
    **input_hashes: str,
) -> dict:
    """`input_hashes`: what else the adapter's inputs are pinned by (text: tokenizer_sha256,
    template_sha256; images: transforms_sha256)."""
    env = environment.snapshot()
    manifest: dict[str, Any] = {
        "manifest_version": 1,
        "lorapilot": __version__,
        "run_id": run_id,
        "base": base,
        "base_identity": base_identity,
        "needs_quantization": (base_identity or {}).get("quantization"),
        **input_hashes,
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
            f"{path}: missing; this folder is not a lorapilot adapter (or its train run did not "
            "finish)"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None


def weights_sha256(model_dir: Path, allow_pickle: bool = False) -> str:
    """Hash the base weights as they are on disk now (never trusting a stored manifest)."""
    from lorapilot.base.models import _weights_of, combined_sha256

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
            both = r["scores"].keys() & other["scores"].keys()  # best-first scores some labels
            max_score_diff = max(
                max_score_diff, *(abs(r["scores"][k] - other["scores"][k]) for k in both)
            )
    missing = sorted(set(by_id) - {r["id"] for r in first})
    return {
        "n_mismatched_predictions": len(mismatched) + len(missing),
        "mismatched_ids": (mismatched + missing)[:50],
        "max_label_score_diff": max_score_diff,
    }
