"""Paths and names cannot reach outside the pilot folder, and files follow the user's umask.

Already covered elsewhere (function level): run ids `../x`, `/etc` refused by get_run
(tests/test_registry.py); `../` and absolute data paths and a `../escape` pilot name refused
by the spec (tests/test_spec.py). Here the same through the CLI, plus symlinks.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from rel_helpers import run_ok, small_pilot

from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot


@pytest.fixture
def pilot(tmp_path, tiny_model_dir):
    return small_pilot(tmp_path / "pilot", tiny_model_dir)


@pytest.mark.parametrize(
    "args",
    [
        ("eval", "--run", "train-20260101-000000-abcdef/../../x"),
        ("verify", "--run", "/etc"),
        ("train", "--resume", "../../etc/passwd"),
    ],
)
def test_run_ids_from_the_command_line_cannot_name_a_path(args, pilot, tmp_path):
    verb, *rest = args
    out = run_ok(verb, str(pilot), *rest, expect=2)
    assert "not a run id" in out["error"]
    assert not (pilot / "runs").exists() or not any((pilot / "runs").iterdir())


@pytest.mark.parametrize(
    "verb, setting, needle",
    [
        ("data", "data.file=../outside.jsonl", "points outside the pilot folder"),
        ("check", "name=../x", "name: must be 1-64 of letters"),
        ("check", "../x=1", "is not a key path"),
    ],
)
def test_set_values_cannot_move_data_or_names_outside(verb, setting, needle, pilot, tmp_path):
    (tmp_path / "outside.jsonl").write_text((pilot / "data.jsonl").read_text())
    out = run_ok(verb, str(pilot), "--set", setting, expect=2)
    assert needle in out["error"], out["error"]


def test_set_absolute_data_path_is_refused(pilot):
    from lorapilot.data.dataset import load_all

    with pytest.raises(UsageError, match="must be a path relative to the pilot folder"):
        load_all(load_pilot(pilot, ["data.file=/etc/passwd"]))


def test_symlinks_out_of_the_pilot_folder_are_not_followed_for_data(pilot, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.jsonl").write_text((pilot / "data.jsonl").read_text())
    (pilot / "data.jsonl").unlink()
    (pilot / "data.jsonl").symlink_to(outside / "data.jsonl")
    out = run_ok("data", str(pilot), expect=2)
    assert "data.file: 'data.jsonl' points outside the pilot folder" in out["error"]
    (pilot / "d").symlink_to(outside, target_is_directory=True)  # a linked folder: the same
    with pytest.raises(UsageError, match="outside the pilot folder"):
        load_pilot(pilot).path("d/data.jsonl", "data.file")


def test_a_runs_symlink_out_of_the_pilot_folder_is_refused(pilot, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (pilot / "runs").symlink_to(elsewhere, target_is_directory=True)
    for verb in ("data", "runs"):
        out = run_ok(verb, str(pilot), expect=2)
        assert (
            f"{pilot / 'runs'} is a symlink to {elsewhere}, outside the pilot folder"
            in out["error"]
        )
    assert not any(elsewhere.iterdir())  # nothing was written through it
    # a run folder that is a symlink is refused too (a resume would write through it)
    (pilot / "runs").unlink()
    (pilot / "runs").mkdir()
    (pilot / "runs" / "train-20260101-000000-abcdef").symlink_to(
        elsewhere, target_is_directory=True
    )
    out = run_ok("train", str(pilot), "--resume", "train-20260101-000000-abcdef", expect=2)
    assert "is a symlink; a run folder must be a real folder" in out["error"]


def test_run_files_follow_the_users_umask(pilot):
    out = run_ok("data", str(pilot), umask=0o027)
    run_dir = pilot / "runs" / out["run_id"]
    assert stat.S_IMODE(os.stat(run_dir / "run.json").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(pilot / "runs").st_mode) == 0o750
    for path in run_dir.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, path
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
