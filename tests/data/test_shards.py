"""Data published in shards (`train-00000-of-00002.parquet`): a pattern in data.file or
data.files stands for the files it matches; and an id names one example across every file."""

from __future__ import annotations

import json

import pytest
from conftest import write_pilot

from lorapilot.data.dataset import load_all, source_hashes
from lorapilot.data.source import check_data_source, file_sources
from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot


def _spec(data: dict) -> dict:
    return {
        "name": "shards",
        "hypothesis": "h",
        "task": {"kind": "classification", "labels": ["a", "b"]},
        "model": {"base": "x"},
        "data": {"source": "s", "permission": "p", **data},
    }


def _rows(start: int, n: int, ids: bool = True) -> str:
    return "".join(
        json.dumps({**({"id": f"r{i}"} if ids else {}), "text": f"text {i}", "label": "ab"[i % 2]})
        + "\n"
        for i in range(start, start + n)
    )


def test_a_pattern_reads_every_shard_it_matches_in_name_order(tmp_path):
    pilot = write_pilot(tmp_path / "p", _spec({"files": {"train": "data/train-*.jsonl",
                                                         "test": "data/test.jsonl"}}), {
        "data/train-00001-of-00002.jsonl": _rows(10, 10),
        "data/train-00000-of-00002.jsonl": _rows(0, 10),
        "data/.train-hidden.jsonl": _rows(50, 3),  # an editor's backup: not a shard
        "data/test.jsonl": _rows(20, 6),
    })  # fmt: skip
    p = load_pilot(pilot)
    assert [(k, rel, s) for k, rel, s in file_sources(p)] == [
        ("data.files.train", "data/train-00000-of-00002.jsonl", "train"),
        ("data.files.train", "data/train-00001-of-00002.jsonl", "train"),
        ("data.files.test", "data/test.jsonl", "test"),
    ]
    records, _ = load_all(p)
    assert [r.id for r in records if r.split == "train"] == [f"r{i}" for i in range(20)]
    assert sorted(source_hashes(p)) == [
        "data/test.jsonl", "data/train-00000-of-00002.jsonl", "data/train-00001-of-00002.jsonl"
    ]  # fmt: skip
    assert len(check_data_source(p)["sources"]) == 3

    (pilot / "pilot.yaml").write_text(
        (pilot / "pilot.yaml").read_text().replace("train-*.jsonl", "dev-*.jsonl")
    )
    with pytest.raises(UsageError, match=r"data.files.train: the pattern 'data/dev-\*.jsonl' "
                                         "matches no file in the pilot folder"):  # fmt: skip
        file_sources(load_pilot(pilot))
    (pilot / "pilot.yaml").write_text(
        (pilot / "pilot.yaml").read_text().replace("data/dev-*.jsonl", "../*/data/*.jsonl")
    )
    with pytest.raises(UsageError, match="points outside the pilot folder"):
        file_sources(load_pilot(pilot))


def test_an_id_in_two_files_is_refused_and_line_ids_are_unique(tmp_path):
    pilot = write_pilot(tmp_path / "p", _spec({"files": {"train": "data/train.jsonl",
                                                         "test": "data/test.jsonl"}}), {
        "data/train.jsonl": _rows(0, 10),
        "data/test.jsonl": _rows(8, 4),  # r8, r9 again: both files number alike
    })  # fmt: skip
    with pytest.raises(UsageError, match=r"the id 'r8' names two examples, "
                                         r"data/train.jsonl:9 and data/test.jsonl:1"):  # fmt: skip
        load_all(load_pilot(pilot))
    (pilot / "data" / "test.jsonl").write_text(_rows(8, 4, ids=False))
    (pilot / "data" / "train.jsonl").write_text(_rows(0, 10, ids=False))
    records, _ = load_all(load_pilot(pilot))  # no id column: file and line name them
    assert len({r.id for r in records}) == 14
