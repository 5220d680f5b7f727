"""`lorapilot init NAME --from FILE`: a pilot folder scaffolded from the user's own data.

The file is read (JSONL, a JSON array, CSV, Parquet; chat rows too), its input and answer
columns and the task they make are inferred (`data.infer`; a folder of images:
`data.image_folder`), the data is copied into the pilot's `data/` untouched, and pilot.yaml is
written (`spec.inferred_yaml`) with every inference commented beside its key, so the user
reads what was guessed before running anything. Nothing is written until the spec
validates: the folder appears whole (built beside it, then renamed) or not at all.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

from lorapilot.base.models import load_tokenizer_of, resolve_base
from lorapilot.data.image_folder import ImageFolder, sample_sizes, scan_image_folder
from lorapilot.data.infer import SPLIT_WORDS, Inferred, Prompted, infer
from lorapilot.data.load import FORMATS, file_rows
from lorapilot.data.rows import BadRow
from lorapilot.data.source import GLOB
from lorapilot.errors import UsageError
from lorapilot.spec import _NAME_RE, IMAGE_EXTENSIONS, EvalSpec, load_spec_file
from lorapilot.spec.inferred_yaml import (
    field_map,
    image_val_fraction,
    image_yaml,
    system_prompt,
    text_yaml,
    val_fraction,
)

TEXT_BASE = "smollm2-135m-instruct"
IMAGE_BASE = "efficientnet-lite0"
MAX_ROWS = 200_000
"""Rows read per file to infer from (the whole file is copied; `data` reads it all)."""
CHARS_PER_TOKEN = 3
"""A cautious guess for max_length before any tokenizer is loaded (English BPE: ~4)."""


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
    folder = Path(parent) / name
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder}: exists and is not empty")
    if len(sources or []) == 1 and Path(sources[0]).is_dir():
        if text or answer:
            raise UsageError("--text and --answer name columns of a data file, not of a folder")
        image = scan_image_folder(Path(sources[0]))
        yaml_text = image_yaml(name, image, base or IMAGE_BASE, source, permission)
        _build(folder, {}, {}, yaml_text, image.path, image.labels)
        return _image_result(image, folder, source, permission)
    files = _splits_of(sources)
    rows, unreadable, val_rows, per_file = [], [], [], {}
    for split, path in files.items():  # every split: a label only test holds is still a label
        got, bad = _read(path)
        rows += got
        per_file[split] = got
        val_rows = got if split == "val" else val_rows
        unreadable += [f"{where}: {problem}" for where, problem in bad]
    ids = None if text else _image_ids(next(iter(files.values())), rows)
    try:
        found = infer(rows, text=text, answer=answer, task=task, image=ids and ids[0])
        found.image_template = ids and ids[1]
    except ValueError as e:
        raise UsageError(f"{next(iter(files.values()))}: {e}") from None
    if unreadable:
        found.warnings.append(
            f"{len(unreadable)} row(s) could not be read ({unreadable[0]}); `lorapilot data` "
            "refuses them unless data.on_error is skip"
        )
    names = _copied_names(files)
    if found.labels:
        fraction = image_val_fraction if found.image else val_fraction
        _thin_validation(found, val_rows, fraction(found.n_rows))
    if found.image:
        return _from_image_table(name, folder, found, files, per_file, names, base,
                                 source, permission)  # fmt: skip
    base = base or TEXT_BASE
    max_length = max_length_for(found, system_prompt(found), base, Path(parent))
    yaml_text = text_yaml(name, found, names, base, max_length, source, permission)
    _build(folder, files, names, yaml_text, labels=found.labels)
    return {
        "pilot": str(folder),
        "spec": str(folder / "pilot.yaml"),
        "task": found.task,
        "n_examples": found.n_rows,
        "from": {split: str(p) for split, p in files.items()},
        "copied": {split: f"data/{n}" for split, n in names.items()},
        "fields": {k: v for k, v in field_map(found).items() if v is not None},
        "labels": found.labels,
        "label_counts": found.label_counts or None,
        "extraction_fields": [f["name"] for f in found.fields] if found.fields else None,
        "inferred": found.reasons,
        "to_state": [
            f"data.{k}" for k, v in (("source", source), ("permission", permission)) if not v
        ],  # fmt: skip
        "warnings": found.warnings,
    }


def _from_image_table(
    name: str,
    folder: Path,
    found: Inferred,
    files: dict[str, Path],
    per_file: dict[str, list[dict]],
    names: dict[str, str],
    base: str | None,
    source: str | None,
    permission: str | None,
) -> dict:
    """A pilot from a table of image paths and labels: the table copied as it is, and every
    image it names copied under the same relative path in the pilot folder, where `data`
    looks for it (the paths are read relative to the table's folder, its parent or the
    current folder; the table is never rewritten)."""
    copies: dict[str, Path] = {}
    missing: list[str] = []
    for split, path in files.items():
        got, lost = _image_files(path, per_file[split], found.image, names,
                                 found.image_template)  # fmt: skip
        copies.update(got)
        missing += lost
    if not copies:
        raise UsageError(
            f"{next(iter(files.values()))}: none of the images in column {found.image!r} is a "
            f"file (first: {missing[0]!r}), relative to the table's folder, its parent or the "
            "current one; write the paths relative to the table's folder"
        )
    if missing:
        found.warnings.append(
            f"{len(missing)} image path(s) in column {found.image!r} name no file (first: "
            f"{missing[0]!r}); `lorapilot data` refuses those rows unless data.on_error is skip"
        )
    seen, shortest = sample_sizes(sorted(copies.values()))
    image = ImageFolder(files[next(iter(files))], found.label_counts, {}, found.warnings,
                        seen, shortest)  # fmt: skip
    yaml_text = image_yaml(name, image, base or IMAGE_BASE, source, permission, (found, names))
    _build(folder, files, names, yaml_text, labels=found.labels, copies=copies)
    return {
        **_image_result(image, folder, source, permission),
        "n_examples": found.n_rows,
        "from": {split: str(p) for split, p in files.items()},
        "copied": {split: f"data/{n}" for split, n in names.items()},
        "images_copied": len(copies),
        "fields": field_map(found),
        "inferred": found.reasons,
    }


def _image_ids(table: Path, rows: list[dict], n: int = 20) -> tuple[str, str] | None:
    """(column, data.fields.image_template) where a column names image files by their id: a
    file `<value>.<image extension>` in the table's folder or a folder at most two below it,
    found for the first row and for 90% of the next `n` (`images.csv` beside
    `images/<uuid>.jpg`). The template is relative to the table's folder, as the copy is."""
    head = rows[: n + 1]
    root = table.parent
    for column, value in head[0].items() if head else ():
        if isinstance(value, bool) or not isinstance(value, str | int) or "{" in column:
            continue
        value = str(value)
        if not re.fullmatch(r"[\w.-]+", value):  # an id: no spaces, no path, no glob
            continue
        hits = [f for depth in ("", "*/", "*/*/") for f in root.glob(f"{depth}{value}.*")
                if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file()][:1]  # fmt: skip
        if not hits:
            continue
        folder = hits[0].parent.relative_to(root).as_posix()
        template = ("" if folder == "." else folder + "/") + f"{{{column}}}{hits[0].suffix}"
        found = sum((root / _filled(template, column, r.get(column))).is_file() for r in head)
        if found >= 0.9 * len(head):
            return column, template
    return None


