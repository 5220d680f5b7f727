"""Data from HF `datasets`: a save_to_disk folder in data.file/files, and a dataset in the
local HF cache by name (data.hf_dataset), offline. Rows go through the same record builder
as JSONL/CSV/Parquet, so messages and policies are the same."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, run_cli, run_json

from lorapilot.data.dataset import load_all, prepare_data, source_hashes
from lorapilot.data.hf import saved_kind
from lorapilot.data.load import load_records
from lorapilot.errors import UsageError
from lorapilot.spec import DataSpec, TaskSpec, json_schema, load_pilot

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

TICKETS = EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl"
CLF = TaskSpec(kind="classification", labels=["a", "b"])


def _rows(n: int = 120) -> list[dict]:
    return [json.loads(x) for x in TICKETS.read_text().splitlines()[:n]]


def _pilot(folder: Path, data: dict, base: str | None = None) -> Path:
    """The ticket-triage spec with another `data` source (and optionally another base)."""
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    old = spec["data"]
    spec["data"] = {k: v for k, v in old.items() if k not in ("file", "files")} | data
    if base:
        spec["model"] = {"base": base}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def _save(rows: list[dict], path: Path) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _save_dict(rows: list[dict], path: Path, test: bool = True) -> Path:
    parts = {"train": rows[:80], "validation": rows[80:100]}
    if test:
        parts["test"] = rows[100:]
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in parts.items()}).save_to_disk(
        str(path)
    )
    return path


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir, local_files_only=True)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --------------------------------------------------------------------------- save_to_disk folders


def test_saved_dataset_folder_runs_data_via_cli(tmp_path):
    """The acceptance path: a pilot whose data.file is a saved Dataset runs `lorapilot data`."""
    pilot = _pilot(tmp_path / "p", {"file": "data/tickets_ds"})
    _save(_rows(), pilot / "data" / "tickets_ds")
    out = run_json("data", str(pilot))
    assert (
        sum(out["splits"].values()) == 120
        and out["splits"]["val"] > 0
        and out["splits"]["test"] > 0
    )
    assert out["mask_audit"]["ok"] and out["skipped"] == []
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert rec["status"] == "completed" and rec["data_version"] == out["version"]


def test_saved_dataset_gives_the_records_of_the_same_jsonl(tmp_path):
    rows = _rows()
    ds_pilot = _pilot(tmp_path / "ds", {"file": "data/tickets_ds"})
    _save(rows, ds_pilot / "data" / "tickets_ds")
    js_pilot = _pilot(tmp_path / "js", {"file": "data/t.jsonl"})
    (js_pilot / "data").mkdir()
    (js_pilot / "data" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, _ = load_all(load_pilot(ds_pilot))
    b, _ = load_all(load_pilot(js_pilot))
    assert [(r.id, r.text, r.label, r.split, r.category) for r in a] == [
        (r.id, r.text, r.label, r.split, r.category) for r in b
    ]
    assert a[2].source == "data/tickets_ds:row 3"


def test_datasetdict_splits_are_used_as_they_are(tmp_path, tokenizer):
    pilot = _pilot(tmp_path / "p", {"file": "data/dd"})
    _save_dict(_rows(), pilot / "data" / "dd")
    assert saved_kind(pilot / "data" / "dd") == "dataset_dict"
    prep = prepare_data(load_pilot(pilot), tokenizer)
    assert {s: len(v) for s, v in prep.splits.items()} == {"train": 80, "val": 20, "test": 20}
    assert prep.splits["val"][0].source == "data/dd/validation:row 1"
    # without a test split: train and validation only, nothing reserved
    pilot2 = _pilot(tmp_path / "p2", {"file": "data/dd"})
    _save_dict(_rows(), pilot2 / "data" / "dd", test=False)
    prep2 = prepare_data(load_pilot(pilot2), tokenizer)
    assert {s: len(v) for s, v in prep2.splits.items()} == {"train": 80, "val": 20, "test": 0}


def test_split_folders_of_a_datasetdict_as_data_files(tmp_path, tokenizer):
    pilot = _pilot(
        tmp_path / "p", {"files": {"train": "data/dd/train", "val": "data/dd/validation"}}
    )
    _save_dict(_rows(), pilot / "data" / "dd", test=False)
    prep = prepare_data(load_pilot(pilot), tokenizer)
    assert len(prep.splits["train"]) == 80 and len(prep.splits["val"]) == 20
    # the whole DatasetDict where one split is expected: the message says which folder to use
    bad = _pilot(tmp_path / "bad", {"files": {"train": "data/dd", "val": "data/dd/validation"}})
    shutil.copytree(pilot / "data", bad / "data")
    with pytest.raises(
        UsageError, match=r"data\.files\.train: data/dd holds a DatasetDict .* e\.g\. data/dd/train"
    ):
        load_all(load_pilot(bad))


def test_unrecognised_split_names_are_a_clear_error(tmp_path):
    pilot = _pilot(tmp_path / "p", {"file": "data/dd"})
    rows = _rows(40)
    datasets.DatasetDict(
        {"a": datasets.Dataset.from_list(rows[:20]), "b": datasets.Dataset.from_list(rows[20:])}
    ).save_to_disk(str(pilot / "data" / "dd"))
    with pytest.raises(
        UsageError, match=r"data\.file: data/dd: splits a, b: cannot tell .* data\.files"
    ):
        load_all(load_pilot(pilot))


def test_version_follows_the_arrow_files(tmp_path, tokenizer):
    rows = _rows()
    pilot = _pilot(tmp_path / "p", {"file": "data/ds"})
    _save(rows, pilot / "data" / "ds")
    v1 = prepare_data(load_pilot(pilot), tokenizer).version
    h1 = source_hashes(load_pilot(pilot))
    shutil.rmtree(pilot / "data" / "ds")
    _save(rows, pilot / "data" / "ds")  # the same rows saved again: the same version
    assert (
        prepare_data(load_pilot(pilot), tokenizer).version == v1
        and source_hashes(load_pilot(pilot)) == h1
    )
    shutil.rmtree(pilot / "data" / "ds")
    changed = [dict(r) for r in rows]
    changed[5]["text"] += " (edited)"
    _save(changed, pilot / "data" / "ds")
    assert prepare_data(load_pilot(pilot), tokenizer).version != v1
    assert source_hashes(load_pilot(pilot)) != h1 and list(h1) == ["data/ds"]


def test_pipeline_inputs_key_follows_a_saved_folder(tmp_path):
    """`run` reuses a phase only while its inputs are unchanged: a folder has no bytes of its
    own to hash, so its arrow files stand for it."""
    from lorapilot.steps.run import inputs_key

    pilot = _pilot(tmp_path / "p", {"file": "data/ds"})
    _save(_rows(), pilot / "data" / "ds")
    k1 = inputs_key(load_pilot(pilot), {})
    assert k1 == inputs_key(load_pilot(pilot), {})
    shutil.rmtree(pilot / "data" / "ds")
    _save(_rows()[:-1], pilot / "data" / "ds")
    assert inputs_key(load_pilot(pilot), {}) != k1


def test_field_mapping_class_labels_and_policies_match_files(tmp_path):
    features = datasets.Features(
        {
            "uid": datasets.Value("string"),
            "body": datasets.Value("string"),
            "queue": datasets.ClassLabel(names=["a", "b", "zzz"]),
        }
    )
    rows = [{"uid": f"u{i}", "body": f"text {i}", "queue": i % 2} for i in range(6)]
    rows[3]["queue"] = 2  # a class the task does not know
    path = tmp_path / "ds"
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(path))
    data = DataSpec(
        file="ds", fields={"text": "body", "label": "queue", "id": "uid"}, on_error="skip"
    )
    records, skipped = load_records(path, CLF, data, display_path="ds")
    assert [r.label for r in records] == ["a", "b", "a", "a", "b"] and records[0].id == "u0"
    assert [(s.file, s.line) for s in skipped] == [("ds", 4)]
    assert skipped[0].problem.startswith("label 'zzz' is not one of the task labels")
    with pytest.raises(
        UsageError,
        match=r"^ds:row 4: label 'zzz' is not one of the task labels \(a, b\); to leave such "
        r"examples out, counted per label, set data.unlisted_labels: drop$",
    ):
        load_records(path, CLF, data.model_copy(update={"on_error": "fail"}), display_path="ds")
    with pytest.raises(
        UsageError, match=r"ds: no column 'text' \(columns: uid, body, queue\); set data\.fields"
    ):
        load_records(path, CLF, DataSpec(file="ds"), display_path="ds")


def test_a_plain_folder_or_a_wrong_format_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(
        UsageError, match="d: not a file, nor a folder written by datasets' save_to_disk"
    ):
        load_records(tmp_path / "d", CLF, DataSpec(file="d"), display_path="d")
    (tmp_path / "x.jsonl").write_text('{"text": "t", "label": "a"}\n')
    with pytest.raises(UsageError, match="data.format is datasets"):
        load_records(
            tmp_path / "x.jsonl",
            CLF,
            DataSpec(file="x.jsonl", format="datasets"),
            display_path="x.jsonl",
        )


def test_without_the_datasets_package_the_message_names_the_extra(tmp_path, monkeypatch):
    path = _save(_rows(10), tmp_path / "ds")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(UsageError, match=r"data\.file: ds .*pip install 'lorapilot\[datasets\]'"):
        load_records(path, CLF, DataSpec(file="ds"), display_path="ds")


@pytest.mark.usefixtures("one_thread")
def test_saved_datasetdict_pilot_runs_baseline(tmp_path, tiny_model_dir):
    """The other half of the acceptance: `baseline` on a pilot reading a saved DatasetDict."""
    pilot = _pilot(tmp_path / "p", {"file": "data/dd"}, base=str(tiny_model_dir))
    _save_dict(_rows(), pilot / "data" / "dd")
    out = run_json("baseline", str(pilot), "--limit", "4", "--no-progress")
    assert out["n"] == 4 and 0 <= out["metrics"]["accuracy"] <= 1
    preds = (pilot / "runs" / out["run_id"] / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 4 and json.loads(preds[0])["id"] == _rows()[80]["id"]


# --------------------------------------------------------------------------- the local HF cache


def _cache(
    root: Path, rows: list[dict], name: str = "acme/ticket-tiny", config: str = "default"
) -> Path:
    """Lay a dataset out in `root` as datasets itself caches a hub dataset it downloaded:
    <root>/<org>___<name>/<config>/<version>/<commit>/{dataset_info.json, <name>-<split>.arrow}.
    Built with the packaged JSON builder (no network), then moved under the hub id's folder."""
    from datasets.packaged_modules.json.json import Json

    org, short = name.split("/")
    src = root / "_src"
    src.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, part in (("train", rows[:80]), ("validation", rows[80:100]), ("test", rows[100:])):
        files[split] = str(src / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(r) + "\n" for r in part))
    builder = Json(
        cache_dir=str(root / "_build"),
        dataset_name=short,
        config_name=config,
        config_id=config,
        hash="0123456789abcdef",
        data_files=files,
    )
    builder.download_and_prepare()
    dest = root / f"{org}___{short}"
    dest.mkdir(exist_ok=True)
    shutil.move(str(root / "_build" / short / config), str(dest / config))
    return root


