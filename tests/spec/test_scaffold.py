"""`lorapilot init NAME --task ...`: every task kind scaffolds a pilot that `check` and `data`
accept as written; a bad task or name exits 2."""

from __future__ import annotations

import pytest
from conftest import run_json


@pytest.mark.parametrize("task", ["classification", "extraction", "image_classification"])
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


def test_an_unknown_task_exits_2_naming_the_choices(tmp_path):
    bad = run_json("init", "p", "--task", "regression", "--dir", str(tmp_path), expect=2)
    assert "image_classification" in bad["error"] and "--task" in bad["error"]
