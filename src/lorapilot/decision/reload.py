"""The fresh process of `verify`:
`python -m lorapilot.decision.reload PILOT_DIR ADAPTER_DIR OUT_DIR`.

It knows nothing of the train run but what is on disk: the adapter's manifest names the base
(sha256), tokenizer, chat template, data version and evaluation protocol it was trained with;
the base is resolved and hashed again, the adapter attached, the validation split evaluated
and the predictions written for the parent process to compare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorapilot.base.manifest import file_problems, read_manifest, weights_sha256
from lorapilot.base.models import quiet_transformers, resolve_base
from lorapilot.base.quantize import identity, identity_differences
from lorapilot.decision.rule import protocol_differences
from lorapilot.errors import LorapilotError
from lorapilot.evaluate.records import write_eval_files
from lorapilot.fsutil import atomic_write_json
from lorapilot.modality import modality_of
from lorapilot.records import environment
from lorapilot.spec import Pilot, PilotSpec
from lorapilot.spec.requirements import require_quantization as require


def pinned_base(pilot: Pilot, adapter_dir: Path, manifest: dict) -> tuple[Any, dict, list[str]]:
    """The adapter's files and the base it names, checked before anything is loaded: the
    base resolved and hashed again, its identity (quantization included) the trained one ->
    (the resolved base, what was compared, the problems; none: the adapter is on its base)."""
    problems = file_problems(adapter_dir, manifest)
    problems += modality_of(pilot).adapter_problems(adapter_dir, manifest)  # a head unsaved
    m = pilot.spec.model
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    base_sha = weights_sha256(resolved.path, m.allow_pickle)
    expected = manifest["base"]["sha256"]
    figures: dict[str, Any] = {
        "base_sha256": base_sha,
        "expected_base_sha256": expected,
        "base_path": str(resolved.path),
    }
    if base_sha != expected:
        return (
            resolved,
            figures,
            problems
            + [
                f"base weights in {resolved.path} have sha256 {base_sha}, but the adapter was "
                f"trained on {expected}"
            ],
        )
    # The exact base: the same weights, quantized the same way by the same bitsandbytes.
    trained = manifest.get("base_identity") or identity(expected, None)
    now = identity(base_sha, m.quantization)
    figures["base_identity"] = now
    differs = identity_differences(trained, now)
    problems += [f"the base is not the one the adapter was trained on: {d}" for d in differs]
    return resolved, figures, problems


def verify_child(pilot_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """What the fresh process does: pin checks, load base + adapter from disk, re-evaluate."""

    quiet_transformers()
    manifest = read_manifest(adapter_dir)
    spec = PilotSpec.model_validate(manifest["spec"])
    pilot = Pilot(Path(pilot_dir), Path(pilot_dir) / "pilot.yaml", spec, {})
    modality = modality_of(pilot)
    environment.apply_threads(spec.train.threads)
    resolved, result, problems = pinned_base(pilot, Path(adapter_dir), manifest)
    if problems:
        result.update(ok=False, refused=True, problems=problems)
        return result
    if spec.model.quantization is not None:
        require(spec.model.quantization, "the adapter's manifest")
    loaded = modality.load(Path(adapter_dir), manifest, resolved)
    problems += loaded.problems
    prepared = loaded.prepared
    if prepared.version != manifest["data_version"]:
        problems.append(
            f"data version {prepared.version} differs from the trained one "
            f"({manifest['data_version']})"
        )
    ev, protocol = loaded.evaluate(
        loaded.model, prepared.splits["val"], label="verify", progress=False, generation=False
    )  # the decided classifier (label scoring) is what a reload must reproduce
    if protocol["eval_protocol"] != manifest["eval_protocol"]["eval_protocol"]:
        keys = protocol_differences(manifest["eval_protocol"], protocol)
        problems.append(
            f"eval protocol {protocol['eval_protocol']} differs from "
            f"{manifest['eval_protocol']['eval_protocol']}"
            + (f" (trained vs now: {', '.join(keys)})" if keys else "")
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
        eval_peak_memory_bytes=ev.peak_memory_bytes,  # the fresh process: load + evaluation
    )
    return result


def _child_main(argv: list[str]) -> int:

    pilot_dir, adapter_dir, out_dir = (Path(a) for a in argv)
    try:
        res = verify_child(pilot_dir, adapter_dir, out_dir)
    except LorapilotError as e:
        res = {"ok": False, "refused": True, "problems": [str(e)], "exit_code": e.exit_code}
    atomic_write_json(out_dir / "verify_child.json", res)
    print(json.dumps({"ok": res.get("ok")}))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(_child_main(sys.argv[1:]))
