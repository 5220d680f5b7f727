"""`lorapilot init NAME --from FILE`: a pilot folder scaffolded from the user's own data.

The file is read (JSONL, CSV, Parquet; chat rows too), its input and answer columns and the
task they make are inferred (`data.infer`), the file is copied into the pilot's `data/`
untouched, and pilot.yaml is written with every inference commented beside its key, so the
user reads what was guessed before running anything. Nothing is written until the spec
validates: the folder appears whole (built beside it, then renamed) or not at all.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lorapilot.base.models import load_tokenizer_of, resolve_base
from lorapilot.data.infer import Inferred, infer
from lorapilot.data.load import FORMATS, file_rows
from lorapilot.data.rows import BadRow
from lorapilot.errors import UsageError
from lorapilot.spec import _NAME_RE, IMAGE_EXTENSIONS, EvalSpec, load_spec_file

TEXT_BASE = "smollm2-135m-instruct"
IMAGE_BASE = "efficientnet-lite0"
MAX_ROWS = 200_000
"""Rows read per file to infer from (the whole file is copied; `data` reads it all)."""
CHARS_PER_TOKEN = 3
"""A cautious guess for max_length before any tokenizer is loaded (English BPE: ~4)."""
_SPLITS = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val",
           "test": "test"}  # fmt: skip
_SUCCESS = {
    "classification": ("macro_f1", "{metric: per_category.f1, max_drop: 0.05}"),
    "multi_label_classification": ("macro_f1", "{metric: per_category.f1, max_drop: 0.05}"),
    "extraction": ("field_f1", "{metric: json_valid_rate, min: 0.9}"),
    "format": ("exact_match", "{metric: format_valid_rate, max_drop: 0.05}"),
}
_SYSTEM = {
    "classification": "Classify the text. Answer with exactly one of: {labels}.",
    "multi_label_classification": "Name every label that applies, separated by commas, from: "
    "{labels}.",
    "extraction": "Extract one JSON object with the keys {fields}. Use null when a field is "
    "absent.",
    "format": "Answer the request.",
}
_DOES = {
    "classification": "labels each text with the right one of its {n} labels",
    "multi_label_classification": "names every one of its {n} labels that applies to a text",
    "extraction": "extracts the fields ({fields}) as valid JSON",
    "format": "answers like the data's targets",
}


def run_init_from(
    name: str,
    sources: list[str],
    parent: Path,
    text: str | None = None,
    answer: str | None = None,
    task: str | None = None,
    base: str | None = None,
    source: str | None = None,
    permission: str | None = None,
) -> dict:
    """A pilot folder from the user's data: one file, several files by split, or a folder
    of images in one folder per label (or train/val/test folders of those)."""
    if not _NAME_RE.match(name):
        raise UsageError(f"init {name!r}: a pilot name is 1-64 of letters, digits, '.', '_', '-'")
    if task == "image_classification" and not (len(sources) == 1 and Path(sources[0]).is_dir()):
        raise UsageError("--task image_classification: --from takes the folder of images, one "
                         "folder per label")  # fmt: skip
    folder = Path(parent) / name
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder}: exists and is not empty")
    if len(sources or []) == 1 and Path(sources[0]).is_dir():
        if text or answer:
            raise UsageError("--text and --answer name columns of a data file, not of a folder")
        image = _image_folder(Path(sources[0]))
        yaml_text = image_yaml(name, image, base or IMAGE_BASE, source, permission)
        _build(folder, {}, {}, yaml_text, image.path)
        return image.result(folder, source, permission)
    base = base or TEXT_BASE
    files = _splits_of(sources)
    rows, unreadable = [], []
    for path in files.values():  # every split: a label only test holds is still a label
        got, bad = _read(path)
        rows += got
        unreadable += [f"{path}:{line}: {problem}" for line, problem in bad]
    try:
        found = infer(rows, text=text, answer=answer, task=task)
    except ValueError as e:
        raise UsageError(f"{next(iter(files.values()))}: {e}") from None
    if unreadable:
        found.warnings.append(
            f"{len(unreadable)} row(s) could not be read ({unreadable[0]}); `lorapilot data` "
            "refuses them unless data.on_error is skip"
        )
    names = _copied_names(files)
    if found.labels and "val" not in names:
        found.warnings += _thin_validation(found, _val_fraction(found.n_rows))
    yaml_text = pilot_yaml(name, found, names, base, source, permission, Path(parent))
    _build(folder, files, names, yaml_text)
    return {
        "pilot": str(folder),
        "spec": str(folder / "pilot.yaml"),
        "task": found.task,
        "n_examples": found.n_rows,
        "from": {split: str(p) for split, p in files.items()},
        "copied": {split: f"data/{n}" for split, n in names.items()},
        "fields": {k: v for k, v in _field_map(found).items() if v is not None},
        "labels": found.labels,
        "label_counts": found.label_counts or None,
        "extraction_fields": [f["name"] for f in found.fields] if found.fields else None,
        "inferred": found.reasons,
        "to_state": [
            f"data.{k}" for k, v in (("source", source), ("permission", permission)) if not v
        ],  # fmt: skip
        "warnings": found.warnings,
    }


def _val_fraction(n_rows: int) -> float:
    return 0.2 if n_rows < 1000 else 0.1


def _thin_validation(found: Inferred, val: float) -> list[str]:
    """Labels whose share of the validation split will be under eval.min_support: their
    per-label guard cannot judge them, so the decision can be no better than INCONCLUSIVE
    (NLU++: 15 of 48 intents at val 0.1)."""
    floor = EvalSpec.model_fields["min_support"].default
    thin = {k: round(n * val) for k, n in found.label_counts.items() if round(n * val) < floor}
    if not thin:
        return []
    shown = ", ".join(f"{k} (~{n})" for k, n in list(thin.items())[::-1][:6])
    return [
        f"{len(thin)} of {len(found.labels or [])} labels will have fewer than "
        f"eval.min_support={floor} validation examples at data.split.val {val} ({shown}"
        f"{', ...' if len(thin) > 6 else ''}): the per-label guard cannot judge them and the "
        "decision can be no better than INCONCLUSIVE; raise data.split.val, gather more of "
        "them, or guard a pooled metric (macro_f1) instead"
    ]


def _splits_of(sources: list[str]) -> dict[str, Path]:
    """`--from FILE` once: the one file, split by lorapilot. Several: each file's split from
    a `train=`/`val=`/`test=` prefix or from its name (train.csv, dev.jsonl, test.parquet)."""
    if not sources:
        raise UsageError("--from: give the data file to scaffold from")
    out: dict[str, Path] = {}
    for source in sources:
        split, _, rest = source.partition("=")
        if rest and split in _SPLITS and not Path(source).exists():
            split, path = _SPLITS[split], Path(rest)
        else:
            path = Path(source)
            words = re.findall(r"[a-z]+", path.stem.lower())
            split = next((_SPLITS[w] for w in words if w in _SPLITS), None) or (
                "file" if len(sources) == 1 else ""
            )
            if not split:
                raise UsageError(
                    f"--from {source}: cannot tell which split this file is from its name; "
                    "write train=PATH, val=PATH or test=PATH"
                )
        if split in out:
            raise UsageError(f"--from {source}: a second {split} file ({out[split]} is one)")
        if not path.is_file():
            raise UsageError(f"--from {path}: no such file (a JSONL, CSV or Parquet file)")
        if path.suffix.lower() not in FORMATS:
            raise UsageError(
                f"--from {path}: cannot tell the format from the extension {path.suffix!r} "
                f"(one of {', '.join(sorted(FORMATS))})"
            )
        out[split] = path
    if len(out) > 1 and "train" not in out:
        raise UsageError("--from: several files, none of them the train split (train=PATH)")
    if len(out) == 1 and "file" not in out:
        out = {"file": next(iter(out.values()))}  # one file is split by lorapilot
    return dict(sorted(out.items(), key=lambda kv: ("file", "train", "val", "test").index(kv[0])))


def _read(path: Path) -> tuple[list[dict], list[tuple[int, str]]]:
    rows, bad = [], []
    try:
        for line, row in file_rows(path, FORMATS[path.suffix.lower()], str(path)):
            if isinstance(row, BadRow):
                bad.append((line, str(row)))
            else:
                rows.append(row)
            if len(rows) >= MAX_ROWS:
                break
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    return rows, bad


def _copied_names(files: dict[str, Path]) -> dict[str, str]:
    names = {split: p.name for split, p in files.items()}
    if len(set(names.values())) < len(names):  # train/data.csv and test/data.csv
        names = {split: f"{split}-{n}" for split, n in names.items()}
    return names


def _build(
    folder: Path,
    files: dict[str, Path],
    names: dict[str, str],
    yaml_text: str,
    images: Path | None = None,
) -> None:
    """Everything in a temp folder beside the pilot, validated, then renamed into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / "data").mkdir()
        for split, path in files.items():
            shutil.copyfile(path, tmp / "data" / names[split])
        if images is not None:  # hidden files and folders stay behind, as `data` skips them
            shutil.copytree(images, tmp / "data" / "images", ignore=_hidden)
        (tmp / "pilot.yaml").write_text(yaml_text, encoding="utf-8")
        load_spec_file(tmp / "pilot.yaml")  # what we scaffold must validate
        os.chmod(tmp, 0o777 & ~_umask())
        if folder.exists():
            folder.rmdir()  # empty: checked above
        os.replace(tmp, folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)


