"""`lorapilot init NAME --task ...`: every task kind scaffolds a pilot that `check` and `data`
accept as written; a bad task or name exits 2."""

from __future__ import annotations

import pytest
from conftest import run_json


@pytest.mark.parametrize("task", ["classification", "extraction", "format", "image_classification"])
def test_init_scaffolds_a_pilot_that_checks(task, tmp_path):
    out = run_json("init", "p", "--task", task, "--dir", str(tmp_path))
    assert out["task"] == task and out["n_examples"] >= 30
    checked = run_json("check", out["pilot"])
    assert checked["ok"] and checked["task"] == task


def test_an_image_pilot_gets_a_folder_of_images_per_label(tmp_path, image_model_dir):
    from PIL import Image

    out = run_json("init", "shapes", "--task", "image_classification", "--dir", str(tmp_path))
    folders = sorted(p.name for p in (tmp_path / "shapes" / "data" / "images").iterdir())
    assert folders == ["circle", "square", "triangle"]
    img = Image.open(next((tmp_path / "shapes" / "data" / "images" / "circle").iterdir()))
    assert img.size == (64, 64) and img.mode == "RGB"
    data = run_json("data", out["pilot"])
    assert sum(data["splits"].values()) == out["n_examples"]
    assert set(data["per_category"]) == {"circle", "square", "triangle"}


def test_a_format_pilot_marks_the_answer_and_its_targets_follow_the_format(tmp_path):
    """Every scaffolded target matches the regex, with the answer group the working's result
    (what answer_match compares); `data` accepts them as written."""
    import json
    import re

    out = run_json("init", "f", "--task", "format", "--dir", str(tmp_path))
    from lorapilot.spec import load_pilot

    task = load_pilot(tmp_path / "f").spec.task
    assert task.answer_group
    rows = [json.loads(line) for line in (tmp_path / "f" / "data" / "examples.jsonl").open()]
    for row in rows:
        m = re.fullmatch(task.regex, row["target"])
        assert m and m.group("answer") == str(eval(row["target"].split(" =")[0]))  # noqa: S307
    data = run_json("data", out["pilot"])
    assert sum(data["splits"].values()) == len(rows) and data["mask_audit"]["ok"]


def test_an_unknown_task_exits_2_naming_the_choices(tmp_path):
    bad = run_json("init", "p", "--task", "regression", "--dir", str(tmp_path), expect=2)
    assert "image_classification" in bad["error"] and "--task" in bad["error"]
