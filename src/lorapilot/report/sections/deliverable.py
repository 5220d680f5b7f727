"""The deliverable's formats: the adapter folder, and the merged and GGUF exports with the check
each passed (the merge's agreement with the adapter, the served model's agreement with
lorapilot's predictions in llama.cpp)."""

from __future__ import annotations

from typing import Any

from lorapilot.export.ollama import agreement_of
from lorapilot.report.blocks import Para, Sub, Table
from lorapilot.report.formatting import DASH, fmt, isnum, mark
from lorapilot.report.prompting import predict_flags, shown
from lorapilot.report.sections.model import _record
from lorapilot.report.sections.state import _get, _list


def _share(x: Any) -> str:
    return f"{100 * x:.1f}%" if isnum(x) else DASH


def _metrics_text(configs: Any) -> str:
    parts = []
    for c in configs if isinstance(configs, list) else []:
        for name, pair in (c.get("metrics") or {}).items():
            if isinstance(pair, dict):
                parts.append(
                    f"{c.get('name')}: {name} {fmt(pair.get('lorapilot'))} in lorapilot, "
                    f"{fmt(pair.get('llama_cpp'))} in llama.cpp"
                )
    return "; ".join(parts)


def _deliverable(s: dict) -> list:
    rows: list[list[Any]] = []
    adapter = (_record(s).get("result") or {}).get("adapter_path")
    if adapter:
        what = "the adapter and its manifest (base sha256, data, protocol)"
        rows.append(["peft", "deliverable/adapter", "verify (a fresh process)", "", "", what])
    notes: list = []
    for e in _list(s, "exports"):
        if not isinstance(e, dict):
            continue
        if e.get("format") == "gguf":
            check = e.get("serving_check") or {}
            agree = check.get("serving_agreement")
            minimum = check.get("serving_agreement_min")
            gate = "gated" if check.get("gated", True) else "reported, not gated"
            base = e.get("base_gguf") or {}
            rows.append([
                "gguf", e.get("folder"),
                f"llama.cpp: agreement {agreement_of(check)} ({gate}, minimum "
                f"{_share(minimum)})",
                mark(check.get("ok"), "passed", "FAILED"), _share(agree),
                f"base {base.get('type')}; {_metrics_text(check.get('configs'))}",
            ])  # fmt: skip
            for c in check.get("configs") or []:
                differing = c.get("differing") or []
                if differing:
                    ties = c.get("ties") or {}
                    tied = (
                        f" ({ties.get('near_ties')} of them near-ties within the runtimes' "
                        f"score noise, {fmt(ties.get('score_noise_max'))} nats)"
                        if ties
                        else ""
                    )
                    notes.append(
                        f"gguf {c.get('name')}: {c.get('n_differing')} example(s) predicted "
                        f"differently{tied}, e.g. "
                        + ", ".join(
                            f"{d.get('id')} (lorapilot {d.get('lorapilot')!r}, llama.cpp "
                            f"{d.get('llama_cpp')!r})"
                            for d in differing[:3]
                        )
                    )
            notes += [f"gguf: {p}" for p in check.get("problems") or []]
            script = (e.get("classifier") or {}).get("file")
            if script:
                notes.append(
                    f"gguf: {e.get('folder')}/{script} classifies as the pilot did (label "
                    "scoring in llama.cpp; the check above ran it)"
                )
            free = check.get("generation_agreement")
            if free is not None:
                notes.append(
                    f"gguf, generated as the Modelfile serves it (free greedy generation): "
                    f"{_share(free)} of the validation answers are the scored label, "
                    f"{_share(check.get('generation_label_rate'))} are a label"
                )
            held = check.get("constrained_agreement")
            grammar = check.get("grammar_file") or "labels.gbnf"
            if held is not None and check.get("constrained_label_rate") is not None:
                notes.append(
                    f"gguf, constrained by {grammar} (`llama-server --grammar-file`, greedy): "
                    f"{_share(held)} of the validation answers are the scored label, "
                    f"{_share(check.get('constrained_label_rate'))} are a label"
                )
            elif held is not None:
                notes.append(
                    f"gguf, constrained by {grammar} (`llama-server --grammar-file`, greedy): "
                    f"{_share(held)} of the validation answers are lorapilot's"
                )
            by_schema = check.get("schema_constrained_agreement")
            if by_schema is not None:
                notes.append(
                    f"gguf, constrained by {check.get('schema_file') or 'schema.json'} as "
                    "llama-cpp-python's server converts a response_format schema (greedy): "
                    f"{_share(by_schema)} of the validation answers are lorapilot's"
                )
        elif e.get("format") == "merged":
            agree = e.get("merge_agreement")
            diff = e.get("merge_max_logit_diff")
            rows.append([
                "merged", e.get("folder"),
                "merged model against the adapter: max logit difference "
                f"{fmt(diff)} (tolerance {fmt(e.get('merge_tolerance'))})",
                mark(True), _share(agree) if agree is not None else "", "loads without PEFT",
            ])  # fmt: skip
    if not rows:
        return [Para("nothing exported yet: `lorapilot run` fills deliverable/ (spec key "
                     "export.formats), `lorapilot export` writes one format"),
                *_prompt_instead(s)]  # fmt: skip
    out: list = [
        Table(["format", "folder", "check", "ok", "agreement", "notes"], rows),
    ]
    chosen = _get(s, "chosen", "id")
    if adapter and chosen:
        out.append(
            Para(
                "New inputs through this adapter, as the pilot evaluated it (its prompts, cut "
                f"and decoding; bound to its base): `lorapilot predict PILOT --run {chosen} "
                "--input FILE --out predictions.jsonl`"
            )
        )
    out += _prompt_instead(s)
    if notes:
        out += [Sub("Where the served model differs"), Para("; ".join(notes))]
    return out


def _prompt_instead(s: dict) -> list:
    """When the adapter did not clearly beat the few-shot prompt: how to run that prompt."""
    p = s.get("prompting")
    if not isinstance(p, dict) or p.get("adapter_beats_prompting") is not False:
        return []
    return [
        Para(
            f"The base shown {shown(p)} came within reach of the "
            "adapter (Decision, Against prompting); new inputs through that prompt: "
            f"`lorapilot predict PILOT {predict_flags(p)} --input FILE`"
        )
    ]