def test_cached_dataset_by_name_offline(tmp_path, tokenizer, monkeypatch, no_network):
    cache = _cache(tmp_path / "hf" / "datasets", _rows())
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # <HF_HOME>/datasets is the default cache
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    pilot = _pilot(tmp_path / "p", {"hf_dataset": {"name": "acme/ticket-tiny"}})
    prep = prepare_data(load_pilot(pilot), tokenizer)
    assert {s: len(v) for s, v in prep.splits.items()} == {"train": 80, "val": 20, "test": 20}
    assert prep.splits["val"][0].source == "acme/ticket-tiny[validation]:row 1"
    assert list(source_hashes(load_pilot(pilot))) == ["hf_dataset:acme/ticket-tiny"]
    # one split divided by lorapilot, like data.file
    one = _pilot(tmp_path / "one", {"hf_dataset": {"name": "acme/ticket-tiny", "split": "train"}})
    prep1 = prepare_data(load_pilot(one), tokenizer)
    assert sum(len(v) for v in prep1.splits.values()) == 80 and len(prep1.splits["test"]) > 0
    # explicit mapping, cache_dir given in the spec instead of the environment
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    mapped = _pilot(
        tmp_path / "m",
        {
            "hf_dataset": {
                "name": "acme/ticket-tiny",
                "cache_dir": str(cache),
                "splits": {"train": "train", "val": "test"},
            }
        },
    )
    prep2 = prepare_data(load_pilot(mapped), tokenizer)
    assert {s: len(v) for s, v in prep2.splits.items()} == {"train": 80, "val": 20, "test": 0}