def _filled(template: str, column: str, value: object) -> str:
    return template.replace(f"{{{column}}}", "" if value is None else str(value))


def _image_files(
    table: Path,
    rows: list[dict],
    column: str | None,
    names: dict[str, str],
    template: str | None = None,
) -> tuple[dict[str, Path], list[str]]:
    """{the path as the table writes it: the file}, and the paths that name no file. The
    paths are read relative to the table's folder, or (where that finds fewer) to its parent
    or the current folder; one that is absolute or leads up (`..`) cannot be a path inside
    a pilot folder."""
    if template is not None:  # ids the template turns into paths
        paths = [_filled(template, column, r.get(column)) for r in rows if r.get(column) != ""]
    else:
        paths = [r[column] for r in rows if isinstance(r.get(column), str) and r[column]]
    outside = [p for p in paths if Path(p).is_absolute() or ".." in Path(p).parts]
    if outside:
        raise UsageError(
            f"{table}: {len(outside)} image path(s) in column {column!r} are absolute or lead "
            f"up out of the folder (first: {outside[0]!r}); a pilot holds its images under "
            "paths relative to its folder: write them relative to the table's folder, or give "
            "--from a folder of images, one folder per label"
        )
    taken = {"pilot.yaml", "runs", *(f"data/{n}" for n in names.values())}
    clash = next((p for p in paths if Path(p).as_posix() in taken or Path(p).parts[0] == "runs"),
                 None)  # fmt: skip
    if clash is not None:
        raise UsageError(f"{table}: image path {clash!r} is a name the pilot folder keeps for "
                         "itself (pilot.yaml, runs/, the copied table)")  # fmt: skip
    roots = [table.parent, table.parent.parent, Path.cwd()]  # data/x.csv naming data/images/
    found = [sum((root / p).is_file() for p in paths[:200]) for root in roots]
    root = roots[found.index(max(found))]
    got: dict[str, Path] = {}
    lost: list[str] = []
    for p in paths:
        src = root / p
        if src.is_file():
            got[Path(p).as_posix()] = src
        else:
            lost.append(p)
    return got, lost


