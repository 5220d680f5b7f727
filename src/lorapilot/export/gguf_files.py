"""GGUF files for llama.cpp and Ollama, written with the `gguf` package: a PEFT LoRA adapter as
a GGUF LoRA (`adapter.gguf`), and a base or merged model as a GGUF model.

What the conversion has to get right, and why each rule is here:
- Tensor names: llama.cpp's (`blk.0.attn_q.weight`), mapped from Hugging Face's
  (`model.layers.0.self_attn.q_proj.weight`) by gguf's own name map for the architecture.
- Llama's rotary layout: llama.cpp applies RoPE to interleaved pairs, Hugging Face to two
  halves, so the rows of every q and k projection are permuted (llama.cpp's convert does the
  same). For a LoRA update B @ A only B's rows (the output side) are permuted.
- The scale: llama.cpp scales a LoRA by one `adapter.lora.alpha` over each tensor's rank;
  PEFT by alpha / r per module, or alpha / sqrt(r) with rsLoRA. Whatever differs from
  alpha / r is folded into B, so the served update is the trained one.
Only what a pilot can produce is handled; anything else is refused with the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.errors import UsageError
from lorapilot.export.weights import Weights

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",  # SmolLM2, Llama 2/3
    "MistralForCausalLM": "llama",  # llama.cpp runs Mistral as its llama architecture
    "Qwen2ForCausalLM": "qwen2",
}
"""Hugging Face architecture -> llama.cpp architecture, the ones this export writes."""

ROPE_PERMUTED = {"llama"}
"""llama.cpp architectures whose q/k rows are permuted from Hugging Face's rotary layout."""

BASE_TYPES = ("f32", "f16", "q8_0")
"""Tensor types a base or merged GGUF can be written in (vectors always stay F32)."""

_PEFT_PREFIX = "base_model.model."
LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")


def gguf_architecture(config: dict, where: str) -> str:
    """The llama.cpp architecture of a Hugging Face config, or exit 2 naming the one found."""
    archs = config.get("architectures") or [config.get("model_type", "?")]
    for a in archs:
        if a in ARCHITECTURES:
            return ARCHITECTURES[a]
    raise UsageError(
        f"{where}: the base's architecture {', '.join(map(str, archs))} is not one the GGUF "
        f"export writes (it writes {', '.join(sorted(ARCHITECTURES))}); export the PEFT "
        "adapter (without --gguf) or a merged model folder (--merge) instead"
    )


def _head_counts(config: dict) -> tuple[int, int]:
    heads = int(config["num_attention_heads"])
    return heads, int(config.get("num_key_value_heads") or heads)


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face's rotate-half row order -> llama.cpp's interleaved pairs, per head."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _rope_heads(hf_name: str, config: dict, arch: str) -> int | None:
    """How many heads the rows of this tensor are permuted over (None: not permuted)."""
    if arch not in ROPE_PERMUTED:
        return None
    heads, kv_heads = _head_counts(config)
    if hf_name.endswith("q_proj.weight") or hf_name.endswith("q_proj"):
        return heads
    if hf_name.endswith("k_proj.weight") or hf_name.endswith("k_proj"):
        return kv_heads
    return None


class NameMap:
    """Hugging Face tensor names -> GGUF names for one architecture and depth."""

    def __init__(self, arch: str, n_blocks: int):
        import gguf

        by_name = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
        self.arch = arch
        self._map = gguf.get_tensor_name_map(by_name[arch], n_blocks)

    def __call__(self, hf_name: str) -> str | None:
        return self._map.get_name(hf_name, try_suffixes=(".weight", ".bias"))


# --- the adapter ---------------------------------------------------------------------------


def module_scale(module: str, rank: int, adapter_config: dict) -> float:
    """PEFT's scale for one module: alpha / r (alpha / sqrt(r) with rsLoRA), with the
    per-module rank and alpha patterns applied as PEFT matches them (by name suffix)."""
    alpha = float(adapter_config.get("lora_alpha", rank))
    for pattern, value in (adapter_config.get("alpha_pattern") or {}).items():
        if module == pattern or module.endswith("." + pattern) or re.fullmatch(pattern, module):
            alpha = float(value)
    if adapter_config.get("use_rslora"):
        return alpha / float(np.sqrt(rank))
    return alpha / rank


