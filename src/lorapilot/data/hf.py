"""Rows from Hugging Face `datasets`: a `save_to_disk` folder, or a dataset in the local HF
cache read by name.

`datasets` is an optional extra (`pip install 'lorapilot[datasets]'`), imported here only when a
pilot uses it. Its rows go through load.py's record builder, so field mapping, policies and
messages are those of JSONL/CSV/Parquet. Nothing here uses the network: the cache is read
with datasets' offline mode forced on (what HF_DATASETS_OFFLINE=1 does) for the call.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapilot.data.images import embedded_image_path
from lorapilot.data.rows import (
    BadRow,
    Record,
    RecordBuilder,
    Skipped,
    collect_rows,
    jsonable,
    read_columns,
    require_columns,
)
from lorapilot.errors import UsageError
from lorapilot.fsutil import sha256_file, sha256_json
from lorapilot.spec import DataSpec, HFDataset, TaskSpec

DICT_META = "dataset_dict.json"  # written by DatasetDict.save_to_disk
DATASET_META = ("dataset_info.json", "state.json")  # written by Dataset.save_to_disk
VAL_NAMES = ("validation", "val", "valid", "dev")
EXTRA = "pip install 'lorapilot[datasets]'"


@dataclass
class Table:
    """One split of an HF dataset, named as messages and `Record.source` show it."""

    ds: Any  # datasets.Dataset
    shown: str  # e.g. data/tickets_ds/validation or org/name[validation]
    stem: str  # default ids are "<stem>-<row>", as for a file
    split: str | None  # ours (train/val/test), None when lorapilot splits it


def saved_kind(path: Path) -> str | None:
    """`dataset_dict`, `dataset` or None: what save_to_disk wrote in this folder, if anything."""
    if (path / DICT_META).is_file():
        return "dataset_dict"
    if all((path / name).is_file() for name in DATASET_META):
        return "dataset"
    return None


def missing_message(what: str) -> str:
    return f"{what} is read with the `datasets` package, which is not installed: {EXTRA}"


def installed() -> bool:
    """Whether `import datasets` would work, without importing it (seconds): `check` asks."""
    import importlib.util
    import sys

    if "datasets" in sys.modules:  # None there means an import of it is refused
        return sys.modules["datasets"] is not None
    return importlib.util.find_spec("datasets") is not None


def _datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise UsageError(missing_message(what)) from None
    return datasets


# --------------------------------------------------------------------------- which split is which


def pick_splits(names: list[str], where: str, hint: str) -> dict[str | None, str]:
    """{our split: their split}: train + validation (+ test) as they are, or the only split
    divided by lorapilot (key None). Anything else is ambiguous: the user says (`hint`)."""
    if len(names) == 1:
        return {None: names[0]}
    val = next((n for n in VAL_NAMES if n in names), None)
    if "train" in names and val:
        out: dict[str | None, str] = {"train": "train", "val": val}
        if "test" in names:
            out["test"] = "test"
        return out
    raise UsageError(
        f"{where}: splits {', '.join(names)}: cannot tell which is train and which is "
        f"validation (expected train and one of {', '.join(VAL_NAMES)}); {hint}"
    )


def _check_split(names: list[str], name: str, key: str, where: str) -> str:
    if name not in names:
        raise UsageError(f"{key}: {where} has no split {name!r} (splits: {', '.join(names)})")
    return name


# --------------------------------------------------------------------------- a save_to_disk folder


def saved_tables(path: Path, shown: str, key: str, split: str | None) -> list[Table]:
    """The tables of a save_to_disk folder; `split` is set when it is one of data.files."""
    datasets = _datasets(f"{key}: {shown} (a datasets save_to_disk folder)")
    try:
        obj = datasets.load_from_disk(str(path))
    except Exception as e:  # corrupt or foreign metadata: datasets raises many kinds
        raise UsageError(
            f"{key}: {shown}: cannot read the saved datasets folder: {type(e).__name__}: {e}"
        ) from None
    if not isinstance(obj, datasets.DatasetDict):
        return [Table(obj, shown, path.name, split)]
    names = list(obj)
    if split is not None:
        raise UsageError(
            f"{key}: {shown} holds a DatasetDict (splits: {', '.join(names)}); point it at one "
            f"split's folder, e.g. {shown}/{names[0]}"
        )
    hint = (
        f"use data.files with the split folders instead, e.g. files: {{train: {shown}/{names[0]}, "
        f"val: {shown}/{names[-1]}}}"
    )
    return [
        Table(obj[theirs], f"{shown}/{theirs}", theirs, ours)
        for ours, theirs in pick_splits(names, f"{key}: {shown}", hint).items()
    ]


# --------------------------------------------------------------------------- the local HF cache


def cache_dir(hf: HFDataset, pilot_dir: Path | None = None) -> Path:
    """data.hf_dataset.cache_dir (relative to the pilot folder), else the datasets default,
    read from the environment now (datasets reads it once, at import)."""
    if hf.cache_dir:
        p = Path(hf.cache_dir).expanduser()
        return p if p.is_absolute() or pilot_dir is None else pilot_dir / p
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "datasets"


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """datasets' offline mode for this call only; its notes about using the cache are muted."""
    cfg, log = datasets.config, datasets.utils.logging
    was_offline, verbosity = cfg.HF_HUB_OFFLINE, log.get_verbosity()
    cfg.HF_HUB_OFFLINE = True
    log.set_verbosity_error()
    try:
        yield
    finally:
        cfg.HF_HUB_OFFLINE = was_offline
        log.set_verbosity(verbosity)