def test_cached_dataset_problems_name_the_spec_key(tmp_path, monkeypatch, no_network):
    _cache(tmp_path / "cache", _rows())
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))

    def err(hf: dict) -> str:
        with pytest.raises(UsageError) as e:
            load_all(load_pilot(_pilot(tmp_path / "p", {"hf_dataset": hf})))
        return str(e.value)

    assert "data.hf_dataset.name: 'acme/nope' is not in the local HF datasets cache" in err(
        {"name": "acme/nope"}
    )
    assert err({"name": "acme/ticket-tiny", "config": "other"}).startswith(
        "data.hf_dataset.config: "
    )
    assert "Available configs in the cache: ['default']" in err(
        {"name": "acme/ticket-tiny", "config": "other"}
    )
    assert err({"name": "acme/ticket-tiny", "split": "dev"}) == (
        "data.hf_dataset.split: acme/ticket-tiny has no split 'dev' (splits: train, validation, "
        "test)"
    )
    assert "is a datasets file format" in err({"name": "json"})


def test_missing_cached_dataset_exits_2_via_cli(tmp_path):
    pilot = _pilot(tmp_path / "p", {"hf_dataset": {"name": "acme/not-downloaded"}})
    env = {"HF_DATASETS_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "0"}
    proc = run_cli("data", str(pilot), "--json", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["error"].startswith(
        "data.hf_dataset.name: 'acme/not-downloaded' is not in the local HF datasets cache"
    )


# --------------------------------------------------------------------------- the spec


def test_spec_keys_schema_and_unchanged_hash():
    props = json_schema()["$defs"]["DataSpec"]["properties"]
    assert {"hf_dataset", "file", "files"} <= set(props) and "datasets" in str(props["format"])
    hf = json_schema()["$defs"]["HFDataset"]["properties"]
    assert set(hf) == {"name", "config", "split", "splits", "cache_dir"}
    # a spec without hf_dataset dumps (and hashes) exactly as before the key existed
    assert "hf_dataset" not in DataSpec(file="x.jsonl").model_dump()
    assert DataSpec(hf_dataset={"name": "a/b"}).model_dump()["hf_dataset"]["name"] == "a/b"


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"file": "x.jsonl", "hf_dataset": {"name": "a/b"}},
            "exactly one of data.file (to split), data.files or data.hf_dataset",
        ),
        (
            {"hf_dataset": {"name": "a/b", "split": "train", "splits": {"train": "t", "val": "v"}}},
            "not both",
        ),
        ({"hf_dataset": {"name": "../etc"}}, "is not a hub dataset id"),
    ],
)
def test_bad_hf_keys_exit_2(tmp_path, data, message):
    pilot = _pilot(tmp_path / "p", data)
    out = run_json("check", str(pilot), expect=2)
    assert message in out["error"] and "data" in out["error"]