def lora_pairs(weights: dict[str, np.ndarray], where: str) -> dict[str, dict[str, np.ndarray]]:
    """{base module name: {"A": [r, in], "B": [out, r]}} of a PEFT LoRA state dict, float32."""
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in weights.items():
        m = LORA_KEY.match(key)
        if not m:
            raise UsageError(
                f"{where}: tensor {key} is not a LoRA A/B matrix (embedding LoRA or extra "
                "trained tensors have no GGUF LoRA form); export a merged GGUF (--merge)"
            )
        module = m["module"].removeprefix(_PEFT_PREFIX)
        pairs.setdefault(module, {})[m["which"]] = np.asarray(value, dtype=np.float32)
    if not pairs:
        raise UsageError(f"{where}: the adapter holds no LoRA tensors")
    for module, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise UsageError(f"{where}: module {module} has lora_{''.join(ab)} only")
    return pairs


def lora_tensors(
    weights: dict[str, np.ndarray], adapter_config: dict, config: dict, where: str
) -> tuple[float, list[tuple[str, np.ndarray]]]:
    """(alpha, [(gguf name, float32 array)]) for a PEFT LoRA state dict: `name.lora_a`
    [r, in] and `name.lora_b` [out, r] per adapted linear layer, as llama.cpp reads them."""
    arch = gguf_architecture(config, where)
    if adapter_config.get("use_dora"):
        raise UsageError(f"{where}: a DoRA adapter has no GGUF LoRA form in llama.cpp")
    if adapter_config.get("modules_to_save"):
        raise UsageError(
            f"{where}: the adapter also trains whole modules ({adapter_config['modules_to_save']})"
            ", which a GGUF LoRA cannot carry; export a merged GGUF (--merge) instead"
        )
    names = NameMap(arch, int(config["num_hidden_layers"]))
    pairs = lora_pairs(weights, where)
    alpha = float(adapter_config.get("lora_alpha", adapter_config.get("r", 8)))
    out: list[tuple[str, np.ndarray]] = []
    for module in sorted(pairs):
        a, b = pairs[module]["A"], pairs[module]["B"]
        rank = a.shape[0]
        target = names(module + ".weight")
        if target is None:
            raise UsageError(f"{where}: llama.cpp has no tensor for the adapted module {module}")
        if module.endswith("lm_head") and config.get("tie_word_embeddings"):
            raise UsageError(
                f"{where}: a LoRA on the tied lm_head has no tensor of its own in llama.cpp"
            )
        # llama.cpp multiplies by alpha / rank; fold whatever PEFT's scale differs by into B.
        fold = module_scale(module, rank, adapter_config) / (alpha / rank)
        if fold != 1.0:
            b = b * np.float32(fold)
        heads = _rope_heads(module, config, arch)
        if heads is not None:
            b = _permute_rows(b, heads)
        out.append((target.removesuffix(".weight") + ".weight.lora_a", np.ascontiguousarray(a)))
        out.append((target.removesuffix(".weight") + ".weight.lora_b", np.ascontiguousarray(b)))
    return alpha, out