def cache_tables(hf: HFDataset, pilot_dir: Path | None = None) -> list[Table]:
    """The splits of a cached dataset, as data.hf_dataset selects them. Offline only."""
    datasets = _datasets("data.hf_dataset")
    try:
        from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES as builders
    except ImportError:  # a private name: without it, only this early check is lost
        builders = {}

    key = "data.hf_dataset"
    if hf.name in builders:
        raise UsageError(
            f"{key}.name: {hf.name!r} is a datasets file format, not a dataset id; for a data "
            "file use data.file"
        )
    cache = cache_dir(hf, pilot_dir)
    missing = (
        f"{key}.name: {hf.name!r} is not in the local HF datasets cache {cache}; lorapilot reads "
        "datasets offline only. Load it once where there is network with the same cache "
        f"(datasets.load_dataset({hf.name!r})), or save it into the pilot folder with save_to_disk "
        "and set data.file to that folder"
    )
    if not cache.is_dir():
        raise UsageError(missing)
    with _offline(datasets):
        try:
            # "hf://datasets/" keeps datasets from reading a same-named folder of the cwd instead
            dd = datasets.load_dataset(f"hf://datasets/{hf.name}", hf.config, cache_dir=str(cache))
        except (ConnectionError, FileNotFoundError):
            raise UsageError(missing) from None
        except ValueError as e:  # config not cached, or several cached and none chosen
            why = " ".join(str(e).split("\n")[:2])
            raise UsageError(
                f"{key}.config: {why} (in {cache}); set data.hf_dataset.config"
            ) from None
        except Exception as e:  # a torn cache folder: datasets raises many kinds
            raise UsageError(
                f"{key}: cannot read {hf.name!r} from {cache}: {type(e).__name__}: {e}"
            ) from None
    names = list(dd)
    where = f"{hf.name}" + (f" ({hf.config})" if hf.config else "")
    if hf.split:
        chosen: dict[str | None, str] = {None: _check_split(names, hf.split, f"{key}.split", where)}
    elif hf.splits:
        s = hf.splits
        chosen = {
            "train": _check_split(names, s.train, f"{key}.splits.train", where),
            "val": _check_split(names, s.val, f"{key}.splits.val", where),
        }
        if s.test:
            chosen["test"] = _check_split(names, s.test, f"{key}.splits.test", where)
    else:
        chosen = pick_splits(
            names, f"{key}: {where}", "set data.hf_dataset.splits (or .split to divide one)"
        )
    stem = hf.name.split("/")[-1]
    return [
        Table(dd[theirs], f"{hf.name}[{theirs}]", f"{stem}-{theirs}", ours)
        for ours, theirs in chosen.items()
    ]


# --------------------------------------------------------------------------- rows -> records