def _hidden(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n.startswith(".")]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _field_map(found: Inferred) -> dict:
    if found.messages:
        return {"messages": found.messages, "id": found.id}
    key = "target" if found.task in ("extraction", "format") else "label"
    return {"text": found.text, key: found.answer, "id": found.id}


def _q(value: str) -> str:
    """A YAML scalar for any string: JSON's double-quoted form is YAML's too."""
    return json.dumps(value, ensure_ascii=False)


def _wrapped(items: list[str], indent: str, width: int = 92) -> str:
    """A YAML flow list over as many lines as it needs."""
    lines, line = [], "["
    for i, item in enumerate(items):
        piece = _q(item) + ("]" if i == len(items) - 1 else ", ")
        if len(line) + len(piece) > width and line.strip() != "[":
            lines.append(line.rstrip())
            line = indent + "  "
        line += piece
    lines.append(line)
    return "\n".join(lines)


def max_length_for(found: Inferred, system: str, base: str, root: Path) -> tuple[int, str]:
    """data.max_length for the longest examples, and how it was found: counted with the
    base's tokenizer and chat template where the base is on this machine, else estimated at
    CHARS_PER_TOKEN. Either way + 32 tokens of room, rounded up to 32, within 64-4096."""
    names = found.labels or [f["name"] for f in found.fields or []]
    system = system.replace("{labels}", ", ".join(names)).replace("{fields}", ", ".join(names))
    counted = _counted(found, system, base, root)
    if counted is not None:
        tokens = counted
        how = (f"the longest prompt plus the longest answer: {counted} tokens with {base}'s "
               "tokenizer")  # fmt: skip
    else:
        tokens = round((found.longest_chars + len(system)) / CHARS_PER_TOKEN) + 32
        how = (f"estimated: the longest input and answer are {found.longest_chars} characters "
               "(the base is not on this machine to count tokens)")  # fmt: skip
    return max(64, min(4096, 32 * math.ceil((tokens + 32) / 32))), how


