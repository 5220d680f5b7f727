"""`lorapilot data` and `inspect` end to end, as a user runs them (subprocess, --json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, run_cli, run_json, write_pilot


@pytest.mark.parametrize("example", ["ticket-triage", "invoice-fields"])
def test_data_is_stable_and_inspect_matches(example, tmp_path, default_model_dir):
    pilot = tmp_path / example
    shutil.copytree(EXAMPLES / example, pilot, ignore=shutil.ignore_patterns("runs"))
    a = run_json("data", str(pilot))
    b = run_json("data", str(pilot))
    assert a["version"] == b["version"] and a["run_id"] != b["run_id"]
    for key in (
        "version",
        "splits",
        "per_category",
        "duplicates",
        "lengths",
        "skipped",
        "mask_audit",
    ):
        assert key in a
    assert a["duplicates"]["cross_split"] == [] and a["mask_audit"]["ok"]
    assert a["mask_audit"]["end_of_turn_trained"] and a["mask_audit"]["eval_prompt_is_train_prefix"]
    rec = json.loads((pilot / "runs" / a["run_id"] / "run.json").read_text())
    assert rec["status"] == "completed" and rec["data_version"] == a["version"]
    assert rec["environment"]["libraries"]["torch"]

    ins = run_json("inspect", str(pilot), "--per-category", "1")
    cats = set(a["per_category"])
    assert {ex["category"] for ex in ins["examples"]} == cats
    assert all(ex["match"] for ex in ins["examples"]) and ins["ok"]
    for ex in ins["examples"]:
        assert {
            "id",
            "category",
            "n_tokens",
            "loss_positions",
            "decoded_target",
            "expected_target",
            "match",
            "truncated",
        } <= set(ex)
    # the human view renders too (rich, stdout)
    human = run_cli("inspect", str(pilot), "--per-category", "1")
    assert human.returncode == 0 and "<|im_start|>assistant" in human.stdout


def _presplit_pilot(tmp_path: Path, leakage: str = "fail") -> Path:
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    lines = (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines[:240]]
    train, val, test = rows[:160], rows[160:200], rows[200:]
    leaked = dict(test[0], id="leak-exact")
    words = test[1]["text"].split()
    assert len(words) >= 12, "need a longer text for a two-word near copy"
    words[3], words[-3] = "zebra", "quokka"
    near = dict(test[1], id="leak-near", text=" ".join(words))
    train += [leaked, near]
    spec["data"] = {
        **spec["data"],
        "file": None,
        "files": {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"},
        "leakage": leakage,
        "near_dup_threshold": 0.6,
    }
    del spec["data"]["file"]
    del spec["data"]["split"]
    pilot = tmp_path / "leaky"
    pilot.mkdir()
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, part in (("train", train), ("val", val), ("test", test)):
        (pilot / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return pilot


def test_leaks_fail_then_drop_from_train(tmp_path, default_model_dir):
    pilot = _presplit_pilot(tmp_path)
    out = run_json("data", str(pilot), expect=1)
    pairs = {(p["a_id"], p["b_id"]) for p in out["duplicates"]["cross_split"]} | {
        (p["b_id"], p["a_id"]) for p in out["duplicates"]["cross_split"]
    }
    test_ids = {json.loads(x)["id"] for x in (pilot / "test.jsonl").read_text().splitlines()}
    assert any("leak-exact" in pr and (set(pr) - {"leak-exact"}) <= test_ids for pr in pairs)
    assert any("leak-near" in pr for pr in pairs)
    assert {p["kind"] for p in out["duplicates"]["cross_split"]} >= {"exact", "near"}
    rec = json.loads((pilot / "runs" / out["run_id"] / "run.json").read_text())
    assert rec["status"] == "failed" and "leak" in rec["error"]

    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["leakage"] = "drop_from_train"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ok = run_json("data", str(pilot))
    dropped = {d["id"] for d in ok["duplicates"]["dropped_from_train"]}
    assert {"leak-exact", "leak-near"} <= dropped
    assert ok["splits"]["train"] == 160 and ok["duplicates"]["cross_split"] == []
    assert ok["version"] != out["version"]


def _broken_pilot(tmp_path: Path, on_error: str) -> Path:
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    spec["data"]["on_error"] = on_error
    lines = (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl").read_text().splitlines()[:300]
    lines[6] = lines[6][:-5]  # line 7: truncated JSON
    pilot = tmp_path / f"broken-{on_error}"
    (pilot / "data").mkdir(parents=True)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (pilot / "data" / "tickets.jsonl").write_text("\n".join(lines) + "\n")
    return pilot


def test_broken_line_fails_with_its_number(tmp_path, default_model_dir):
    proc = run_cli("data", str(_broken_pilot(tmp_path, "fail")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "tickets.jsonl:7" in proc.stderr


def test_broken_line_skipped_and_listed(tmp_path, default_model_dir):
    out = run_json("data", str(_broken_pilot(tmp_path, "skip")))
    assert [s["line"] for s in out["skipped"]] == [7]
    assert out["n_examples"] == 299


def test_data_refuses_without_permission(tmp_path):
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    del spec["data"]["permission"]
    pilot = tmp_path / "noperm"
    shutil.copytree(EXAMPLES / "ticket-triage" / "data", pilot / "data")
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec))
    out = run_json("data", str(pilot), expect=2)
    assert "data.permission" in out["error"]


def test_train_and_test_files_take_a_stratified_seeded_val_out_of_train(
    tmp_path, default_model_dir
):
    """data.files {train, test} with split.val 0.2: val comes out of train (every category
    keeps its share, the same seed gives the same ids), the given test file is kept whole."""
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    rows = [json.loads(x) for x in (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl")
            .read_text().splitlines()][:300]  # fmt: skip
    train, test = rows[:240], rows[240:]
    spec["data"] = {k: v for k, v in spec["data"].items() if k not in ("file", "split")}
    spec["data"]["files"] = {"train": "train.jsonl", "test": "test.jsonl"}
    spec["data"]["split"] = {"val": 0.2, "seed": 3}
    pilot = tmp_path / "p"
    pilot.mkdir()
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, part in (("train", train), ("test", test)):
        (pilot / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    out = run_json("data", str(pilot))
    assert out["splits"]["test"] == len(test)
    assert out["splits"]["val"] + out["splits"]["train"] == len(train)
    assert 0.15 * len(train) <= out["splits"]["val"] <= 0.25 * len(train)
    for category, counts in out["per_category"].items():
        if counts["train"] + counts["val"] >= 10:  # every larger category gave val its share
            assert counts["val"] >= 1, category
    again = run_json("data", str(pilot))
    assert again["version"] == out["version"]


def test_a_val_row_duplicated_in_test_fails_under_drop_from_train(tmp_path, default_model_dir):
    """drop_from_train can only drop train rows: a val ~ test pair stays, so `data` fails with
    exit 1 naming both ids; under `warn` it passes with a warning naming them."""
    pilot = _presplit_pilot(tmp_path, leakage="drop_from_train")
    val = [json.loads(x) for x in (pilot / "val.jsonl").read_text().splitlines()]
    test = (pilot / "test.jsonl").read_text()
    (pilot / "test.jsonl").write_text(test + json.dumps(dict(val[0], id="val-copy")) + "\n")
    out = run_json("data", str(pilot), expect=1)
    assert val[0]["id"] in out["error"] and "val-copy" in out["error"]
    assert "drop_from_train cannot fix" in out["error"]
    assert "never the test row" in out["error"]
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    # #35 item 7: under `fail` a val ~ test pair is offered only what can fix it (this data
    # also has train ~ test pairs, which drop_from_train does fix)
    spec["data"]["leakage"] = "fail"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    fail = run_json("data", str(pilot), expect=1)["error"]
    assert "drop_from_train for the pairs with a train row" in fail
    assert "validation row of the 1 val ~ test pair(s)" in fail and "never the test row" in fail
    spec["data"]["leakage"] = "warn"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ok = run_json("data", str(pilot))
    assert any("val-copy" in w and val[0]["id"] in w for w in ok["warnings"])


def test_labels_missing_or_rare_in_train_are_warned(tmp_path, default_model_dir):
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    labels = spec["task"]["labels"]
    rows = [json.loads(x) for x in (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl")
            .read_text().splitlines()]  # fmt: skip
    train = [r for r in rows if r["label"] == labels[0]][:40]
    train += [r for r in rows if r["label"] == labels[1]][:2]
    taken = {r["id"] for r in train}
    held = [r for r in rows if r["label"] != labels[0] and r["id"] not in taken][:60]
    spec["data"] = {k: v for k, v in spec["data"].items() if k not in ("file", "split")}
    spec["data"]["leakage"] = "warn"  # near copies across this hand-made split are not the point
    spec["data"]["files"] = {"train": "train.jsonl", "val": "val.jsonl", "test": "test.jsonl"}
    pilot = tmp_path / "skewed"
    pilot.mkdir()
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, part in (("train", train), ("val", held[:30]), ("test", held[30:])):
        (pilot / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    out = run_json("data", str(pilot))
    missing = next(w for w in out["warnings"] if "no training example" in w)
    assert all(lab in missing for lab in labels[2:]) and labels[0] not in missing
    rare = next(w for w in out["warnings"] if "min_support" in w)
    assert f"{labels[1]} (2)" in rare
    human = run_cli("data", str(pilot))
    assert human.returncode == 0 and "no training example" in human.stdout


def test_data_sample_changes_the_version_and_keeps_label_proportions(tmp_path, default_model_dir):
    import shutil

    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot,
                    ignore=shutil.ignore_patterns("runs", "report", "deliverable"))  # fmt: skip
    full = run_json("data", str(pilot))
    out = run_json("data", str(pilot), "--set", "data.sample={train: 60, val: 0.5}")
    assert out["version"] != full["version"]
    assert out["splits"]["train"] == 60 and out["splits"]["test"] == full["splits"]["test"]
    assert out["splits"]["val"] == round(full["splits"]["val"] / 2 + 0.01)
    n_full = full["splits"]["train"]
    for category, counts in out["per_category"].items():
        share = full["per_category"][category]["train"] / n_full
        assert abs(counts["train"] - 60 * share) < 1, category  # largest remainder: within 1
    # (the same sample twice is the same subset: tests/data/test_split.py)
    from lorapilot.errors import UsageError
    from lorapilot.spec import load_pilot

    with pytest.raises(UsageError, match=r"data.sample.train: must be a count >= 1"):
        load_pilot(pilot, ["data.sample.train=0"])


def test_truncation_is_never_silent(tmp_path, default_model_dir):
    """#35: a max_length that cuts inputs fails `data` (exit 1) naming the examples and the
    length that fits them all; `data.truncation: allow` passes and counts them per split and
    category; the default `auto` cuts nothing and says why."""
    pilot = tmp_path / "tt"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["data"]["max_length"] = 80
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    bad = run_json("data", str(pilot), expect=1)
    tr = bad["truncation"]
    assert tr["n_truncated"] > 0 and tr["max_length"] == 80 and tr["policy"] == "fail"
    assert tr["fits_at"] > 80 and sum(tr["per_split"].values()) == tr["n_truncated"]
    first_id = tr["examples"][0].split(" ", 1)[0]
    assert f"cuts the input of {tr['n_truncated']} example(s)" in bad["error"]
    assert first_id in bad["error"]
    assert f"max_length of {tr['fits_at']} (the longest" in bad["error"]
    assert "data.truncation: allow" in bad["error"]
    rec = json.loads((pilot / "runs" / bad["run_id"] / "run.json").read_text())
    assert rec["status"] == "failed"

    spec["data"]["truncation"] = "allow"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ok = run_json("data", str(pilot))
    tr2 = ok["truncation"]
    assert tr2["n_truncated"] == tr["n_truncated"] and tr2["policy"] == "allow"
    per_cat = sum(n for cats in tr2["per_category"].values() for n in cats.values())
    assert per_cat == tr2["n_truncated"]

    del spec["data"]["max_length"], spec["data"]["truncation"]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    whole = run_json("data", str(pilot))
    auto = whole["truncation"]
    assert auto["n_truncated"] == 0 and auto["max_length_setting"] == "auto"
    assert auto["max_length"] == 8192 and "model's context" in auto["max_length_source"]
    assert auto["longest_tokens"] == max(v["max"] for v in whole["lengths"].values())
    assert auto["fits_at"] == tr["fits_at"]  # the same examples and answers: the same length
    assert tr["fits_at"] == tr["longest_prompt_tokens"] + tr["answer_room_tokens"]
    # what the failure said would fit does fit, and one token less cuts an input
    fits = run_json("data", str(pilot), "--set", f"data.max_length={tr['fits_at']}")
    assert fits["truncation"]["n_truncated"] == 0
    spec["data"]["max_length"] = tr["fits_at"] - 1
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert run_json("data", str(pilot), expect=1)["truncation"]["n_truncated"] >= 1


def test_a_val_test_pair_alone_is_never_offered_drop_from_train(monkeypatch):
    from types import SimpleNamespace

    from lorapilot.data import dataset
    from lorapilot.errors import CheckFailed

    pair = {"a_split": "val", "a_id": "v1", "b_split": "test", "b_id": "t9", "kind": "near",
            "similarity": 0.93}  # fmt: skip
    monkeypatch.setattr(dataset, "remaining_leaks", lambda pilot, prepared: [pair])
    for files in (None, "given"):  # lorapilot split the file: `together` would fix it
        data = SimpleNamespace(leakage="fail", files=files)
        with pytest.raises(CheckFailed) as e:
            dataset.check_leakage(SimpleNamespace(spec=SimpleNamespace(data=data)), None)
        assert "val:v1 ~ test:t9" in str(e.value) and "never the test row" in str(e.value)
        assert "drop_from_train" not in str(e.value)
        assert ("Set data.leakage: together" in str(e.value)) == (files is None)


def _ticket_pilot(tmp_path: Path, rows: list[dict], **data) -> Path:
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    spec["data"] = {**spec["data"], "file": "data/t.jsonl", **data}
    pilot = tmp_path / "tickets"
    (pilot / "data").mkdir(parents=True)
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (pilot / "data" / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return pilot


def _tickets(n: int) -> list[dict]:
    lines = (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines[:n]]


def test_no_example_left_is_exit_2_saying_what_was_set_aside(tmp_path, default_model_dir):
    """Every row skipped used to complete as 'data ok' with 0/0/0 examples."""
    rows = [dict(r, label=f"old-{r['label']}") for r in _tickets(60)]
    pilot = _ticket_pilot(tmp_path, rows, on_error="skip")
    out = run_json("data", str(pilot), expect=2)
    assert "no train and no val examples left (train 0, val 0, test 0)" in out["error"]
    assert "60 record(s) were set aside" in out["error"]
    assert (
        "is not one of the task labels" in out["error"] and "data.unlisted_labels" in out["error"]
    )
    proc = run_cli("data", str(pilot))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_unlisted_labels_drop_counts_them_per_label(tmp_path, default_model_dir):
    rows = _tickets(200)
    for r in rows[::10]:
        r["label"] = "Not sure"
    rows[5]["label"] = "spam"
    pilot = _ticket_pilot(tmp_path, rows, unlisted_labels="drop")
    out = run_json("data", str(pilot))
    assert out["n_examples"] == 179 and out["skipped"] == [] and out["skipped_summary"] == []
    assert out["unlisted_labels"]["per_label"] == {"Not sure": 20, "spam": 1}
    assert [r["line"] for r in out["unlisted_labels"]["rows"]][:3] == [1, 6, 11]
    assert any("21 example(s) left out" in w and "'Not sure' 20" in w for w in out["warnings"])
    human = run_cli("data", str(pilot))
    assert "left out for labels not in task.labels" in human.stdout
    # the default refuses, naming the row and the way to drop them
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    del spec["data"]["unlisted_labels"]
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    err = run_json("data", str(pilot), expect=2)["error"]
    assert err.startswith("data/t.jsonl:1: label 'Not sure'") and "unlisted_labels: drop" in err


def test_skipped_rows_are_summarised_by_problem(tmp_path, default_model_dir):
    rows = _tickets(120)
    for r in rows[:30]:
        r["text"] = ""
    for r in rows[30:33]:
        r["label"] = 7
    out = run_json("data", str(_ticket_pilot(tmp_path, rows, on_error="skip")))
    assert [(g["problem"], g["count"], g["first"]) for g in out["skipped_summary"]] == [
        ("field … is empty", 30, "data/t.jsonl:1"),
        ("field … must be a string, got number", 3, "data/t.jsonl:31"),
    ]
    human = run_cli("data", str(_ticket_pilot(tmp_path / "h", rows, on_error="skip")))
    assert "30 x field … is empty (first data/t.jsonl:1; 'text' 30)" in human.stdout


def test_split_group_keeps_each_group_in_one_split(tmp_path, default_model_dir):
    rows = _tickets(300)
    for i, r in enumerate(rows):
        r["customer"] = f"c{i % 37}"
    pilot = _ticket_pilot(tmp_path, rows, split={"seed": 0, "val": 0.15, "test": 0.15,
                                                 "group": "customer"})  # fmt: skip
    out = run_json("data", str(pilot))
    g = out["groups"]
    assert g["column"] == "customer" and g["n_groups"] == 37 and g["shared"] == []
    assert sum(g["per_split"].values()) == 37 and min(g["per_split"].values()) > 0
    assert abs(out["splits"]["val"] - 45) <= 10 and abs(out["splits"]["test"] - 45) <= 10
    plain = run_json("data", str(_ticket_pilot(tmp_path / "p", rows)))
    assert plain["version"] != out["version"] and "groups" not in plain
    human = run_cli("data", str(pilot))
    assert "groups of customer: 37" in human.stdout


def test_split_group_across_given_files_is_warned(tmp_path, default_model_dir):
    rows = _tickets(240)
    for i, r in enumerate(rows):
        r["customer"] = f"c{i % 50}"
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    spec["data"] = {k: v for k, v in spec["data"].items() if k not in ("file", "split")}
    spec["data"]["files"] = {"train": "train.jsonl", "val": "val.jsonl"}
    spec["data"]["split"] = {"group": "customer"}
    pilot = tmp_path / "given"
    pilot.mkdir()
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for name, part in (("train", rows[:200]), ("val", rows[200:])):
        (pilot / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    out = run_json("data", str(pilot))
    assert len(out["groups"]["shared"]) == 40
    assert any("40 group(s) of 'customer'" in w for w in out["warnings"])


def test_a_prompt_longer_than_max_length_fails_and_answers_cut_are_named(
    tmp_path, default_model_dir
):
    """A max_length the prompt alone fills left every example out in silence (`data` passed
    with 0 examples: a 77-label system prompt at max_length 224); it fails, saying how long
    the prompt is. An answer that would be cut leaves its example out, counted and named."""
    pilot = tmp_path / "inv"
    shutil.copytree(EXAMPLES / "invoice-fields", pilot, ignore=shutil.ignore_patterns("runs"))
    short = run_json("data", str(pilot), "--set", "data.max_length=60", expect=1)
    assert "data.max_length=60 is shorter than the prompt alone" in short["error"]
    assert "task.system and task.template take" in short["error"]

    some = run_json("data", str(pilot), "--set", "data.max_length=200",
                    "--set", "data.truncation=allow")  # fmt: skip
    gone = some["target_excluded"]
    assert gone and some["n_examples"] + len(gone) == 462
    (said,) = [w for w in some["warnings"] if "left out because their answer" in w]
    assert said.startswith(f"{len(gone)} example(s)") and gone[0]["id"] in said
    assert "raise data.max_length" in said


def test_together_keeps_each_set_of_duplicates_in_one_split(tmp_path, default_model_dir):
    """Public sets repeat texts (BANKING77, NLU++): a lorapilot split of one file put copies
    in train and test, and `data` could only fail or drop. `data.leakage: together` finds
    the duplicates first and splits each set whole; the failure says so. Pairs across files
    the user split stay leaks, said as such."""
    spec = yaml.safe_load((EXAMPLES / "ticket-triage" / "pilot.yaml").read_text())
    rows = [json.loads(x) for x in (EXAMPLES / "ticket-triage" / "data" / "tickets.jsonl")
            .read_text().splitlines()[:200]]  # fmt: skip
    copies = [dict(rows[i], id=f"copy{i}-{k}") for i in range(0, 60, 3) for k in range(3)]
    longest = max(rows[60:], key=lambda r: len(r["text"]))
    words = longest["text"].split()
    words[-1] = "zebra"
    near = dict(longest, id="near1", text=" ".join(words))
    data = {**spec["data"], "file": "d.jsonl", "near_dup_threshold": 0.6}
    lines = "".join(json.dumps(r) + "\n" for r in rows + copies + [near])
    pilot = write_pilot(tmp_path / "dups", {**spec, "data": data}, {"d.jsonl": lines})
    failed = run_json("data", str(pilot), expect=1)
    assert failed["duplicates"]["n_cross_split"] > 0
    assert (
        "Set data.leakage: together to keep each set of duplicates in one split"
        in (failed["error"])
    )
    ok = run_json("data", str(pilot), "--set", "data.leakage=together")
    assert (
        ok["duplicates"]["n_cross_split"] == 0 and ok["duplicates"]["leakage_policy"] == "together"
    )
    assert ok["n_examples"] == len(rows) + len(copies) + 1  # nothing dropped
    assert ok["duplicates"]["counts"]["exact"] >= 60 and ok["duplicates"]["counts"]["near"] >= 1
    assert ok["version"] != failed["version"]
    # the whole split keeps its shares: about 70/15/15 (the example's fractions)
    sizes = ok["splits"]
    assert abs(sizes["val"] - 0.15 * ok["n_examples"]) <= 8, sizes

    given = _presplit_pilot(tmp_path, leakage="together")
    out = run_json("data", str(given), expect=1)
    assert (
        "data.leakage: together keeps duplicates in one split only where lorapilot splits"
        in (out["error"])
    )