def write_adapter_gguf(
    path: Path, arch: str, alpha: float, tensors: list[tuple[str, np.ndarray]], name: str
) -> None:
    """An adapter GGUF as llama.cpp's `--lora` and Ollama's ADAPTER load it (F32 tensors)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    w.add_name(name)
    for tname, data in tensors:
        w.add_tensor(tname, data.astype(np.float32))
    _finish(w)


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --- base and merged models ------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """A model tensor to write: its GGUF name and shape now, its float32 data when written
    (the writer streams: one tensor in memory at a time)."""

    name: str
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


def model_tensors(weights: Weights, config: dict, where: str) -> list[Tensor]:
    """Every tensor of a Hugging Face causal LM as llama.cpp names it, q/k rows permuted when
    loaded; a tied lm_head is left out (llama.cpp reuses the token embeddings)."""
    arch = gguf_architecture(config, where)
    names = NameMap(arch, int(config["num_hidden_layers"]))
    out = []
    for key in sorted(weights):
        if key == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        if key.endswith("rotary_emb.inv_freq"):
            continue
        target = names(key)
        if target is None:
            raise UsageError(f"{where}: llama.cpp has no tensor for {key}")
        heads = _rope_heads(key, config, arch)

        def load(key: str = key, heads: int | None = heads) -> np.ndarray:
            data = np.asarray(weights[key], dtype=np.float32)
            return _permute_rows(data, heads) if heads is not None else data

        out.append(Tensor(target, weights.shape(key), load))
    return out


def _stored_as(shape: tuple[int, ...], base_type: str) -> str:
    """The GGUF type a tensor is written in: vectors F32; q8_0 only for rows of whole blocks."""
    if len(shape) < 2 or base_type == "f32":
        return "f32"
    if base_type == "q8_0" and shape[-1] % 32 == 0:
        return "q8_0"
    return "f16"


def _write_model_tensors(
    writer, tensors: list[Tensor], base_type: str, tick: Callable[[], None] | None = None
) -> None:
    """The tensor infos first (shapes and types, known without the data), then each tensor's
    data loaded, converted and written in turn (`tick` after each): memory holds one tensor,
    not the model."""
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    kinds = [_stored_as(t.shape, base_type) for t in tensors]
    for t, kind in zip(tensors, kinds, strict=True):
        if kind == "q8_0":
            byte_shape = gguf.quant_shape_to_byte_shape(t.shape, q8)
            writer.add_tensor_info(
                t.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=q8
            )
        else:
            dtype = np.dtype(np.float32 if kind == "f32" else np.float16)
            writer.add_tensor_info(t.name, t.shape, dtype, int(np.prod(t.shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t, kind in zip(tensors, kinds, strict=True):
        data = t.load()
        if tuple(data.shape) != t.shape:
            raise UsageError(f"tensor {t.name}: read {tuple(data.shape)}, expected {t.shape}")
        if kind == "q8_0":
            writer.write_tensor_data(gguf.quants.quantize(data, q8))
        else:
            writer.write_tensor_data(data.astype(np.float32 if kind == "f32" else np.float16))
        del data
        if tick is not None:
            tick()
    writer.close()


FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}
"""GGUF `general.file_type` (llama.cpp's LLAMA_FTYPE) per base type."""


CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def rewrite_gguf(
    original: Path,
    tensors: list[Tensor],
    out: Path,
    base_type: str,
    tick: Callable[[], None] | None = None,
    chat_template: str | None = None,
) -> None:
    """A GGUF model with `original`'s metadata (architecture, tokenizer, chat template) and the
    given tensors in `base_type`: a base converted from a quantized GGUF, or a merged model.
    The tensors must be exactly the original's, by name and shape. `chat_template`: the
    pilot's own prompt format (model.chat_template), in place of the original's."""
    import gguf

    reader = gguf.GGUFReader(str(original))
    want = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in reader.tensors}
    arch = str(reader.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(str(out), arch)
    skip = {"general.architecture", "general.file_type"}
    _copy_metadata(reader, w, skip=skip | ({CHAT_TEMPLATE_KEY} if chat_template else set()))
    if chat_template:
        w.add_chat_template(chat_template)
    w.add_file_type(FILE_TYPES[base_type])
    for t in tensors:
        shape = want.get(t.name)
        if shape is None or t.shape != shape:
            raise UsageError(
                f"{original.name}: tensor {t.name} {t.shape} does not match the GGUF's "
                f"({shape}); the base folder and its GGUF are not the same model"
            )
    missing = sorted(set(want) - {t.name for t in tensors})
    if missing:
        raise UsageError(f"{original.name}: the base has no weights for {missing[:5]}")
    _write_model_tensors(w, tensors, base_type, tick)


def _copy_metadata(reader, writer, skip: set[str]) -> None:
    import gguf

    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), vtype)