def _counted(found: Inferred, system: str, base: str, root: Path) -> int | None:
    """The longest prompt (system and user turn as the base's chat template renders them,
    up to the answer) plus the longest answer, in tokens."""
    try:
        tok = load_tokenizer_of(resolve_base(base, root=root, weights=False).path)
    except (UsageError, OSError, ValueError):
        return None

    def prompt(text: str) -> str:
        turns = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        try:
            return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception:  # no template, or one that refuses a system turn: the text alone
            return f"{system}\n{text}\n"

    inputs = max(len(tok(prompt(t))["input_ids"]) for t in found.longest_inputs)
    answers = max(len(tok(a, add_special_tokens=False)["input_ids"]) for a in found.longest_answers)
    return inputs + answers + 2  # + the end of turn


def pilot_yaml(
    name: str,
    found: Inferred,
    names: dict[str, str],
    base: str,
    source: str | None = None,
    permission: str | None = None,
    root: Path = Path("."),
) -> str:
    """pilot.yaml for what the data holds, each inference commented beside its key."""
    kind = found.task
    system = found.system or _SYSTEM[kind]
    if kind == "format" and found.regex and not found.system:  # ask for the convention
        system = f"Answer the request. End with a line '{found.final_line}<number>'."
    metric, guard = _SUCCESS[kind]
    if kind == "format" and found.regex:  # the format is the gain; the answers must hold
        metric, guard = "format_valid_rate", "{metric: answer_match, max_drop: 0.05}"
    does = _DOES[kind].format(
        n=len(found.labels or []), fields=", ".join(f["name"] for f in found.fields or [])
    )
    out = [
        f"# {name}: scaffolded by `lorapilot init --from` from your data. Read every line",
        f"# marked `inferred`, then: lorapilot check {name} && lorapilot run {name}",
        f"name: {name}",
        "# The behaviour to improve, stated before any training: write what you expect.",
        "hypothesis: >-",
        *textwrap.wrap(
            f"A LoRA adapter on the base model {does} clearly better than the base model "
            "prompted zero-shot" + (", without any label getting worse." if found.labels else "."),
            width=90,
            initial_indent="  ",
            subsequent_indent="  ",
        ),
        "task:",
        f"  kind: {kind}   # inferred: {_reason(found, 'task')}",
    ]
    if found.labels:
        (most, n_most), *_, (least, n_least) = found.label_counts.items()
        spread = (
            f"{n_most} examples each"
            if n_most == n_least
            else f"the most examples: {most} ({n_most}), the fewest: {least} ({n_least})"
        )
        out.append(f"  # inferred: {len(found.labels)} labels; {spread}")  # fmt: skip
        out.append(f"  labels: {_wrapped(found.labels, '  ')}")
    if found.fields:
        out.append("  # inferred from the targets: every key, its type, required when every "
                   "target fills it")  # fmt: skip
        out.append("  fields:")
        block = yaml.safe_dump(
            found.fields, sort_keys=False, default_flow_style=None, allow_unicode=True, width=88
        )  # a field of scalars on one line, a nested one in blocks
        out += ["    " + line for line in block.splitlines()]
    if kind == "format" and found.regex:
        out.append(f"  # inferred: {_reason(found, 'regex')}; the group `answer` is compared "
                   "(answer_match)")  # fmt: skip
        out.append(f"  regex: {_q(found.regex)}")
    elif kind == "format":
        out.append("  # EDIT: the format every answer must follow; as written any non-empty "
                   "answer is valid.")  # fmt: skip
        out.append("  # A named group `answer` marks the part compared (answer_match).")
        out.append("  regex: '(?s).+'")
    why = "the data's own system turn" if found.system else "a default: say what the task is"
    out.append(f"  system: {_q(system)}   # {why}")
    out.append('  template: "{text}"   # the user turn; {text} is the input')
    out += [
        "model:",
        f"  base: {base}   # `lorapilot model fetch` installs the default; or a local HF folder",
        "  # chat_template: plain   # for a base without a chat template",
        "data:",
        f"  source: {_q(source)}"
        if source
        else "  # source: where the data comes from (a URL, a system, a date): `data` needs it",
        f"  permission: {_q(permission)}"
        if permission
        else "  # permission: the licence or internal approval to use it: `data` needs it",
    ]
    if "file" in names:
        out.append(f"  file: data/{names['file']}   # a copy of your file, split by lorapilot")
    else:
        files = ", ".join(f"{s}: data/{n}" for s, n in names.items())
        out.append(f"  files: {{{files}}}")
    fields = ", ".join(f"{k}: {_q(v) if v else 'null'}" for k, v in _field_map(found).items())
    out.append(f"  fields: {{{fields}}}   # inferred: {_fields_reason(found)}")
    if found.other_text_columns:
        cols = ", ".join(found.other_text_columns[:4])
        out.append(f"  # other text columns: {cols}; to read several as the input, use")
        out.append('  # text_template: "Subject: {subject}\\n\\n{body}" in place of text')
    if "val" not in names:
        frac = _val_fraction(found.n_rows)
        test = f", test: {frac}" if "file" in names else ""  # else: the test file, or none
        out.append(
            f"  split: {{seed: 0, val: {frac}{test}}}"
            + ("   # stratified by label" if found.labels else "")
        )
        out.append("  leakage: together   # copies of a text are kept in one split, never "
                   "across (where lorapilot splits)")  # fmt: skip
    if found.no_answer:
        out.append(f"  # on_error: skip   # {found.no_answer} rows have no answer: set aside, "
                   "counted and named by `data` (without it, `data` refuses them)")  # fmt: skip
    max_length, how = max_length_for(found, system, base, root)
    out.append(f"  max_length: {max_length}   # {how}; `lorapilot data` names any input it cuts")
    generate = kind in ("extraction", "format")
    out += [
        "adapter: {method: lora, r: 16, alpha: 32, dropout: 0.0, target_modules: all-linear}",
        "train: {seed: 0, epochs: "
        + ("3" if found.n_rows < 2000 else "1")
        + ", lr: 0.0005, micro_batch: 8, precision: auto}",
        *(["eval: {mode: generate, batch_size: 16}"] if generate else []),
        "# GO when the adapter gains at least this much on the validation split...",
        f"success: {{metric: {metric}, min_gain: 0.10}}",
        "# ...and no guard fails.",
        "guards:",
        f"  - {guard}",
        "limits: {memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}",
    ]
    if found.warnings:
        out.append("# Warnings when this was written:")
        out += [f"#   - {w}" for w in found.warnings]
    return "\n".join(out) + "\n"


