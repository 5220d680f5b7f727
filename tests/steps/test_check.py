"""`lorapilot check`: besides the spec, it finds the data source (files exist and can be read,
a saved folder is one, an HF dataset is cached) before any long run, without the model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, run_cli, run_json

from lorapilot.data.source import check_data_source
from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot

TICKETS = EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl"


def _pilot(folder: Path, data: dict, **spec_keys) -> Path:
    """The ticket-triage spec with another data source; its data file copied in as data/t.jsonl.
    The base model is a folder that does not exist: `check` must never need it."""
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    spec["data"] = {k: v for k, v in spec["data"].items() if k not in ("file", "files")} | data
    spec["model"] = {"base": str(folder / "no-such-model")}
    spec.update(spec_keys)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy(TICKETS, folder / "data" / "t.jsonl")
    (folder / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def _error(pilot: Path) -> str:
    with pytest.raises(UsageError) as e:
        check_data_source(load_pilot(pilot))
    return str(e.value)


# --------------------------------------------------------------------------- through the CLI


def test_check_reports_the_data_file_it_found(tmp_path):
    pilot = _pilot(tmp_path / "p", {"file": "data/t.jsonl"})
    out = run_json("check", str(pilot))
    src = out["data_source"]
    assert src["kind"] == "file"
    assert src["sources"] == [
        {
            "key": "data.file",
            "path": "data/t.jsonl",
            "resolved": str((pilot / "data" / "t.jsonl").resolve()),
            "exists": True,
            "type": "file",
            "n_files": 1,
            "bytes": TICKETS.stat().st_size,
            "format": "jsonl",
        }
    ]
    assert out["ok"] and out["name"] == "ticket-triage"  # the spec keys are still there
    human = run_cli("check", str(pilot))
    assert (
        human.returncode == 0
        and f"data: data.file data/t.jsonl (jsonl, 1 file(s), {TICKETS.stat().st_size} bytes)"
        in human.stdout
    )


def test_check_exits_2_naming_the_key_and_resolved_path_of_a_missing_file(tmp_path):
    pilot = _pilot(tmp_path / "p", {"file": "data/missing.jsonl"})
    out = run_json("check", str(pilot), expect=2)
    resolved = (pilot / "data" / "missing.jsonl").resolve()
    assert out["error"] == (
        f"{(pilot / 'pilot.yaml').resolve()}: data source not usable: data.file: "
        f"'data/missing.jsonl' ({resolved}): no such data file or folder"
    )
    assert out["exit_code"] == 2 and not (pilot / "runs").exists()
    # the same through --set, and without --json (no traceback, the message on stderr)
    proc = run_cli("check", str(tmp_path / "p"), "--set", "data.file=data/other.jsonl")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "data.file: 'data/other.jsonl'" in " ".join(proc.stderr.split())


def test_check_loads_neither_model_nor_tokenizer_nor_records(tmp_path):
    """In one process: after `check`, no torch/transformers/tokenizers module was imported."""
    pilot = _pilot(tmp_path / "p", {"file": "data/t.jsonl"})
    code = (
        "import sys, json; from typer.testing import CliRunner; from lorapilot.cli import app; "
        f"r = CliRunner().invoke(app, ['check', {str(pilot)!r}, '--json']); "
        "assert r.exit_code == 0, r.output; assert "
        "json.loads(r.stdout)['data_source']['sources'][0]['exists']; "
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'datasets') if m in "
        "sys.modules]; "
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- the checks themselves


def test_pre_split_files_are_all_checked_and_every_missing_one_named(tmp_path):
    pilot = _pilot(
        tmp_path / "p",
        {"files": {"train": "data/t.jsonl", "val": "data/val.jsonl", "test": "data/test.csv"}},
    )
    msg = _error(pilot)
    assert "data.files.train" not in msg
    assert (
        f"data.files.val: 'data/val.jsonl' ({(pilot / 'data' / 'val.jsonl').resolve()}): no such "
        "data file" in msg
    )
    assert (
        f"data.files.test: 'data/test.csv' ({(pilot / 'data' / 'test.csv').resolve()}): no such "
        "data file" in msg
    )
    shutil.copy(TICKETS, pilot / "data" / "val.jsonl")
    (pilot / "data" / "test.csv").write_text("text,label\nhello,billing\n")
    found = check_data_source(load_pilot(pilot))
    assert found["kind"] == "files"
    assert [(s["key"], s["format"], s["exists"]) for s in found["sources"]] == [
        ("data.files.train", "jsonl", True),
        ("data.files.val", "jsonl", True),
        ("data.files.test", "csv", True),
    ]


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
        (lambda p: p.mkdir(), "a folder, but not one written by datasets' save_to_disk"),
        (lambda p: os.mkfifo(p), "not a regular file"),
    ],
)
def test_a_path_the_loader_would_refuse_is_refused_by_check(tmp_path, make, needle):
    pilot = _pilot(tmp_path / "p", {"file": "data/x.jsonl"})
    make(pilot / "data" / "x.jsonl")
    msg = _error(pilot)
    assert (
        f"data.file: 'data/x.jsonl' ({(pilot / 'data' / 'x.jsonl').resolve()}): {needle}" in msg
    ), msg


def test_an_unknown_extension_or_an_unreadable_file_is_refused(tmp_path, monkeypatch):
    pilot = _pilot(tmp_path / "p", {"file": "data/t.txt"})
    shutil.copy(TICKETS, pilot / "data" / "t.txt")
    assert "data.file: 'data/t.txt' (" in _error(
        pilot
    ) and "cannot tell the format from the extension '.txt'" in _error(pilot)

    pilot2 = _pilot(tmp_path / "p2", {"file": "data/t.jsonl"})
    real_open = Path.open

    def refuse(self, *a, **k):  # root reads a chmod-000 file anyway: refuse the open instead
        if self.name == "t.jsonl":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *a, **k)

    monkeypatch.setattr(Path, "open", refuse)
    assert "data.file: 'data/t.jsonl' (" in _error(
        pilot2
    ) and "cannot read: Permission denied" in _error(pilot2)


def test_a_path_outside_the_pilot_folder_is_refused_as_the_loader_refuses_it(tmp_path):
    _pilot(tmp_path / "p", {"file": "../outside.jsonl"})
    shutil.copy(TICKETS, tmp_path / "outside.jsonl")
    out = run_json("check", str(tmp_path / "p"), expect=2)
    assert "data.file: '../outside.jsonl' points outside the pilot folder" in out["error"]


# --------------------------------------------------------------------------- HF datasets


def test_save_to_disk_folders(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(x) for x in TICKETS.read_text().splitlines()[:40]]
    pilot = _pilot(tmp_path / "p", {"file": "data/ds"})
    msg = _error(pilot)  # not saved yet
    assert (
        f"data.file: 'data/ds' ({(pilot / 'data' / 'ds').resolve()}): no such data file or folder"
        in msg
    )
    datasets.Dataset.from_list(rows).save_to_disk(str(pilot / "data" / "ds"))
    (src,) = check_data_source(load_pilot(pilot))["sources"]
    files = [f for f in (pilot / "data" / "ds").rglob("*") if f.is_file()]
    assert src["type"] == "save_to_disk" and src["saved_kind"] == "dataset" and src["exists"]
    assert src["n_files"] == len(files) >= 3 and src["bytes"] == sum(
        f.stat().st_size for f in files
    )
    # without the datasets package, check says so (the data verb would fail on it)
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert "which is not installed: pip install 'lorapilot[datasets]'" in _error(pilot)


def _cache(root: Path, name: str = "acme/ticket-tiny") -> Path:
    """A dataset laid out as datasets caches one it downloaded (as tests/data/test_hf_datasets
    does): built with the packaged JSON builder, no network, then moved under the hub id."""
    from datasets.packaged_modules.json.json import Json

    org, short = name.split("/")
    lines = TICKETS.read_text().splitlines(keepends=True)
    files = {}
    for split, part in (("train", lines[:60]), ("validation", lines[60:80])):
        files[split] = str(root / "_src" / f"{split}.jsonl")
        Path(files[split]).parent.mkdir(parents=True, exist_ok=True)
        Path(files[split]).write_text("".join(part))
    builder = Json(
        cache_dir=str(root / "_build"),
        dataset_name=short,
        config_name="default",
        config_id="default",
        hash="0123456789abcdef",
        data_files=files,
    )
    builder.download_and_prepare()
    (root / f"{org}___{short}").mkdir()
    shutil.move(
        str(root / "_build" / short / "default"), str(root / f"{org}___{short}" / "default")
    )
    return root


def test_hf_dataset_must_be_in_the_local_cache(tmp_path):
    pytest.importorskip("datasets")
    empty = tmp_path / "empty-cache"
    pilot = _pilot(
        tmp_path / "p", {"hf_dataset": {"name": "acme/not-downloaded", "cache_dir": str(empty)}}
    )
    out = run_json("check", str(pilot), expect=2)
    assert out["error"].startswith(
        f"{(pilot / 'pilot.yaml').resolve()}: data.hf_dataset.name: "
        f"'acme/not-downloaded' is not in the local HF datasets cache {empty}"
    )


def test_a_cached_hf_dataset_is_reported_with_its_splits(tmp_path):
    pytest.importorskip("datasets")
    cache = _cache(tmp_path / "cache")
    pilot = _pilot(
        tmp_path / "p", {"hf_dataset": {"name": "acme/ticket-tiny", "cache_dir": str(cache)}}
    )
    out = run_json("check", str(pilot))
    (src,) = out["data_source"]["sources"]
    assert out["data_source"]["kind"] == "hf_dataset"
    assert src["key"] == "data.hf_dataset" and src["resolved"] == str(cache) and src["exists"]
    assert src["splits"] == [
        {"split": "train", "source": "acme/ticket-tiny[train]", "rows": 60},
        {"split": "val", "source": "acme/ticket-tiny[validation]", "rows": 20},
    ]
    assert src["n_files"] == 2 and src["bytes"] > 0
    # a split that is not there: the loader's message, prefixed with the spec file
    bad = _pilot(
        tmp_path / "bad",
        {"hf_dataset": {"name": "acme/ticket-tiny", "cache_dir": str(cache), "split": "dev"}},
    )
    assert _error(bad).endswith(
        "data.hf_dataset.split: acme/ticket-tiny has no split 'dev' (splits: train, validation)"
    )


def test_check_says_number_or_integer_by_the_key_and_bounds_what_it_can(tmp_path):
    """#35 item 12: `train.lr: -1` is a number, `adapter.r: -1` an integer; an absurd epoch
    count and a rank larger than the base's smallest adapted dimension are refused by `check`
    (from the base's config.json), not much later."""
    import shutil

    from conftest import EXAMPLES

    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))

    def error(*sets: str) -> str:
        args = [a for s in sets for a in ("--set", s)]
        return run_json("check", str(pilot), *args, expect=2)["error"]

    assert "train.lr: must be a positive number (got -1)" in error("train.lr=-1")
    assert "adapter.r: must be a positive integer (got -1)" in error("adapter.r=-1")
    assert "train.epochs: must be at most 1000" in error("train.epochs=1e9")
    msg = error("adapter.r=100000")
    assert "adapter.r: 100000 is larger than the smallest dimension it adapts (192" in msg
    assert run_json("check", str(pilot), "--set", "adapter.r=192")["ok"]


