"""Where a pilot's data is, found and checked without reading a record: `lorapilot check`
catches a missing or unreadable source in a second, before any long run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lorapilot.data.split import SPLITS
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, Pilot, TaskSpec

GLOB = re.compile(r"[*?\[]")
"""A data path holding one of these is a pattern: the files it matches (shards)."""


def file_sources(pilot: Pilot) -> list[tuple[str, str, str | None]]:
    """(spec key, path relative to the pilot, split) of every data file or saved folder: the
    list the loaders read and `check` looks at. A pattern (`data/train-*.parquet`, the
    shards a dataset is published in) stands for the files it matches, in name order."""
    data = pilot.spec.data
    if data.file:
        given = [("data.file", data.file, None)]
    elif data.files is None:
        return []
    else:
        given = [
            (f"data.files.{s}", getattr(data.files, s), s)
            for s in SPLITS
            if getattr(data.files, s)
        ]  # fmt: skip
    out = []
    for key, rel, split in given:
        matched = _matches(pilot, key, rel) if GLOB.search(rel) else [rel]
        out += [(key, m, split) for m in matched]
    return out


def _matches(pilot: Pilot, key: str, pattern: str) -> list[str]:
    """The files a pattern matches under the pilot folder (hidden ones left out), relative
    to it; none is an error naming the pattern."""
    pilot.path(GLOB.split(pattern)[0] or ".", key)  # inside the pilot folder, or refused
    found = sorted(
        p.relative_to(pilot.dir).as_posix()
        for p in pilot.dir.glob(pattern)
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(pilot.dir).parts)
    )  # fmt: skip
    if not found:
        raise UsageError(
            f"{pilot.spec_path}: {key}: the pattern {pattern!r} matches no file in the pilot "
            f"folder {pilot.dir}"
        )
    return found


def check_data_source(pilot: Pilot) -> dict:
    """Find the spec's data without reading a record: `check` catches a missing or unreadable
    source before any long run. Paths resolve as the loaders resolve them (`Pilot.path` for
    data.file/files, `hf.cache_dir` and `hf.cache_tables` for data.hf_dataset), so what is
    checked is what `data` will read. No model, no tokenizer, no records parsed.

    -> {"kind": file|files|hf_dataset, "sources": [{key, path, resolved, exists, type, ...}]};
    every problem found goes into one UsageError naming the spec key and the resolved path.
    """
    data = pilot.spec.data
    if data.hf_dataset:
        return {"kind": "hf_dataset", "sources": [_cached_source(pilot)]}
    sources: list[dict] = []
    problems: list[str] = []
    for key, rel, _split in file_sources(pilot):
        path = pilot.path(rel, key)
        entry: dict[str, Any] = {
            "key": key,
            "path": rel,
            "resolved": str(path),
            "exists": path.exists(),
        }
        sources.append(entry)
        problem = _file_problem(path, entry, data, pilot.spec.task)
        if problem:
            problems.append(f"{key}: {rel!r} ({path}): {problem}")
    if problems:
        raise UsageError(f"{pilot.spec_path}: data source not usable: " + "; ".join(problems))
    return {"kind": "file" if data.file else "files", "sources": sources}


def _file_problem(path: Path, entry: dict, data: DataSpec, task: TaskSpec) -> str | None:
    """What `load_records` would refuse in this path before reading a record, or None;
    fills `entry` with what was found (type, format, bytes, n_files)."""
    if not entry["exists"]:
        return "no such data file or folder"
    if path.is_dir():
        from lorapilot.data import hf

        kind = hf.saved_kind(path) if data.format in ("auto", "datasets") else None
        if kind is None and task.modality == "image" and data.format == "auto":
            files = [f for f in path.rglob("*") if f.is_file() and not f.name.startswith(".")]
            entry.update(
                type="image_folder",
                format="image_folder",
                classes=sorted(p.name for p in path.iterdir() if p.is_dir()),
                n_files=len(files),
                bytes=sum(f.stat().st_size for f in files),
            )
            return None if files else "an image folder with no files in it"
        if kind is None:
            if data.format not in ("auto", "datasets"):
                return f"a folder, not a {data.format} file"
            return (
                f"a folder, but not one written by datasets' save_to_disk "
                f"(no {hf.DICT_META}, or {' and '.join(hf.DATASET_META)}, in it)"
            )
        files = [f for f in path.rglob("*") if f.is_file()]
        entry.update(
            type="save_to_disk",
            saved_kind=kind,
            format="datasets",
            n_files=len(files),
            bytes=sum(f.stat().st_size for f in files),
        )
        if not hf.installed():
            return hf.missing_message("a datasets save_to_disk folder")
        return None
    if not path.is_file():
        return "not a regular file"
    from lorapilot.data.load import detect_format

    entry.update(type="file", n_files=1, bytes=path.stat().st_size)
    try:
        fmt = detect_format(path, data)
    except UsageError as e:
        return str(e).removeprefix(f"{path}: ")
    entry["format"] = fmt
    if fmt == "datasets":
        return "data.format is datasets, so this must be the folder save_to_disk wrote, not a file"
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if entry["bytes"] == 0:
        return "empty file (0 bytes): no records"
    from lorapilot.data.load import header_of
    from lorapilot.data.rows import require_columns

    names = header_of(path, fmt)  # the header alone: a column data.fields names, missing
    if names is not None:
        entry["columns"] = names
        try:
            require_columns(names, data, task, "")
        except UsageError as e:
            return str(e).removeprefix(": ")
    return None


def _cached_source(pilot: Pilot) -> dict:
    """data.hf_dataset: opened from the local cache offline as `data` opens it (splits chosen,
    no rows read) -> where it is, its splits and row counts, its arrow files."""
    from lorapilot.data import hf as hfdata

    hf = pilot.spec.data.hf_dataset
    assert hf is not None
    cache = hfdata.cache_dir(hf, pilot.dir)
    try:
        tables = hfdata.cache_tables(hf, pilot.dir)
    except UsageError as e:  # the loader's message names the key and the cache folder
        raise UsageError(f"{pilot.spec_path}: {e}") from None
    files = sorted({f["filename"] for t in tables for f in t.ds.cache_files})
    return {
        "key": "data.hf_dataset",
        "name": hf.name,
        "config": hf.config,
        "resolved": str(cache),
        "exists": True,
        "type": "hf_cache",
        "splits": [{"split": t.split, "source": t.shown, "rows": t.ds.num_rows} for t in tables],
        "n_files": len(files),
        "bytes": sum(Path(f).stat().st_size for f in files),
    }