def _thin_validation(found: Inferred, val_rows: list[dict], val: float) -> None:
    """Labels with fewer validation examples than eval.min_support (counted in the given val
    file, else expected at data.split.val): a per-label guard cannot judge them, so a pilot
    guarded per label could end no better than INCONCLUSIVE (NLU++: 15 of 48 intents at val
    0.1). Sets `found.thin_validation` (the YAML then guards a pooled metric) and warns."""
    floor = EvalSpec.model_fields["min_support"].default
    if val_rows:
        try:
            counts = infer(val_rows, found.text, found.answer, found.task).label_counts
        except ValueError:
            counts = {}
        where = "in the validation file"
        expected = {k: counts.get(k, 0) for k in found.label_counts}
    else:
        where = f"at data.split.val {val}"
        expected = {k: round(n * val) for k, n in found.label_counts.items()}
    thin = {k: n for k, n in expected.items() if n < floor}
    if not thin:
        return
    found.thin_validation = thin
    shown = ", ".join(f"{k} ({n})" for k, n in sorted(thin.items(), key=lambda kv: kv[1])[:6])
    found.warnings.append(
        f"{len(thin)} of {len(found.labels or [])} labels have fewer than "
        f"eval.min_support={floor} validation examples {where} ({shown}"
        f"{', ...' if len(thin) > 6 else ''}): a per-label guard could not judge them, so the "
        "guard is a pooled metric; for per-label guards "
        + (
            "gather more validation examples of them"
            if val_rows
            else "raise data.split.val or gather more of them"
        )  # fmt: skip
    )


def _splits_of(sources: list[str]) -> dict[str, Path]:
    """`--from FILE` once: the one file, split by lorapilot. Several: each file's split from
    a `train=`/`val=`/`test=` prefix or from its name (train.csv, dev.jsonl, test.parquet)."""
    if not sources:
        raise UsageError("--from: give the data file to scaffold from")
    out: dict[str, Path] = {}
    for source in sources:
        split, _, rest = source.partition("=")
        if rest and split in SPLIT_WORDS and not Path(source).exists():
            split, path = SPLIT_WORDS[split], Path(rest)
        else:
            path = Path(source)
            words = re.findall(r"[a-z]+", path.stem.lower())
            split = next((SPLIT_WORDS[w] for w in words if w in SPLIT_WORDS), None) or (
                "file" if len(sources) == 1 else ""
            )
            if not split:
                raise UsageError(
                    f"--from {source}: cannot tell which split this file is from its name; "
                    "write train=PATH, val=PATH or test=PATH"
                )
        if split in out:
            raise UsageError(f"--from {source}: a second {split} file ({out[split]} is one)")
        if GLOB.search(str(path.parent)):
            raise UsageError(f"--from {path}: a pattern names files of one folder "
                             "(data/train-*.parquet), not folders")  # fmt: skip
        if not members(path):
            raise UsageError(
                f"--from {path}: "
                + ("the pattern matches no file" if GLOB.search(path.name) else "no such file")
                + " (a JSONL, CSV or Parquet file; quote a pattern: 'data/train-*.parquet')"
            )
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