def _fields_reason(found: Inferred) -> str:
    said = [r for r in found.reasons if r.startswith(("input: ", "chat rows: "))]
    return said[0] if said else ""


def _reason(found: Inferred, key: str) -> str:
    """The reason given for `key` ("task: format (...)" -> "format (...)")."""
    return next((r.split(": ", 1)[1] for r in found.reasons if r.startswith(key + ": ")), "")


# --------------------------------------------------------------------------- image folders


@dataclass
class ImageFolder:
    """A folder of images, one folder per label (`<label>/...`), or split folders of those
    (`train/<label>/...`, `val/...`, `test/...`)."""

    path: Path
    counts: dict[str, int]
    splits: list[str] = field(default_factory=list)
    """The split folders, in order; empty: lorapilot splits the images."""
    warnings: list[str] = field(default_factory=list)
    seen: str = ""
    """Sizes and modes of a sample of the images, as pilot.yaml says them."""
    shortest: int = 0
    """The smallest shorter side in that sample (0: none read)."""

    @property
    def size(self) -> int:
        """task.image.size: 224 (the default base's) unless the images are smaller: then
        their shorter side rounded up to 32, at least 112 (a tiny image upscaled 4x)."""
        if not self.shortest or self.shortest >= 224:
            return 224
        return max(112, 32 * math.ceil(self.shortest / 32))

    @property
    def labels(self) -> list[str]:
        return sorted(self.counts)

    def result(self, folder: Path, source: str | None, permission: str | None) -> dict:
        return {
            "pilot": str(folder),
            "spec": str(folder / "pilot.yaml"),
            "task": "image_classification",
            "n_examples": sum(self.counts.values()),
            "from": {"folder": str(self.path)},
            "copied": {"folder": "data/images"},
            "fields": {},
            "labels": self.labels,
            "label_counts": dict(sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            "extraction_fields": None,
            "inferred": [
                f"task: image_classification (a folder per label: {len(self.counts)} labels)",
                *([f"splits: the folders {', '.join(self.splits)}"] if self.splits else []),
            ],
            "to_state": [
                f"data.{k}" for k, v in (("source", source), ("permission", permission)) if not v
            ],
            "warnings": self.warnings,
        }


def _image_folder(path: Path) -> ImageFolder:
    subdirs = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    named = {d: _SPLITS[d.lower()] for d in subdirs if d.lower() in _SPLITS}
    if named and len(named) == len(subdirs):  # train/ val/ test/
        if "train" not in named.values():
            raise UsageError(f"--from {path}: split folders without a train folder")
        counts: dict[str, int] = {}
        warnings: list[str] = []
        for d in sorted(named, key=lambda d: list(_SPLITS.values()).index(named[d])):
            one = _label_folders(path / d, warnings)
            for label, n in one.items():
                counts[label] = counts.get(label, 0) + n
        order = sorted(named, key=lambda d: ("train", "val", "test").index(named[d]))
        return ImageFolder(path, counts, order, warnings, *_sample_sizes(path))
    warnings = []
    counts = _label_folders(path, warnings)
    return ImageFolder(path, counts, [], warnings, *_sample_sizes(path))


def _sample_sizes(path: Path, n: int = 64) -> tuple[str, int]:
    """('64 sampled: 28x28 to 28x28 px, L', the smallest shorter side) for up to `n` images
    spread over the sorted files (headers only)."""
    from PIL import Image, UnidentifiedImageError

    files = sorted(
        f for f in path.rglob("*")
        if f.suffix.lower() in IMAGE_EXTENSIONS and not any(p.startswith(".") for p in f.parts)
    )[:: max(1, len(list(path.rglob("*"))) // n)][:n]  # fmt: skip
    sizes, modes = [], Counter()
    for f in files:
        try:
            with Image.open(f) as im:
                sizes.append(im.size)
                modes[im.mode] += 1
        except (OSError, UnidentifiedImageError):
            continue  # `data` names it
    if not sizes:
        return "", 0
    small = min(sizes, key=lambda wh: wh[0] * wh[1])
    large = max(sizes, key=lambda wh: wh[0] * wh[1])
    said = (f"{len(sizes)} sampled: {small[0]}x{small[1]} to {large[0]}x{large[1]} px, "
            f"{', '.join(modes)}")  # fmt: skip
    return said, min(min(wh) for wh in sizes)


def _label_folders(path: Path, warnings: list[str]) -> dict[str, int]:
    """Images per label folder under `path`; files elsewhere and other files are warned."""
    counts: dict[str, int] = {}
    top, other = 0, 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        parts = Path(dirpath).relative_to(path).parts
        for f in filenames:
            if f.startswith("."):
                continue
            if not parts:
                top += 1
            elif Path(f).suffix.lower() in IMAGE_EXTENSIONS:
                counts[parts[0]] = counts.get(parts[0], 0) + 1
            else:
                other += 1
    if len(counts) < 2:
        raise UsageError(
            f"--from {path}: {len(counts)} folder(s) of images; an image pilot reads one "
            "folder per label (at least 2), e.g. cat/*.jpg and dog/*.jpg"
        )
    if top:
        warnings.append(f"{path}: {top} file(s) at the top, in no label folder; `lorapilot "
                        "data` refuses them unless data.on_error is skip")  # fmt: skip
    if other:
        warnings.append(f"{path}: {other} file(s) without an image extension "
                        f"({', '.join(IMAGE_EXTENSIONS)}); `lorapilot data` refuses them unless "
                        "data.on_error is skip")  # fmt: skip
    rare = sorted(k for k, v in counts.items() if v < 3)
    if rare:
        warnings.append(f"label folder(s) with fewer than 3 images: {', '.join(rare)}")
    return counts


def image_yaml(
    name: str, image: ImageFolder, base: str, source: str | None, permission: str | None
) -> str:
    labels = image.labels
    counts = sorted(image.counts.values())
    out = [
        f"# {name}: scaffolded by `lorapilot init --from` from your images. Read every line",
        f"# marked `inferred`, then: lorapilot check {name} && lorapilot run {name}",
        f"name: {name}",
        "# The behaviour to improve, stated before any training: write what you expect.",
        "hypothesis: >-",
        *textwrap.wrap(
            "A LoRA adapter (with a new classification head) on the base model tells the "
            f"{len(labels)} classes apart clearly better than a linear probe on its frozen "
            "features, and no class gets worse.",
            width=90, initial_indent="  ", subsequent_indent="  ",
        ),
        "task:",
        "  kind: image_classification   # inferred: a folder per label",
        f"  # inferred: {len(labels)} labels (folder names), "
        + (f"{counts[0]} images each" if counts[0] == counts[-1] else
           f"{counts[0]} to {counts[-1]} images each"),
        f"  labels: {_wrapped(labels, '  ')}",
        f"  # the model's input, {image.size} px a side (smaller is faster)"
        + (f"; inferred from {image.seen}" if image.seen else ""),
        f"  image: {{size: {image.size}, resize: shorter_side, crop: center, mode: RGB, "
        "augment: [hflip]}",
        "model:",
        f"  base: {base}   # `lorapilot model fetch --image` installs the default",
        "data:",
        f"  source: {_q(source)}" if source else
        "  # source: where the images come from (a URL, a system, a date): `data` needs it",
        f"  permission: {_q(permission)}" if permission else
        "  # permission: the licence or internal approval to use them: `data` needs it",
    ]  # fmt: skip
    if image.splits:
        files = ", ".join(
            f"{_SPLITS[d.lower()]}: data/images/{d}" for d in image.splits
        )  # fmt: skip
        out.append(f"  files: {{{files}}}   # inferred: your split folders")
        if not any(_SPLITS[d.lower()] == "val" for d in image.splits):
            out.append("  split: {seed: 0, val: 0.15}")
    else:
        out.append("  file: data/images   # a copy of your folder, split by lorapilot")
        frac = 0.2 if sum(counts) < 1000 else 0.15
        out.append(f"  split: {{seed: 0, val: {frac}, test: {frac}}}   # stratified by label")
        out.append("  leakage: together   # copies of an image are kept in one split")
    if image.warnings:
        out.append("  # on_error: skip   # set aside what is not a labelled image, counted")
    out += [
        "adapter: {r: 16, alpha: 32}",
        "train: {lr: 3.0e-3, epochs: 3, micro_batch: 16}",
        "success: {metric: macro_f1, min_gain: 0.05}",
        "guards:",
        "  - {metric: per_category.f1, max_drop: 0.05}",
        "limits: {memory_gb: 8, time_hours: 1, usd_per_hour: 0, rental_days: 3}",
    ]
    if image.warnings:
        out.append("# Warnings when this was written:")
        out += [f"#   - {w}" for w in image.warnings]
    return "\n".join(out) + "\n"