def test_a_column_the_csv_or_parquet_file_lacks_is_named_from_its_header(tmp_path):
    """The header (CSV) or schema (Parquet) alone, no record: a column data.fields or
    data.fields.text_template names and the file lacks is refused before any long run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pilot = _pilot(tmp_path / "p", {"file": "data/t.csv", "fields": {"label": "queue"}})
    (pilot / "data" / "t.csv").write_text("id,body,queue\n1,printer on fire,technical\n")
    err = _error(pilot)
    assert "data.file: 'data/t.csv'" in err
    assert "no column 'text' (columns: id, body, queue); set data.fields" in err
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["fields"] = {"text_template": "{subject}\n{body}", "label": "queue"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "no column 'subject' (columns: id, body, queue)" in _error(pilot)
    (pilot / "data" / "t.csv").write_text("id,subject,body,queue\n1,Help,on fire,technical\n")
    (src,) = check_data_source(load_pilot(pilot))["sources"]
    assert src["columns"] == ["id", "subject", "body", "queue"]
    pq.write_table(pa.table({"id": [1], "body": ["x"], "queue": ["technical"]}),
                   pilot / "data" / "t.parquet")  # fmt: skip
    spec["data"]["file"] = "data/t.parquet"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "no column 'subject' (columns: id, body, queue)" in _error(pilot)
    res = run_cli("check", str(pilot))
    assert res.returncode == 2 and "Traceback" not in res.stderr
