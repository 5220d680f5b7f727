"""`lorapilot check`: the spec is valid (hypothesis, task, guards, limits) and its data source
is found (files exist and are readable, an HF dataset is cached), without loading the model
or reading records. A bad key exits 2 naming it (and the resolved path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lorapilot.base import chat_template
from lorapilot.base.models import load_tokenizer_of, resolve_base
from lorapilot.data.format import folds_system
from lorapilot.data.source import check_data_source
from lorapilot.data.summary import require_permission
from lorapilot.errors import UsageError
from lorapilot.sizing.memory import LORA_SHAPES, ModelShape
from lorapilot.spec import Pilot


def run_check(pilot: Pilot) -> dict[str, Any]:
    """The resolved spec, its hash and the data sources found."""
    s = pilot.spec
    require_permission(pilot)  # `data` would refuse to start without them: say it first
    folder = local_base(pilot)
    base = check_rank(pilot, folder)
    prompt = check_prompt_format(pilot, folder)
    return {
        "ok": True,
        "pilot": str(pilot.dir),
        "spec": str(pilot.spec_path),
        "name": s.name,
        "spec_hash": s.spec_hash(),
        "task": s.task.kind,
        "hypothesis": s.hypothesis.strip(),
        "success": s.success.model_dump() if s.success else None,
        "guards": [g.model_dump(exclude_none=True) for g in s.guards],
        "plan": {
            "variants": s.variant_names(),
            "seeds": s.selection.seeds,
            "train_runs": len(s.variant_names()) * s.selection.seeds,
        },
        "resolved": s.model_dump(mode="json"),
        "data_source": check_data_source(pilot),
        "base_shape": base,
        "prompt_format": prompt,
    }


def local_base(pilot: Pilot) -> Path | None:
    """A text pilot's base folder when it is on this machine (its weights not hashed), else
    None: a base not fetched yet is said by the steps that load it."""
    s = pilot.spec
    if s.task.modality == "image":
        return None
    try:
        return resolve_base(s.model.base, s.model.revision, root=pilot.dir, weights=False).path
    except (UsageError, OSError, ValueError):
        return None


def check_prompt_format(pilot: Pilot, folder: Path | None) -> dict | None:
    """A text pilot's prompt format, from its base's tokenizer when the base is on this
    machine: a template file that is missing or does not render, or a base without a chat
    template and a spec that sets none, exits 2 now rather than at the first prompt built.
    -> {chat_template, system_folded, warnings}, or None where the tokenizer is not here
    to read."""
    s = pilot.spec
    if s.task.modality == "image":
        return None
    where = str(pilot.spec_path)
    if s.model.chat_template not in (None, chat_template.PLAIN):  # the file is found now
        chat_template.read_template_file(s.model.chat_template, pilot.dir, where)
    if folder is None:
        return None
    try:
        tok = load_tokenizer_of(folder, s.model.trust_remote_code)
    except (OSError, ValueError):
        return None  # no tokenizer to read there: the steps that load it say so
    chat_template.apply(tok, s.model.chat_template, pilot.dir, where)
    if not getattr(tok, "chat_template", None):
        raise chat_template.missing(where)
    warning = chat_template.bos_warning(tok)
    return {
        "chat_template": s.model.chat_template or "base",
        "system_folded": folds_system(tok, s.task),
        "warnings": [warning] if warning else [],
    }


def check_rank(pilot: Pilot, folder: Path | None) -> dict | None:
    """A LoRA rank the base cannot take is refused now (exit 2), from the base's config.json
    alone: r must not exceed the smallest dimension of a module it adapts. -> the base's
    shape, or None where it cannot be read without loading it (an image base, a base not on
    this machine yet: later steps say so)."""
    s = pilot.spec
    if s.task.modality == "image" or s.adapter.method != "lora":
        return None
    if folder is None:
        return None
    try:
        shape = ModelShape.from_config(
            json.loads((folder / "config.json").read_text(encoding="utf-8"))
        )
    except (UsageError, OSError, ValueError):
        return None
    targets = s.adapter.target_modules
    dims = {
        m: min(f(shape))
        for m, f in LORA_SHAPES.items()
        if targets == "all-linear" or any(t == m or t.endswith("." + m) for t in targets)
    }
    if dims:
        module, smallest = min(dims.items(), key=lambda kv: kv[1])
        if s.adapter.r > smallest:
            raise UsageError(
                f"{pilot.spec_path}: adapter.r: {s.adapter.r} is larger than the smallest "
                f"dimension it adapts ({smallest}, {module} of {s.model.base}): a LoRA rank "
                f"cannot exceed it; use at most {smallest} (ranks of 8-64 are usual)"
            )
    return {"n_layers": shape.n_layers, "hidden": shape.hidden, "n_params": shape.n_params}