def members(path: Path) -> list[Path]:
    """The files a --from path stands for: itself, or what its pattern matches (the shards
    a data set is published in), in name order, hidden ones left out."""
    if not GLOB.search(path.name):
        return [path] if path.is_file() else []
    return sorted(
        p for p in path.parent.glob(path.name) if p.is_file() and not p.name.startswith(".")
    )  # fmt: skip


def _read(path: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    rows, bad = [], []
    for member in members(path):
        try:
            for line, row in file_rows(member, FORMATS[member.suffix.lower()], str(member)):
                if isinstance(row, BadRow):
                    bad.append((f"{member}:{line}", str(row)))
                else:
                    rows.append(row)
                if len(rows) >= MAX_ROWS:
                    return rows, bad
        except OSError as e:
            raise UsageError(f"{member}: cannot read: {e.strerror or e}") from None
    return rows, bad


def _copied_names(files: dict[str, Path]) -> dict[str, str]:
    """Each split's path in data/: the file's name; a pattern's shards in a folder of the
    split's name (`data/train/train-*.parquet`) where there are several splits."""
    names = {split: p.name for split, p in files.items()}
    if len(set(names.values())) < len(names):  # train/data.csv and test/data.csv
        names = {split: f"{split}-{n}" for split, n in names.items()}
    return {
        split: f"{split}/{files[split].name}"
        if GLOB.search(files[split].name) and split != "file"  # one split: no clash
        else n
        for split, n in names.items()
    }


def _build(
    folder: Path,
    files: dict[str, Path],
    names: dict[str, str],
    yaml_text: str,
    images: Path | None = None,
    labels: list[str] | None = None,
    copies: dict[str, Path] | None = None,
) -> None:
    """Everything in a temp folder beside the pilot, validated (and its labels read back as
    inferred: a label YAML would read otherwise is a lorapilot bug, not the user's), then
    renamed into place."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / "data").mkdir()
        for split, path in files.items():
            for member in members(path):  # a pattern's shards keep their names, beside it
                to = tmp / "data" / Path(names[split]).parent / member.name
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(member, to)
        if images is not None:  # hidden files and folders stay behind, as `data` skips them
            shutil.copytree(images, tmp / "data" / "images", ignore=_hidden)
        for rel, src in (copies or {}).items():  # a table's images, where its paths say
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / rel)
        (tmp / "pilot.yaml").write_text(yaml_text, encoding="utf-8")
        spec, _ = load_spec_file(tmp / "pilot.yaml")  # what we scaffold must validate
        if labels is not None and spec.task.labels != labels:
            raise RuntimeError("init --from wrote labels that read back otherwise")
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

    def prompt(asked: Prompted) -> str:
        said = [("user", asked)] if isinstance(asked, str) else list(asked)
        turns = [{"role": "system", "content": system}]
        turns += [{"role": role, "content": text} for role, text in said]
        try:
            return tok.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception:  # no template, or one that refuses a system turn: the texts alone
            return "\n".join([system, *(text for _, text in said)]) + "\n"

    inputs = max(len(tok(prompt(t))["input_ids"]) for t in found.longest_inputs)
    answers = max(len(tok(a, add_special_tokens=False)["input_ids"]) for a in found.longest_answers)
    return inputs + answers + 2  # + the end of turn


def _image_result(
    image: ImageFolder, folder: Path, source: str | None, permission: str | None
) -> dict:
    return {
        "pilot": str(folder),
        "spec": str(folder / "pilot.yaml"),
        "task": "image_classification",
        "n_examples": sum(image.counts.values()),
        "from": {"folder": str(image.path)},
        "copied": {"folder": "data/images"},
        "fields": {},
        "labels": image.labels,
        "label_counts": dict(sorted(image.counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        "extraction_fields": None,
        "inferred": [
            f"task: image_classification (a folder per label: {len(image.counts)} labels)",
            *([f"splits: the folders {', '.join(image.splits.values())}"] if image.splits else []),
        ],
        "to_state": [
            f"data.{k}" for k, v in (("source", source), ("permission", permission)) if not v
        ],
        "warnings": image.warnings,
    }
