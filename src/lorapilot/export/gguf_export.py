"""`lorapilot export --gguf`: the adapter for llama.cpp and Ollama, and the proof that the served
model answers what the evaluated one did.

The folder holds `base.gguf` (the GGUF the base was dequantized from, or one converted from
its safetensors), `adapter.gguf`, optionally `merged.gguf`, an Ollama `Modelfile`, for a
label-scoring classifier `classify.py` with `classifier.json` and the labels as a llama.cpp
grammar `labels.gbnf`, for an extraction its fields as a grammar `fields.gbnf` and a JSON
Schema `schema.json`, a README and `lorapilot.json` (every file's sha256, the base it is bound
to, the check). Converted files are written one tensor at a time (export.weights): an 8B base
is never held whole in float32. The serving check runs in a fresh
process that imports llama.cpp and no torch (`export.serving`): every validation prompt's
tokens compared, every example predicted with the pilot's rule, and the
predictions compared with the ones lorapilot made for the same adapter.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lorapilot.base.chat_template import FILE as CHAT_TEMPLATE_FILE
from lorapilot.base.manifest import MANIFEST, read_manifest, weights_sha256
from lorapilot.base.models import load_tokenizer, original_gguf
from lorapilot.base.quantize import require_trained_base
from lorapilot.data.dataset import formatter_for, max_length_of, prepare_data
from lorapilot.data.format import folds_system, render_messages
from lorapilot.errors import CheckFailed, LorapilotError, UsageError
from lorapilot.evaluate.metrics import CONTENT_FREE, calibration_offsets
from lorapilot.evaluate.runner import label_token_ids, score_predictions, stop_token_ids
from lorapilot.evaluate.served import (
    gbnf_choice,
    gbnf_label_set,
    generation_figures,
    generation_warning,
)
from lorapilot.export import classify as classify_module
from lorapilot.export import gguf_files as gf
from lorapilot.export import ollama
from lorapilot.export import weights as wt
from lorapilot.export.folder import write_folder
from lorapilot.export.merge import merged_weights
from lorapilot.export.serving import (
    CLASSIFY_FILE,
    FIELDS_GRAMMAR_FILE,
    GRAMMAR_FILE,
    PROGRESS,
    SCHEMA_FILE,
)
from lorapilot.export.target_grammar import gbnf_of, json_schema_of
from lorapilot.export.weights import Weights, read_safetensors
from lorapilot.fsutil import atomic_write_json, read_jsonl, sha256_file
from lorapilot.records import registry
from lorapilot.records.progress import Phase, plain_log
from lorapilot.spec.requirements import require_serving

BASE_FILE, ADAPTER_FILE, MERGED_FILE = "base.gguf", "adapter.gguf", "merged.gguf"
GATED_TYPES = ("original", "f32", "f16")
"""Base files that hold the trained-on weights (or a rounding of them no coarser than f16):
the agreement gates. A q8_0 base is quantized further than the one trained on: reported. For
an adapter trained on a 4-bit/8-bit base, f32 and f16 are written from its dequantized weights
(the trained-on ones) and gate; the original GGUF is not those weights: reported."""
PROBE_TEXT = (
    "Hello world! 3.14159 + 2,718 = 5.86 ... ¿Qué tal? Ünïcödé — 日本語 \t tabs  and   spaces\n"
    "new line {\"json\": [1, 2, null]} <tag> don't it's CAPS camelCase snake_case 12345678"
)
Progress = Callable[[str], None]


def refuse_images(pilot) -> None:
    if pilot.spec.task.modality == "image":
        raise UsageError(
            f"{pilot.spec_path}: task.modality is image; --gguf exports text models for "
            "llama.cpp (an image pilot exports its adapter, or --merge for a model folder)"
        )


def _refuse_unsupported(pilot, manifest: dict) -> None:
    refuse_images(pilot)
    if manifest.get("method") != "lora":
        raise UsageError(
            f"--gguf: the train run is a {manifest.get('method')} fine-tune, not a LoRA adapter; "
            "export its weights without --gguf and convert them with llama.cpp's "
            "convert_hf_to_gguf.py"
        )


def _base_type(
    requested: str, original: Path | None, source: dict, quantized: dict | None = None
) -> str:
    if requested == "auto":  # a quantized base's weights are not the original GGUF's
        return "original" if original is not None and not quantized else "f16"
    if requested == "original" and original is None:
        why = (
            f"{source.get('gguf_file')} (from {source.get('package')} {source.get('version')}) "
            "is not installed with the sha256 the base was built from"
            if source.get("gguf_sha256")
            else "the base was not built from a GGUF"
        )
        raise UsageError(f"--gguf-base original: {why}; use --gguf-base f16 or q8_0")
    return requested


def export_gguf(
    pilot,
    train_id: str,
    adapter_dir: Path,
    out: Path,
    *,
    base_type: str | None = None,
    merge: bool = False,
    min_agreement: float | None = None,
    reference: str | None = None,
    progress: Progress | None = None,
) -> dict:
    """Write the GGUF folder at `out` (atomically, its check recorded in it), then raise
    CheckFailed if the served predictions agree with lorapilot's less than the minimum."""
    say = progress or (lambda m: None)
    manifest = read_manifest(adapter_dir)
    _refuse_unsupported(pilot, manifest)
    require_serving("--gguf")
    spec = pilot.spec
    resolved, tok = load_tokenizer(pilot)
    if weights_sha256(resolved.path, spec.model.allow_pickle) != manifest["base"]["sha256"]:
        raise CheckFailed(
            f"the base weights in {resolved.path} are not the ones the adapter was trained on"
        )
    config = json.loads((resolved.path / "config.json").read_text(encoding="utf-8"))
    arch = gf.gguf_architecture(config, str(resolved.path / "config.json"))
    adapter_cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    adapter_w = read_safetensors(adapter_dir / "adapter_model.safetensors")
    alpha, lora = gf.lora_tensors(adapter_w, adapter_cfg, config, str(adapter_dir))
    original, source = original_gguf(resolved.path)
    quantized = require_trained_base(manifest, spec.model.quantization)
    kind = _base_type(base_type or spec.export.gguf_base, original, source, quantized)
    trained_on = kind in GATED_TYPES and not (quantized and kind == "original")
    minimum = spec.export.min_agreement if min_agreement is None else min_agreement
    ref = reference or spec.export.reference
    cases = _cases(pilot, tok, manifest, train_id, adapter_dir, ref, say)
    messages = render_messages(spec.task, "{text}", fold_system=folds_system(tok, spec.task))
    system = next((m["content"] for m in messages if m["role"] == "system"), None)
    user = next(m["content"] for m in messages if m["role"] == "user")
    template = ollama.template_for(spec.model.chat_template, getattr(tok, "chat_template", None))
    stops = sorted({tok.decode([i]) for i in cases["stop_ids"]})
    name = f"{spec.name} {train_id}"
    # the served context: room for the longest input the pilot allows, not only val's
    n_ctx = max(cases["n_ctx"], _ctx(max_length_of(pilot, tok) + 16))
    classifier, classifier_note = classifier_config(pilot, tok, cases)
    cases["classifier"] = classifier is not None
    # the answers as a grammar, for a server that constrains them: the labels of a scored
    # classification; an extraction's fields (and their JSON Schema, for Ollama's `format`)
    grammar_file, grammar, schema = _grammar_of(spec)
    cases["grammar"], cases["grammar_file"] = grammar is not None, grammar_file
    cases["schema_file"] = SCHEMA_FILE if schema is not None else None

    def write(tmp: Path) -> dict:
        say(f"writing {ADAPTER_FILE} ({len(lora) // 2} LoRA pairs, alpha {alpha:g})")
        gf.write_adapter_gguf(tmp / ADAPTER_FILE, arch, alpha, lora, name)
        base_note = _write_models(
            tmp, pilot, resolved, kind, original, config, tok, say, quantized,
            (adapter_w, adapter_cfg) if merge else None, name,
        )  # fmt: skip
        if classifier is not None:  # label scoring as the pilot scores, for llama.cpp
            shutil.copyfile(classify_module.__file__, tmp / CLASSIFY_FILE)
            atomic_write_json(tmp / classify_module.CONFIG, classifier | {"train_run": train_id})
        if grammar is not None:
            (tmp / grammar_file).write_text(grammar, encoding="utf-8")
        if spec.model.chat_template:  # the pilot's prompt format, for llama.cpp's --jinja
            (tmp / CHAT_TEMPLATE_FILE).write_text(tok.chat_template, encoding="utf-8")
        if schema is not None:
            atomic_write_json(tmp / SCHEMA_FILE, schema)
        header = f"written by lorapilot export --gguf: pilot {spec.name}, train run {train_id}"
        mf = dict(template=template, system=system, stops=stops, num_ctx=n_ctx, header=header)
        (tmp / "Modelfile").write_text(
            ollama.modelfile(model_file=BASE_FILE, adapter_file=ADAPTER_FILE, **mf)
        )
        if merge:
            (tmp / "Modelfile.merged").write_text(
                ollama.modelfile(model_file=MERGED_FILE, adapter_file=None, **mf)
            )
        configs = _served(merge)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        say(f"serving check: {len(cases['records'])} validation examples in llama.cpp")
        check = serving_check(pilot, tmp, files, configs, cases, minimum, trained_on, say=say)
        matches = None
        if template is not None and cases["records"]:
            first = cases["records"][0].text
            pilot_prompt = cases["prompt_text_of_first"]
            if tok.bos_token and template == ollama.PLAIN:  # llama.cpp adds it itself
                pilot_prompt = pilot_prompt.removeprefix(tok.bos_token)
            matches = (
                ollama.prompt_of(template, system, user.replace("{text}", first)) == pilot_prompt
            )
        check["modelfile_prompt_matches"] = matches
        (tmp / "README.md").write_text(
            ollama.readme(
                pilot=spec.name, train_run=train_id, base_file=BASE_FILE, base_note=base_note,
                adapter_file=ADAPTER_FILE, merged_file=MERGED_FILE if merge else None,
                system=system, user_template=user, check=check,
                classifier=CLASSIFY_FILE if classifier is not None else None,
                grammar=grammar_file if grammar is not None else None,
                schema=SCHEMA_FILE if schema is not None else None,
                label_sets=spec.task.multi_label,
                chat_template=CHAT_TEMPLATE_FILE if spec.model.chat_template else None,
                ollama_template=template is not None,
                base_has_template=kind != "original",
            )
        )  # fmt: skip
        return {
            "manifest_version": 1,
            "kind": "gguf",
            "pilot": spec.name,
            "train_run": train_id,
            "base": manifest["base"],
            "base_identity": manifest.get("base_identity"),
            "base_gguf": {
                "file": BASE_FILE,
                "type": kind,
                "note": base_note,
                "original": source if kind == "original" else None,
                # whether it holds the weights the adapter was trained on: the gate's condition
                "trained_on": trained_on,
                "quantization": quantized,
            },
            "adapter_gguf": {"file": ADAPTER_FILE, "alpha": alpha, "pairs": len(lora) // 2},
            "merged_gguf": {"file": MERGED_FILE, "type": _merged_type(kind)} if merge else None,
            "classifier": {
                "file": CLASSIFY_FILE if classifier is not None else None,
                "note": classifier_note,
            },
            "grammar": {"file": grammar_file} if grammar is not None else None,
            "schema": {"file": SCHEMA_FILE} if schema is not None else None,
            "architecture": arch,
            "adapter_manifest": {
                k: manifest.get(k) for k in ("data_version", "eval_protocol", "method")
            },
            "serving_check": check,
        }

    say(f"exporting to {out}")
    t0 = time.perf_counter()
    files = write_folder(out, write)
    written = read_manifest(out)
    check = written["serving_check"]
    result = {
        "ok": bool(check["ok"]),
        "out": str(out),
        "train_run": train_id,
        "format": "gguf",
        "files": sorted([*files, MANIFEST]),
        "sha256": files,
        "base_gguf": written["base_gguf"],
        "merged": merge,
        "seconds": round(time.perf_counter() - t0, 1),
        **check,
    }
    if not check["ok"]:
        raise CheckFailed(_why(check), result)
    return result


def recheck(
    pilot,
    folder: Path,
    min_agreement: float | None = None,
    reference: str | None = None,
    progress: Progress | None = None,
) -> dict:
    """The serving check again on an exported folder: its files re-hashed against its
    manifest (a changed byte: exit 1 naming the file), its validation predictions again."""
    require_serving("--check")
    folder = Path(folder).resolve()
    written = read_manifest(folder)
    if written.get("kind") != "gguf":
        raise UsageError(f"--check {folder}: not a GGUF export folder (its {MANIFEST} says so)")
    train_id = written["train_run"]
    _, adapter_dir = registry.adapter_of(pilot.dir, train_id)
    manifest = read_manifest(adapter_dir)
    _, tok = load_tokenizer(pilot)
    ref = reference or pilot.spec.export.reference
    cases = _cases(pilot, tok, manifest, train_id, adapter_dir, ref, lambda m: None)
    cases["classifier"] = CLASSIFY_FILE in written["files"]
    # a grammar: not in exports before it was written
    cases["grammar_file"] = (written.get("grammar") or {}).get("file", GRAMMAR_FILE)
    cases["grammar"] = cases["grammar_file"] in written["files"]
    cases["schema_file"] = SCHEMA_FILE if SCHEMA_FILE in written["files"] else None
    configs = _served(bool(written.get("merged_gguf")))
    minimum = pilot.spec.export.min_agreement if min_agreement is None else min_agreement
    base_gguf = written["base_gguf"]
    gated = base_gguf.get("trained_on", base_gguf["type"] in GATED_TYPES)
    check = serving_check(
        pilot, folder, written["files"], configs, cases, minimum, gated, say=progress
    )
    result = {"ok": bool(check["ok"]), "out": str(folder), "train_run": train_id, **check}
    if not check["ok"]:
        raise CheckFailed(_why(check), result)
    return result


def _grammar_of(spec) -> tuple[str, str | None, dict | None]:
    """(file name, GBNF text, JSON Schema) of the answers a server may constrain to: a
    classification's labels (scored or generated; a multi-label one's lists of them), an
    extraction's fields."""
    if spec.task.kind == "classification" and spec.task.labels:
        return GRAMMAR_FILE, gbnf_choice(list(spec.task.labels)), None
    if spec.task.multi_label:  # one or more labels, in task.labels order
        return GRAMMAR_FILE, gbnf_label_set(list(spec.task.labels or [])), None
    return FIELDS_GRAMMAR_FILE, gbnf_of(spec.task), json_schema_of(spec.task)


def _served(merged: bool) -> list[dict]:
    """The configurations the check serves: base + adapter, and the merged model if written."""
    configs = [{"name": "base+adapter", "model": BASE_FILE, "lora": ADAPTER_FILE}]
    if merged:
        configs.append({"name": "merged", "model": MERGED_FILE, "lora": None})
    return configs


def _ctx(tokens: int) -> int:
    """A llama.cpp context for `tokens`, rounded up to a multiple of 64."""
    return -(-tokens // 64) * 64


def _main_metric(spec) -> str | None:
    return spec.selection.metric or (spec.success.metric if spec.success else None)


def _why(check: dict) -> str:
    if check.get("problems"):
        return "serving check refused: " + "; ".join(check["problems"])
    ref = check.get("reference") or {}
    against = (
        f"the recorded {ref.get('precision')} predictions"
        if ref.get("kind") == "recorded"
        else "the adapter's fp32 predictions"
    )
    metrics = "; ".join(
        f"{k} {v['lorapilot']:.3f} in lorapilot, {v['llama_cpp']:.3f} in llama.cpp"
        for c in check.get("configs") or []
        for k, v in (c.get("metrics") or {}).items()
        if isinstance(v.get("lorapilot"), int | float)
    )
    hint = ""
    if ref.get("kind") == "recorded" and ref.get("precision") != "fp32":
        hint = (
            "; a bf16 evaluation alone flips close predictions: --reference fp32 compares with "
            "the adapter's exact arithmetic, and --gguf-base f32 serves the exact weights"
        )
    unit = (
        "of its output tokens on the validation split (each predicted from the same preceding "
        "tokens)"
        if check.get("agreement_unit") == "tokens"
        else "of the validation examples (near-ties within the score noise agreeing)"
        if ollama.near_ties_of(check)
        else "of the validation examples"
    )
    free = check.get("generation_agreement")
    generated = (
        f"; generated freely as the Modelfile serves it, {free:.1%} of the answers are the "
        "scored label (the folder's README.md)"
        if free is not None
        else ""
    )
    held = check.get("constrained_agreement")
    if held is not None:
        generated += f"; constrained by {check.get('grammar_file', GRAMMAR_FILE)}, {held:.1%}"
    ties = "".join(
        f"; {c['name']}: {c['n_differing'] - t['near_ties']} of {c['n_differing']} differing "
        f"examples beyond the runtimes' score noise ({t['score_noise_max']:.3f} nats)"
        for c in check.get("configs") or []
        if (t := c.get("ties"))
    )
    return (
        f"llama.cpp agrees with {against} on {check['serving_agreement']:.1%} {unit} "
        f"(< {check['serving_agreement_min']:.0%}){ties}; {metrics}{hint}{generated}"
    )


# --- the base file -------------------------------------------------------------------------


def _write_models(
    tmp: Path, pilot, resolved, kind: str, original, config: dict, tok, say: Progress,
    quantized: dict | None, merge: tuple[dict, dict] | None, name: str,
) -> str:  # fmt: skip
    """base.gguf, and with `merge` (the adapter's weights and config) merged.gguf; the note
    on the base. A 4-bit/8-bit base is loaded here to be dequantized (the weights its matmuls
    computed with; the GGUF it came from is not them), and let go on return, before llama.cpp
    loads the files."""
    weights = (
        _dequantized_weights(pilot, resolved, say)
        if quantized and (kind != "original" or merge)
        else None
    )
    # the pilot's own prompt format goes into every file written here (a copied original
    # keeps the base's: the README passes chat_template.jinja to llama.cpp)
    own = tok.chat_template if pilot.spec.model.chat_template else None
    base_note = _write_base(
        tmp / BASE_FILE, kind, original, resolved.path, config, tok, say, weights, quantized, own
    )
    if merge:
        say(f"writing {MERGED_FILE} (the adapter merged in, {_merged_type(kind)})")
        merged = merged_weights(resolved.path, *merge, weights)
        tensors = gf.model_tensors(merged, config, str(resolved.path))
        pre = _pre_of(tmp / BASE_FILE) if original is None else None
        _write_model(
            tmp / MERGED_FILE, tensors, _merged_type(kind), original, resolved.path, pre, name,
            say, own,
        )  # fmt: skip
    return base_note


def _merged_type(kind: str) -> str:
    """A merged model cannot be quantized to the original's type without losing the update."""
    return "f16" if kind == "original" else kind


def _write_base(
    dest: Path,
    kind: str,
    original: Path | None,
    folder: Path,
    config: dict,
    tok,
    say: Progress,
    weights: Weights | None = None,
    quantized: dict | None = None,
    chat_template: str | None = None,
) -> str:
    """base.gguf, and what it holds. `weights`: the dequantized weights of a `quantized` base
    (the trained-on ones), else the folder's safetensors are; `chat_template`: the pilot's
    own, written into a converted file (a copied original keeps the base's)."""
    if kind == "original":
        assert original is not None
        say(f"copying {original.name} (the GGUF the base was dequantized from)")
        shutil.copyfile(original, dest)
        if quantized:
            return (
                f"{original.name}, the GGUF the base was dequantized from; not the weights the "
                f"adapter was trained on ({_quant_text(quantized)} of them): reported, not gated"
            )
        return f"{original.name}, the GGUF the trained-on weights were dequantized from"
    source = "the safetensors"
    if weights is None:
        weights = wt.of_folder(folder)
    else:
        source = f"the {_quant_text(quantized)} weights dequantized"
    what = f"{kind}, converted from the trained-on weights ({source})"
    tensors = gf.model_tensors(weights, config, str(folder))
    if original is not None:
        say(f"writing {BASE_FILE} as {kind} from {source}, metadata from {original.name}")
        _write_model(dest, tensors, kind, original, folder, None, None, say, chat_template)
        return f"{what}; metadata of {original.name}"
    pre = choose_pre_tokenizer(folder, config, tok, say)
    say(f"writing {BASE_FILE} as {kind} from {source} (pre-tokenizer {pre})")
    name = config.get("_name_or_path") or folder.name
    _write_model(dest, tensors, kind, None, folder, pre, name, say, chat_template)
    return f"{what} (pre-tokenizer {pre})"


def _write_model(
    dest: Path, tensors: list, kind: str, original: Path | None, folder: Path,
    pre: str | None, name: str | None, say: Progress, chat_template: str | None = None,
) -> None:  # fmt: skip
    """One GGUF model file (base or merged): `original`'s metadata where the base has its own
    GGUF, else converted from the folder with llama.cpp pre-tokenizer `pre`, the pilot's
    `chat_template` in either; its tensors written as a phase (a line every 30 s and at the
    end: an 8B base takes minutes)."""
    phase = Phase(f"writing {dest.name}", len(tensors), bar=False, log=plain_log(say))
    try:
        if original is not None:
            gf.rewrite_gguf(original, tensors, dest, kind, phase.advance, chat_template)
        else:
            assert pre is not None and name is not None
            gf.convert_hf(folder, tensors, dest, kind, pre, name, phase.advance, chat_template)
    finally:
        phase.close()


def _quant_text(q: dict | None) -> str:
    q = q or {}
    return f"{q.get('bits')}-bit{' ' + q['type'] if q.get('type') else ''}"


def _dequantized_weights(pilot, resolved, say: Progress) -> Weights:
    """A quantized base's weights as its matmuls computed with: loaded quantized as the adapter
    was trained on it, each quantized linear dequantized by transformers' own function (what its
    `dequantize()`, and so `export --merge`, does) when its tensor is written, every other
    tensor as loaded; float32. One dequantized tensor is held at a time, not the model."""
    import torch
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    from lorapilot.base.models import load_base

    say("loading the quantized base: the weights the adapter was trained on, dequantized")
    _, model, _ = load_base(pilot, resolved, use="exact")
    state = model.state_dict(keep_vars=True)

    def exact(key: str, stored) -> np.ndarray:
        module_name, _, leaf = key.rpartition(".")
        module = model.get_submodule(module_name) if module_name else model
        if leaf == "weight" and type(module.weight).__name__ in ("Params4bit", "Int8Params"):
            with torch.no_grad():
                t = dequantize_bnb_weight(module.weight, getattr(module, "state", None))
            return t.float().cpu().numpy()
        if key in state:
            return state[key].detach().float().cpu().numpy()
        return stored()  # a tensor the loaded model does not hold: the file's

    return wt.of_folder(resolved.path).replaced(exact)


def _pre_of(gguf_path: Path) -> str:
    return str(gf.read_metadata(gguf_path).get("tokenizer.ggml.pre", "default"))


def choose_pre_tokenizer(folder: Path, config: dict, tok, say: Progress) -> str:
    """llama.cpp's pre-tokenizer for a converted tokenizer: the first of gf.PRE_TOKENIZERS under
    which llama.cpp tokenizes the probe text as the base's own tokenizer does (the serving
    check then compares every validation prompt too)."""
    from llama_cpp import Llama

    want = tok(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    with tempfile.TemporaryDirectory(prefix="lorapilot-vocab-") as d:
        for pre in gf.PRE_TOKENIZERS:
            path = Path(d) / f"vocab-{pre}.gguf"
            gf.convert_hf(folder, [], path, "f32", pre, "vocab")
            try:
                llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
            except Exception:  # noqa: BLE001 - a name this llama.cpp does not know
                continue
            got = llm.tokenize(PROBE_TEXT.encode(), add_bos=False, special=True)
            del llm
            if got == want:
                say(f"llama.cpp tokenizes like the base with pre-tokenizer {pre!r}")
                return pre
    raise CheckFailed(
        f"{folder / 'tokenizer.json'}: under none of llama.cpp's pre-tokenizers tried "
        f"({', '.join(gf.PRE_TOKENIZERS)}) does llama.cpp tokenize text as this base does; "
        "convert the base with llama.cpp's convert_hf_to_gguf.py and pass it with --gguf-base"
    )


# --- the check -----------------------------------------------------------------------------


def _fp32_predictions(
    pilot, tok, fmt, adapter_dir: Path, protocol: dict, records, say: Progress | None = None
):
    """lorapilot's predictions of the adapter in fp32: its exact arithmetic, free of the
    bf16 rounding a recorded evaluation may carry (which alone flips close generations)."""
    from lorapilot.base.models import attach_adapter, load_base
    from lorapilot.evaluate.runner import evaluate_records

    _, base, _ = load_base(pilot, use="exact")
    model = attach_adapter(base, adapter_dir)
    proto = {**protocol, "precision": "fp32"}
    return evaluate_records(
        model, tok, fmt, pilot.spec, records, proto, label="reference (fp32)",
        log=plain_log(say or (lambda m: None), bar_shown=sys.stderr.isatty()),
    )  # fmt: skip


def _cases(
    pilot, tok, manifest: dict, train_id: str, adapter_dir: Path, reference: str, say: Progress
) -> dict:
    """The validation prompts exactly as lorapilot evaluated them, and its predictions: the
    ones the train run recorded, or (`reference` fp32) the adapter evaluated again in fp32."""
    spec = pilot.spec
    prepared = prepare_data(pilot, tok)
    if prepared.version != manifest["data_version"]:
        raise CheckFailed(
            f"data version {prepared.version} differs from the one the adapter was trained and "
            f"evaluated on ({manifest['data_version']}); the check compares the same examples"
        )
    fmt = formatter_for(pilot, tok)
    protocol = manifest["eval_protocol"]
    budget = protocol["answer_budget"]
    records = prepared.splits["val"]
    prompts = [fmt.encode_prompt(r.text, budget, r.context) for r in records]
    texts = [tok.decode(p) for p in prompts]
    mode = protocol["mode"]
    labels = label_token_ids(fmt, spec.task, budget) if mode == "score" else []
    stop = stop_token_ids(tok, fmt)
    max_new = protocol.get("max_new_tokens") or 0
    longest = max((len(p) for p in prompts), default=1)
    # a scored label is also generated freely, as the Modelfile serves it: room for the
    # longest label and a few tokens more, enough to show an answer that is not a label
    label_max_new = max((len(x) for x in labels), default=0) + 8 if mode == "score" else 0
    # constrained to the labels: any token spells at least one byte of a label, then the end
    longest_label = max((len(lab.encode()) for lab in spec.task.labels or []), default=0)
    constrained_max_new = longest_label + 1 if mode == "score" else 0
    extra = max(label_max_new, constrained_max_new) if mode == "score" else max_new
    n_ctx = _ctx(longest + extra + 8)
    train_dir = registry.runs_dir(pilot.dir) / train_id
    theirs = {p["id"]: p for p in read_jsonl(train_dir / "predictions.jsonl")}
    metrics = json.loads((train_dir / "metrics.json").read_text(encoding="utf-8"))
    recorded_precision = protocol.get("precision")
    ref: dict = {"kind": "recorded", "precision": recorded_precision}
    if reference == "fp32" and recorded_precision != "fp32":
        say(
            "reference: the adapter evaluated again in fp32 "
            f"(it was recorded in {recorded_precision})"
        )
        fp32 = _fp32_predictions(pilot, tok, fmt, adapter_dir, protocol, records, say)
        same = sum(theirs.get(r["id"], {}).get("parsed") == r["parsed"] for r in fp32.predictions)
        ref = {
            "kind": "fp32",
            "precision": "fp32",
            "recorded_precision": recorded_precision,
            "recorded_agrees_with_fp32": same / max(len(records), 1),
            "seconds": round(fp32.seconds, 1),
        }
        theirs = {r["id"]: r for r in fp32.predictions}
        metrics = fp32.metrics
    return {
        "reference": ref,
        "records": records,
        "prompt_texts": texts,
        "prompt_text_of_first": (
            fmt.prompt_text(records[0].text, records[0].context) if records else ""
        ),
        "prompts": [
            {
                "id": r.id,
                "text": t,
                "ids": p,
                "input": r.text,
                "reference_label": _label_index(spec, theirs.get(r.id))
                if mode == "score"
                else None,
            }
            for r, t, p in zip(records, texts, prompts, strict=True)
        ],
        "answer_budget": budget,
        "truncation_side": protocol.get("truncation_side", spec.data.truncation_side),
        "mode": mode,
        "labels": labels,
        # calibrated scoring: the served model's own content-free scores give its offsets
        "content_free": [
            {"id": f"content-free-{i}", "ids": fmt.encode_prompt(text, budget)}
            for i, text in enumerate(CONTENT_FREE)
        ]
        if protocol.get("label_scoring") == "calibrated"
        else [],
        "stop_ids": stop,
        "max_new_tokens": max_new,
        "label_max_new": label_max_new,
        "constrained_max_new": constrained_max_new,
        "n_ctx": n_ctx,
        "lorapilot_predictions": theirs,
        "lorapilot_metrics": metrics,
        "references": reference_answers(
            tok, [(theirs.get(r.id) or {}).get("raw_output") or "" for r in records], max_new
        )
        if mode == "generate"
        else [],
    }


INPUT_MARK = "\x00lorapilot-input\x00"


def classifier_config(pilot, tok, cases: dict) -> tuple[dict | None, str]:
    """classifier.json, what the exported classify.py needs to classify as the pilot does
    (the prompt around the input, the cut, the labels' token ids), or None and why not."""
    spec = pilot.spec
    if cases["mode"] != "score":
        return None, "a generated answer: the Modelfile serves it as the pilot evaluated it"
    if cases["content_free"]:
        return None, "calibrated label scoring (eval.label_scoring: calibrated) is not in it"
    if any(r.context for r in cases["records"]):
        return None, "conversations with earlier turns: the script takes one input text"
    fmt = formatter_for(pilot, tok)
    whole = fmt.prompt_text(INPUT_MARK)
    if whole.count(INPUT_MARK) != 1:
        return None, "the chat template does not hold the input text as it is"
    head, tail = whole.split(INPUT_MARK)
    # a template that changes the text (trims it, escapes it) cannot be split around it
    changed = next(
        (r for r in cases["records"] if fmt.prompt_text(r.text) != head + r.text + tail), None
    )
    if changed is not None:
        return None, (
            f"the chat template changes the input text (example {changed.id!r}), so a script "
            "cannot build the pilot's prompt around it"
        )
    max_length = max_length_of(pilot, tok)
    config = {
        "pilot": spec.name,
        "labels": list(spec.task.labels or []),
        "label_ids": cases["labels"],
        "prompt_head": head,
        "prompt_tail": tail,
        "max_length": max_length,
        "n_ctx": max_length,  # a prompt and the label scored after it fit max_length
        "answer_budget": cases["answer_budget"],
        "truncation_side": cases["truncation_side"],
        "label_search": spec.eval.label_search,
        "model": BASE_FILE,
        "lora": ADAPTER_FILE,
    }
    return config, f"{CLASSIFY_FILE}: label scoring as the pilot scores, checked on validation"


def _label_index(spec, prediction: dict | None) -> int | None:
    labels = list(spec.task.labels or [])
    parsed = (prediction or {}).get("parsed")
    return labels.index(parsed) if parsed in labels else None


def reference_answers(tok, outputs: list[str], max_new: int) -> list[dict]:
    """lorapilot's generated answers as token ids (each output text tokenized again, at most
    `max_new`), and whether each ended at a stop token (it did when shorter than `max_new`)."""
    out = []
    for text in outputs:
        ids = tok(text, add_special_tokens=False)["input_ids"][:max_new]
        out.append({"ids": ids, "ended": len(ids) < max_new})
    return out


def _run_serving(cases_path: Path, out_path: Path, say: Progress) -> tuple[int, str]:
    """The fresh llama.cpp process, its progress lines shown as a phase (a plain line every
    30 s and at the end: generating a validation split there takes minutes); the rest of its
    stderr kept for the error message."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lorapilot.export.serving", str(cases_path), str(out_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert proc.stderr is not None
    other: list[str] = []
    phase: Phase | None = None
    plain = plain_log(say)
    try:
        for line in proc.stderr:
            if line.startswith(PROGRESS):
                done, total = (int(x) for x in line.split()[1:3])
                if phase is None:
                    phase = Phase("serving check", total, bar=False, log=plain)
                phase.advance(done)
            else:
                other.append(line)
    finally:
        if phase is not None:
            phase.close()
        proc.wait()
    return proc.returncode, "".join(other)


def serving_check(
    pilot,
    folder: Path,
    files: dict,
    configs: list,
    cases: dict,
    minimum: float,
    gated: bool,
    say: Progress | None = None,
) -> dict:
    """Run the fresh llama.cpp process over `folder`, then score its predictions with the
    pilot's metrics and compare them with lorapilot's, example by example."""
    spec = pilot.spec
    say = say or (lambda m: None)
    payload = {
        "folder": str(folder),
        "files": {k: v for k, v in files.items() if k != MANIFEST},
        "configs": configs,
        "mode": cases["mode"],
        "prompts": cases["prompts"],
        "labels": cases["labels"],
        "content_free": cases["content_free"],
        "references": cases.get("references") or [],
        "stop_ids": cases["stop_ids"],
        "max_new_tokens": cases["max_new_tokens"],
        "label_max_new": cases.get("label_max_new", 0),
        "constrained_max_new": cases.get("constrained_max_new", 0),
        "classifier": bool(cases.get("classifier")),
        "grammar": bool(cases.get("grammar")),
        "grammar_file": cases.get("grammar_file", GRAMMAR_FILE),
        "schema_file": cases.get("schema_file"),
        "n_ctx": cases["n_ctx"],
        # llama.cpp's best-first knows no offsets: calibrated scoring scores every label
        "label_search": "all" if cases["content_free"] else spec.eval.label_search,
        "threads": spec.train.threads,
    }
    with tempfile.TemporaryDirectory(prefix="lorapilot-serve-") as d:
        cases_path, out_path = Path(d) / "cases.json", Path(d) / "out.json"
        atomic_write_json(cases_path, payload)
        t0 = time.perf_counter()
        returncode, stderr = _run_serving(cases_path, out_path, say)
        if returncode != 0 or not out_path.is_file():
            raise LorapilotError(
                f"the llama.cpp check process failed (exit {returncode}): {stderr.strip()[-2000:]}"
            )
        child = json.loads(out_path.read_text(encoding="utf-8"))
        wall = time.perf_counter() - t0
    base = {
        "reference": cases["reference"],
        "serving_agreement_min": minimum,
        "gated": gated,
        "n_examples": len(cases["records"]),
        "llama_cpp_python": child.get("llama_cpp_python"),
        "check_seconds": round(wall, 1),
    }
    if child.get("refused"):
        return base | {"ok": False, "serving_agreement": None, "problems": child["problems"]}
    results, problems = [], []
    for conf in child["configs"]:
        if conf["tokenization_mismatches"]:
            first = conf["tokenization_mismatches"][0]
            how = f"{CLASSIFY_FILE} builds" if cases.get("classifier") else "llama.cpp tokenizes"
            problems.append(
                f"{conf['name']}: {how} {len(conf['tokenization_mismatches'])} "
                f"validation prompt(s) differently, first example {first['id']!r} at token "
                f"{first['first_difference_at']} (lorapilot {first['lorapilot']}, llama.cpp "
                f"{first['llama_cpp']})"
            )
            results.append(conf | {"serving_agreement": None})
            continue
        results.append(_compare(spec, cases, conf))
    agreements = [r["serving_agreement"] for r in results if r["serving_agreement"] is not None]
    agreement = min(agreements) if agreements and not problems else None
    ok = not problems and (not gated or (agreement is not None and agreement >= minimum))
    freely = [r["generation"] for r in results if r.get("generation")]
    held = [g["constrained"] for g in freely if g.get("constrained")]
    held += [r["constrained"] for r in results if r.get("constrained")]  # an extraction's
    by_schema = [r["schema_constrained"] for r in results if r.get("schema_constrained")]
    return base | {
        "ok": ok,
        "serving_agreement": agreement,
        # generation: output tokens, each predicted from the same preceding ones
        "agreement_unit": "tokens" if cases["mode"] == "generate" else "examples",
        "problems": problems,
        "metric": _main_metric(spec),
        # label scoring: the same labels generated freely, as the Modelfile serves them
        "generation_agreement": min((g["agreement"] for g in freely), default=None),
        "generation_label_rate": min((g["label_rate"] for g in freely), default=None),
        # and constrained by labels.gbnf (fields.gbnf) in llama.cpp's grammar sampler
        "grammar_file": cases.get("grammar_file") if cases.get("grammar") else None,
        "constrained_agreement": min((g["agreement"] for g in held), default=None),
        "constrained_label_rate": min(
            (g["label_rate"] for g in held if "label_rate" in g), default=None
        ),
        # and held to schema.json as llama-cpp-python's server converts it
        "schema_file": cases.get("schema_file"),
        "schema_constrained_agreement": min((g["agreement"] for g in by_schema), default=None),
        "warnings": [
            *generation_warnings(results, minimum, bool(cases.get("classifier"))),
            *(child.get("grammar_problems") or []),
        ],
        "configs": results,
    }


def generation_warnings(results: list[dict], minimum: float, classifier: bool = False) -> list[str]:
    """Where free generation (the Modelfile's way: `ollama run`, `llama-cli`) answers other
    than the scored label more often than the gate allows: the served classifier is not the
    one the decision was made on. Reported, not gated: the pilot's rule is label scoring."""
    serve_by = f"serve it with {CLASSIFY_FILE} (the folder's label scoring), " if classifier else ""
    texts = [
        generation_warning(
            r["name"],
            r["generation"],
            minimum,
            served_as="served as the Modelfile serves it (free greedy generation, what "
            "`ollama run` answers)",
            scorer="lorapilot",
            theirs="lorapilot",
            ours="llama_cpp",
            serve_by=serve_by,
            held_as=f"Constrained by {GRAMMAR_FILE} in llama.cpp's grammar sampler",
            constrain_by=f"serve it with --grammar-file {GRAMMAR_FILE}, ",
        )  # fmt: skip
        for r in results
        if r.get("generation")
    ]
    return [t for t in texts if t]


HEADLINE = (
    "accuracy", "macro_f1", "json_valid_rate", "required_fields_rate", "leaf_f1", "field_f1",
    "format_valid_rate", "answer_match", "exact_match",
)  # fmt: skip


def _compare(spec, cases: dict, conf: dict) -> dict:
    import numpy as np

    records = cases["records"]
    scores = (
        np.array([[np.nan if v is None else v for v in row] for row in conf["scores"]])
        if "scores" in conf
        else None
    )
    offsets = None
    if conf.get("content_free_scores"):
        free = calibration_offsets(np.array(conf["content_free_scores"], dtype=np.float64))
        offsets = {lab: float(x) for lab, x in zip(spec.task.labels, free, strict=True)}
    metrics, rows = score_predictions(
        spec, records, cases["prompt_texts"], scores, conf.get("outputs"), offsets
    )
    theirs = cases["lorapilot_predictions"]
    agree = _agrees(theirs, rows)
    same = sum(agree)
    differing = [
        {
            "id": row["id"],
            "gold": row["gold"],
            "lorapilot": theirs.get(row["id"], {}).get("parsed"),
            "llama_cpp": row["parsed"],
            "llama_cpp_raw": row["raw_output"],
        }
        for row, ok in zip(rows, agree, strict=True)
        if not ok
    ]
    n = len(rows)
    lp = cases["lorapilot_metrics"]
    named = dict.fromkeys(k for k in (_main_metric(spec), *HEADLINE) if k)
    keys = [k for k in named if isinstance(metrics.get(k), int | float)]
    examples = same / n if n else 1.0
    forced = conf.get("forced")
    tokens = None
    if forced:  # generation: the gate is per token, each from lorapilot's preceding tokens
        compared = sum(t for _, t in forced)
        tokens = {
            "tokens_same": sum(m for m, _ in forced),
            "tokens_compared": compared,
            "token_agreement": sum(m for m, _ in forced) / compared if compared else 1.0,
        }
    generated = conf.get("generated")
    ties = None
    if conf.get("reference_scores") and offsets is None:  # label scoring, uncalibrated
        ties = near_ties(spec, cases, conf, rows)
    if tokens:
        gated = tokens["token_agreement"]
    elif ties:
        gated = (same + ties["near_ties"]) / n if n else 1.0
    else:
        gated = examples
    return {
        "name": conf["name"],
        "generation": _generation(spec, cases, conf, keys) if generated else None,
        **{
            key: _constrained_answers(spec, cases, conf, rows, metrics, keys, key)
            for key in ("constrained", "schema_constrained")
            if cases.get("mode") == "generate" and conf.get(key) is not None
        },
        "serving_agreement": gated,
        **({"ties": ties} if ties else {}),
        "agreement_unit": "tokens" if tokens else "examples",
        "example_agreement": examples,
        **(tokens or {}),
        "n_same": same,
        "n_examples": n,
        "metrics": {k: {"lorapilot": lp.get(k), "llama_cpp": metrics[k]} for k in keys},
        "differing": differing[:50],
        "n_differing": len(differing),
        "seconds": conf.get("seconds"),
        "examples_per_s": conf.get("examples_per_s"),
        "load_s": conf.get("load_s"),
    }


def _agrees(theirs: dict, rows: list[dict]) -> list[bool]:
    """Per served prediction row: whether lorapilot predicted the same (parsed) answer."""
    return [theirs.get(r["id"], {}).get("parsed") == r["parsed"] for r in rows]


TIE_NOISE_LIMIT = 1.0
"""Nats: runtimes whose scores of the same label differ by more than this on the examples
they agree on are not counted as differing by noise alone; no difference is a near-tie."""


def near_ties(spec, cases: dict, conf: dict, rows: list[dict]) -> dict:
    """Label scoring: which of the served model's different answers are near-ties. The two
    runtimes' arithmetic differs (llama.cpp's quantized products, lorapilot's bf16): on the
    examples they agree on, the same label's score differs by up to `noise` nats between them.
    A different answer whose served margin over lorapilot's label is within that noise is a
    near-tie that the arithmetic alone can flip, not a fault of the conversion; one beyond it
    is a real difference. Noise above TIE_NOISE_LIMIT counts nothing as a near-tie."""
    labels = list(spec.task.labels or [])
    theirs = cases["lorapilot_predictions"]
    noise, margins = [], []
    for i, row in enumerate(rows):
        mine = theirs.get(row["id"]) or {}
        served_ref = conf["reference_scores"][i]
        own = (mine.get("scores") or {}).get(mine.get("parsed"))
        if served_ref is None or own is None or row["parsed"] not in labels:
            continue
        if mine.get("parsed") == row["parsed"]:
            noise.append(abs(served_ref - own))
        else:
            pick = conf["scores"][i][labels.index(row["parsed"])]
            margins.append(max(pick - served_ref, 0.0))
    bound = max(noise, default=0.0)
    trusted = bound <= TIE_NOISE_LIMIT
    return {
        "score_noise_max": round(bound, 6),
        "score_noise_median": round(statistics.median(noise), 6) if noise else None,
        "noise_limit": TIE_NOISE_LIMIT,
        "near_ties": sum(m <= bound for m in margins) if trusted else 0,
        "served_margins": [round(m, 4) for m in sorted(margins)],
    }


FREE = "free greedy generation to the stop token, as the Modelfile serves it"
HELD = (
    f"greedy decoding under {GRAMMAR_FILE} in llama.cpp's grammar sampler, as "
    f"llama-server --grammar-file {GRAMMAR_FILE} --temp 0 answers"
)


def _generation(spec, cases: dict, conf: dict, keys: list[str]) -> dict:
    """A scored classification's labels as llama.cpp generates them: freely, and (where the
    folder has labels.gbnf) constrained by it, with how often the constrained answer is the
    one lorapilot's own constrained check gave (eval.generation_check: its emulation of a
    grammar engine, in the other runtime's arithmetic)."""
    out, _ = _generated_figures(spec, cases, conf["generated"], keys, FREE)
    out["seconds"] = conf.get("generation_seconds")
    if conf.get("constrained") is not None:
        held, rows = _generated_figures(spec, cases, conf["constrained"], keys, HELD)
        held["seconds"] = conf.get("constrained_seconds")
        theirs = cases["lorapilot_predictions"]
        pairs = [
            (theirs[r["id"]]["constrained_label"], r["parsed"])
            for r in rows
            if "constrained_label" in (theirs.get(r["id"]) or {})
        ]
        held["lorapilot_constrained"] = {
            "n": len(pairs),
            "n_same": sum(mine == served for mine, served in pairs),
        }
        out["constrained"] = held
    return out


def _constrained_answers(
    spec, cases: dict, conf: dict, free_rows: list, free_metrics: dict, keys: list,
    key: str = "constrained",
) -> dict:  # fmt: skip
    """An extraction's answers decoded under fields.gbnf (`key` constrained) or schema.json
    (schema_constrained) in llama.cpp, scored by the pilot's metrics beside lorapilot's and
    llama.cpp's free answers: how many are lorapilot's answer and the free one, and what the
    metrics become. Reported, never gated (the pilot decided on free generation)."""
    if key == "schema_constrained":
        file = cases.get("schema_file") or SCHEMA_FILE
        what = (
            f"greedy decoding under {file} as llama-cpp-python's json_schema_to_gbnf converts "
            "it, in llama.cpp's grammar sampler: what its server answers to response_format "
            f'{{"type": "json_object", "schema": <{file}>}} at temperature 0'
        )
    else:
        file = cases.get("grammar_file", FIELDS_GRAMMAR_FILE)
        what = (
            f"greedy decoding under {file} in llama.cpp's grammar sampler, as llama-server "
            f"--grammar-file {file} --temp 0 answers"
        )
    metrics, rows = score_predictions(
        spec, cases["records"], cases["prompt_texts"], None, conf[key]
    )
    theirs = cases["lorapilot_predictions"]
    same = _agrees(theirs, rows)
    n = len(rows)
    lp = cases["lorapilot_metrics"]
    return {
        "what": what,
        "file": file,
        "agreement": sum(same) / n if n else 1.0,
        "n_same": sum(same),
        "n_same_as_free": sum(
            a["parsed"] == b["parsed"] for a, b in zip(rows, free_rows, strict=True)
        ),
        "n": n,
        "metrics": {
            k: {
                "lorapilot": lp.get(k),
                "llama_cpp": free_metrics.get(k),
                "llama_cpp_constrained": metrics.get(k),
            }
            for k in keys
        },
        "differing": [
            {
                "id": r["id"],
                "lorapilot": theirs.get(r["id"], {}).get("parsed"),
                "llama_cpp_constrained": r["parsed"],
                "raw": r["raw_output"],
            }
            for r, ok in zip(rows, same, strict=True)
            if not ok
        ][:20],  # fmt: skip
        "seconds": conf.get(f"{key}_seconds"),
    }


def _generated_figures(
    spec, cases: dict, outputs: list[str], keys: list[str], what: str
) -> tuple[dict, list[dict]]:
    """Answers generated in llama.cpp, parsed by the pilot's rule for generated labels (the
    text, stripped, one of the labels by case), against the labels lorapilot scored."""
    records = cases["records"]
    metrics, rows = score_predictions(spec, records, cases["prompt_texts"], None, outputs)
    theirs = cases["lorapilot_predictions"]
    figures = generation_figures(
        [theirs.get(r["id"], {}) for r in rows], rows, cases["lorapilot_metrics"], metrics,
        keys, what=what, theirs="lorapilot", ours="llama_cpp",
    )  # fmt: skip
    return figures, rows
