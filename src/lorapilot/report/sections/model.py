"""The base model with its revision and quantization, the adapter, the environment."""

from __future__ import annotations

from typing import Any

from lorapilot.report.blocks import (
    KV,
    NotRun,
    Para,
    Sub,
    Table,
)
from lorapilot.report.formatting import (
    fbytes,
    fraw,
    isnum,
    mark,
)
from lorapilot.report.sections.state import _dict, _get


def _record(s: dict) -> dict:
    rec = s.get("chosen_record")
    return rec if isinstance(rec, dict) else {}


def _base_model(s: dict) -> list:
    model = _dict(s, "model")
    base = _get(_record(s), "result", "base")
    spec_rows = [
        ("requested base", model.get("base")),
        ("requested revision", model.get("revision")),
        ("dtype", model.get("dtype")),
        ("trust_remote_code", model.get("trust_remote_code")),
        # the prompt format: the base's own chat template unless the spec sets one
        ("chat template", model.get("chat_template") or "the base's own"),
    ]
    if not isinstance(base, dict):
        return [
            KV(spec_rows),
            NotRun("the resolved base (path, revision, sha256) is recorded by a train run"),
        ]
    return [
        Para(f"the chosen run's base ({_record(s).get('id')})"),
        KV(
            [
                ("id", base.get("id")),
                ("path", base.get("path")),
                ("revision", base.get("revision")),
                ("weights sha256", base.get("sha256")),
                ("source", base.get("source")),
                *spec_rows[2:],
                *_quantization_rows(_get(_record(s), "result", "base_identity")),
            ]
        ),
        *_variant_bases(s),
    ]


def _variant_bases(s: dict) -> list:
    """Which base and quantization each variant's run used (a variant may change them: the
    base section above is the chosen run's)."""
    variants = [v for v in _get(s, "selection", "variants") or [] if isinstance(v, dict)]
    if len({(v.get("base"), v.get("quantization")) for v in variants}) <= 1:
        return []
    return [
        Sub("Each variant's base"),
        Table(
            ["variant", "train run", "base", "quantization"],
            [
                [v.get("name"), v.get("run_id"), v.get("base"), v.get("quantization")]
                for v in variants
            ],
        ),
    ]


def _quantization_rows(identity: Any) -> list[tuple[str, Any]]:
    """The exact base an adapter on a quantized base is bound to (verify checks all of it)."""
    q = identity.get("quantization") if isinstance(identity, dict) else None
    if not isinstance(q, dict):
        return [("quantization", "none (the base in its stored dtype)")]
    what = f"{q.get('bits')}-bit"
    if q.get("bits") == 4:
        what += (
            f" {q.get('type')}, double quantization {q.get('double_quant')}, compute "
            f"{q.get('compute_dtype')}, block {q.get('block_size')}"
        )
    return [
        ("quantization", what),
        ("bitsandbytes", identity.get("bitsandbytes")),
        ("adapter bound to", "these weights quantized this way: a reload must match all of it"),
    ]


def _adapter(s: dict) -> list:
    spec = _dict(s, "adapter")
    out: list = [
        Sub("Configuration"),
        KV(
            [
                (k, fraw(spec.get(k)))
                for k in ("method", "r", "alpha", "dropout", "target_modules", "modules_to_save")
                if k in spec
            ]
            or [("configuration", None)]
        ),
    ]
    res = _record(s).get("result") or {}
    info = res.get("adapter")
    if not isinstance(info, dict):
        return [
            *out,
            NotRun("trainable parameters and the update audit are recorded by a train run"),
        ]
    frac = info.get("trainable_fraction")
    if not isnum(frac) and isnum(info.get("trainable_params")) and info.get("total_params"):
        frac = info["trainable_params"] / info["total_params"]
    out += [
        Sub("Trainable parameters"),
        KV(
            [
                ("trainable parameters", info.get("trainable_params")),
                ("total parameters", info.get("total_params")),
                ("trainable share", f"{100 * frac:.3f}%" if isnum(frac) else None),
                ("adapted modules", len(info.get("target_modules") or [])),
                ("module types", info.get("target_module_types")),
                ("modules_to_save", info.get("modules_to_save") or None),
            ]
        ),
    ]
    audit = res.get("update_audit")
    out.append(Sub("Update audit"))
    if isinstance(audit, dict):
        out.append(
            KV(
                [
                    ("ok", mark(audit.get("ok"))),
                    ("optimizer steps", audit.get("steps")),
                    ("trainable tensors", audit.get("n_trainable")),
                    ("frozen tensors", audit.get("n_frozen")),
                    ("frozen tensors changed", len(audit.get("changed_frozen") or [])),
                    ("trainable tensors unchanged", len(audit.get("unchanged_trainable") or [])),
                    ("problems", audit.get("problems") or None),
                ]
            )
        )
    else:
        out.append(NotRun("no update audit in the chosen run's record"))
    return out


def _environment(s: dict) -> list:
    env = _record(s).get("environment")
    if not isinstance(env, dict) or not env:
        return [NotRun("the environment is recorded with the chosen train run")]
    libs = env.get("libraries") or {}
    devices = [
        f"{x.get('name')} ({fbytes(x.get('memory_bytes'))})" if isinstance(x, dict) else str(x)
        for x in env.get("devices") or []
    ]
    return [
        KV(
            [
                ("lorapilot", env.get("lorapilot")),
                ("git commit", env.get("git_commit")),
                ("python", env.get("python")),
                ("platform", env.get("platform")),
                *(
                    (lib, libs.get(lib) or env.get(lib))
                    for lib in ("torch", "transformers", "peft", "accelerate")
                ),
                ("accelerator", env.get("accelerator")),
                ("cuda", env.get("cuda")),
                ("hip", env.get("hip")),
                ("devices", devices or "none (CPU)"),
                ("cpu", env.get("cpu")),
                ("cpu count", env.get("cpu_count")),
                ("ram", fbytes(env.get("ram_bytes"))),
            ]
        )
    ]