def convert_hf(
    folder: Path,
    tensors: list[Tensor],
    out: Path,
    base_type: str,
    pre: str,
    name: str,
    tick: Callable[[], None] | None = None,
    chat_template: str | None = None,
) -> None:
    """A GGUF model from a Hugging Face folder: hyperparameters from config.json, a byte-level
    BPE tokenizer from tokenizer.json (the only kind converted here) with `pre` as llama.cpp's
    pre-tokenizer, the chat template (`chat_template`: the pilot's own, in place of the
    folder's) and special tokens from the tokenizer config."""
    import gguf

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    arch = gguf_architecture(config, str(folder / "config.json"))
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(name)
    add_hparams(w, config, str(folder / "config.json"))
    w.add_file_type(FILE_TYPES[base_type])
    add_tokenizer(w, folder, pre, int(config["vocab_size"]), chat_template)
    _write_model_tensors(w, tensors, base_type, tick)


def add_hparams(w, config: dict, where: str) -> None:
    """The hyperparameters llama.cpp's llama and qwen2 graphs read."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise UsageError(
            f"{where}: rope scaling {kind!r} is not converted to GGUF here; export the PEFT "
            "adapter and convert with llama.cpp's convert_hf_to_gguf.py"
        )
    heads, kv_heads = _head_counts(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    w.add_context_length(int(config["max_position_embeddings"]))
    w.add_embedding_length(int(config["hidden_size"]))
    w.add_block_count(int(config["num_hidden_layers"]))
    w.add_feed_forward_length(int(config["intermediate_size"]))
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0))
    w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    w.add_rope_dimension_count(int(head_dim))
    w.add_vocab_size(int(config["vocab_size"]))


def add_tokenizer(
    w, folder: Path, pre: str, n_vocab: int, chat_template: str | None = None
) -> None:
    import gguf

    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok.get("model") or {}
    pre_tok = json.dumps(tok.get("pre_tokenizer") or {})
    if model.get("type") != "BPE" or "ByteLevel" not in pre_tok:
        raise UsageError(
            f"{folder / 'tokenizer.json'}: only byte-level BPE tokenizers are converted to GGUF "
            f"here (this one is {model.get('type')}); export the PEFT adapter and convert the "
            "base with llama.cpp's convert_hf_to_gguf.py"
        )
    tokens, types = vocab_list(model["vocab"], tok.get("added_tokens") or [], n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=n_vocab)
    if chat_template:  # the pilot's prompt format, not the folder's
        special.chat_template = chat_template
    special.add_to_gguf(w, quiet=True)
    template = folder / "chat_template.jinja"
    if template.is_file() and not special.chat_template:
        w.add_chat_template(template.read_text(encoding="utf-8"))


def vocab_list(vocab: dict[str, int], added: list[dict], n_vocab: int) -> tuple[list[str], list]:
    """Tokens by id and llama.cpp's token types: special added tokens are CONTROL, other added
    tokens USER_DEFINED, ids no token fills UNUSED placeholders."""
    import gguf

    by_id: dict[int, str] = {i: t for t, i in vocab.items()}
    kinds: dict[int, Any] = {}
    for a in added:
        by_id[int(a["id"])] = a["content"]
        kinds[int(a["id"])] = (
            gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
        )
    tokens, types = [], []
    for i in range(max(n_vocab, max(by_id) + 1)):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(kinds.get(i, gguf.TokenType.NORMAL))
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    return tokens, types


PRE_TOKENIZERS = (
    "smollm",
    "llama-bpe",
    "qwen2",
    "gpt-2",
    "default",
    "deepseek-llm",
    "tekken",
    "gpt-4o",
    "olmo",
    "starcoder",
)
"""llama.cpp pre-tokenizer names tried, in order, when converting a BPE tokenizer: the first
under which llama.cpp tokenizes the probe texts exactly as the base's own tokenizer does."""


def read_metadata(path: Path) -> dict[str, Any]:
    """A GGUF's scalar metadata (arrays left out) as Python values."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            out[key] = field.contents()
    return out