def _rows(
    table: Table,
    data: DataSpec,
    task: TaskSpec,
    pilot_dir: Path | None = None,
    answers: bool = True,
) -> Iterator[tuple[int, dict | BadRow]]:
    """(row number, column -> JSON value); ClassLabel integers (also in a list of them)
    become their names; an `Image`
    column's embedded bytes become a file in the pilot folder, named by its path."""
    import pyarrow as pa

    ds = table.ds
    names = list(ds.column_names)
    require_columns(names, data, task, table.shown, answers)
    wanted = read_columns(data, task, names, answers)
    image_cols = [c for c, f in ds.features.items() if c in wanted and type(f).__name__ == "Image"]
    if image_cols and pilot_dir is None:
        raise UsageError(f"{table.shown}: an Image column is read only inside a pilot folder")
    class_names = {c: f.names for c, f in ds.features.items() if c in wanted and _is_class(f)}
    # a list of ClassLabel (`List`, or `Sequence` in older datasets): a multi-label column
    class_lists = {
        c: f.feature.names
        for c, f in ds.features.items()
        if c in wanted and _is_class(getattr(f, "feature", None))
    }
    row = 0
    try:
        # Arrow batches, not Python rows of every column: memory stays flat, nothing is decoded
        for batch in ds.select_columns(wanted).with_format("arrow").iter(batch_size=1024):
            for values in batch.to_pylist():
                row += 1
                for c, labels in class_names.items():
                    v = values.get(c)
                    if isinstance(v, int):
                        values[c] = labels[v] if 0 <= v < len(labels) else None
                for c, labels in class_lists.items():
                    v = values.get(c)
                    if isinstance(v, list):
                        values[c] = [_class_name(labels, x) for x in v]
                for c in image_cols:
                    assert pilot_dir is not None
                    values[c] = embedded_image_path(pilot_dir, values.get(c))
                yield row, {k: jsonable(v) for k, v in values.items()}
    except pa.ArrowException as e:
        raise UsageError(f"{table.shown}:row {row + 1}: cannot read the data: {e}") from None


def _is_class(feature: Any) -> bool:
    return type(feature).__name__ == "ClassLabel"


def _class_name(names: list[str], v: Any) -> Any:
    """A ClassLabel integer's name; anything else as it is (the row check names it)."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(names):
        return names[v]
    return v


def table_records(
    tables: list[Table],
    task: TaskSpec,
    data: DataSpec,
    pilot_dir: Path | None = None,
    answers: bool = True,
) -> tuple[list[Record], list[Skipped]]:
    """Every table through the same record builder and policies as a data file (`answers`
    False: inputs to predict, their label or target optional)."""
    records: list[Record] = []
    skipped: list[Skipped] = []
    for t in tables:
        builder = RecordBuilder(
            task, data, t.shown, t.stem, t.split, row_numbers=True, answers=answers
        )
        recs, skips = collect_rows(
            _rows(t, data, task, pilot_dir, answers),
            builder,
            data,
            t.shown,
            row_numbers=True,
            empty="no rows in this dataset split",
        )
        records += recs
        skipped += skips
    return records, skipped


def load_saved(
    path: Path,
    task: TaskSpec,
    data: DataSpec,
    split: str | None,
    shown: str,
    key: str = "data.file",
    pilot_dir: Path | None = None,
    answers: bool = True,
) -> tuple[list[Record], list[Skipped]]:
    return table_records(saved_tables(path, shown, key, split), task, data, pilot_dir, answers)


def load_cached(
    hf: HFDataset, task: TaskSpec, data: DataSpec, pilot_dir: Path | None = None
) -> tuple[list[Record], list[Skipped]]:
    return table_records(cache_tables(hf, pilot_dir), task, data, pilot_dir)


# --------------------------------------------------------------------------- version


def arrow_hash(tables: list[Table]) -> str:
    """One hash of the arrow files behind the tables: any change to the data changes it.
    Files are named relative to their split folder, so a moved pilot keeps its hash."""
    files: dict[str, str] = {}
    for t in tables:
        for f in t.ds.cache_files:
            p = Path(f["filename"])
            files[f"{t.shown}/{p.name}"] = sha256_file(p)
        if not t.ds.cache_files:  # held in memory (never the case for disk and cache loads)
            files[t.shown] = t.ds._fingerprint
    return sha256_json(files)
