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


def write_adapter_manifest(adapter_dir: Path, *, base: dict, spec: dict, data_version: str, eval_protocol: dict,
                           metrics: dict, tokenizer_sha256: str, template_sha256: str, adapter_info: dict,
                           run_id: str) -> dict:
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
