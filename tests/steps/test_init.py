"""`lorapilot init NAME --from FILE`: a pilot scaffolded from the user's own data file, as a
user runs it (--json), then checked and loaded by the verbs that follow."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml
from conftest import EXAMPLES, run_cli, run_json


def _csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _tickets(n: int = 60) -> list[dict]:
    said = {"billing": "I was charged twice for order {i}, please refund it",
            "delivery": "parcel {i} has not arrived and tracking is stuck",
            "account": "I cannot log in to account {i} since the update"}  # fmt: skip
    return [{"ticket_id": f"t{i}", "subject": f"case {i}",
             "body": said[k].format(i=i), "queue": k}
            for i, k in zip(range(n), list(said) * n, strict=False)]  # fmt: skip


def test_a_csv_becomes_a_pilot_that_checks_and_loads(tmp_path, tiny_model_dir):
    src = _csv(tmp_path / "tickets.csv", _tickets())
    out = run_json("init", "triage", "--dir", str(tmp_path), "--from", str(src),
                   "--base", str(tiny_model_dir), "--source", "our helpdesk export, 2026-11",
                   "--permission", "internal approval DP-12")  # fmt: skip
    pilot = tmp_path / "triage"
    assert out["task"] == "classification" and out["n_examples"] == 60
    assert out["fields"] == {"text": "body", "label": "queue", "id": "ticket_id"}
    assert out["labels"] == ["account", "billing", "delivery"]
    assert out["copied"] == {"file": "data/tickets.csv"} and out["to_state"] == []
    (thin,) = out["warnings"]  # 20 a label at val 0.2: about 4 each, under min_support 5
    assert thin.startswith("3 of 3 labels have fewer than eval.min_support=5 validation "
                           "examples at data.split.val 0.2")  # fmt: skip
    assert "a per-label guard could not judge them, so the guard is a pooled metric" in thin
    assert (pilot / "data" / "tickets.csv").read_bytes() == src.read_bytes()  # untouched
    assert sorted(p.name for p in pilot.iterdir()) == ["data", "pilot.yaml"]
    text = (pilot / "pilot.yaml").read_text()
    assert "# inferred: classification (column 'queue'" in text
    assert "# other text columns: subject" in text
    spec = yaml.safe_load(text)
    assert spec["data"]["source"] == "our helpdesk export, 2026-11"
    assert spec["data"]["split"] == {"seed": 0, "val": 0.2, "test": 0.2}
    assert spec["data"]["leakage"] == "together"  # lorapilot splits: copies kept in one split
    assert spec["guards"] == [{"metric": "accuracy", "max_drop": 0.02}]  # pooled: see above
    assert "tokens with" in text and spec["data"]["max_length"] >= 64  # counted, not guessed

    assert run_json("check", str(pilot))["ok"]
    data = run_json("data", str(pilot))
    assert data["truncation"]["n_truncated"] == 0  # the max_length written fits every example
    assert sum(data["splits"].values()) == 60 and set(data["per_category"]) == set(out["labels"])


def test_chat_files_by_split_and_the_view(tmp_path, tiny_model_dir):
    """Chat JSONL in three files named by split: fields.messages, the data's system turn as
    task.system, data.files; without --source/--permission the pilot says to state them and
    `check` refuses until they are (as `data` would)."""
    root = tmp_path / "src"
    root.mkdir()
    for name in ("train", "val", "test"):
        (root / f"{name}.jsonl").write_text(
            (EXAMPLES / "banking-chat" / "data" / f"{name}.jsonl").read_text()
        )
    args = ["--from", str(root / "train.jsonl"), "--from", f"val={root / 'val.jsonl'}",
            "--from", str(root / "test.jsonl"), "--base", str(tiny_model_dir)]  # fmt: skip
    out = run_json("init", "bank", "--dir", str(tmp_path), *args)
    assert out["fields"] == {"messages": "messages"} and len(out["labels"]) == 77
    assert out["copied"] == {s: f"data/{s}.jsonl" for s in ("train", "val", "test")}
    assert out["to_state"] == ["data.source", "data.permission"]
    spec = yaml.safe_load((tmp_path / "bank" / "pilot.yaml").read_text())
    assert spec["task"]["system"].startswith("You are a support assistant for a bank.")
    assert "split" not in spec["data"] and "leakage" not in spec["data"]  # the user's splits
    # 2 queries an intent in val.jsonl: no per-intent guard could judge them
    said = "77 of 77 labels have fewer than eval.min_support=5 validation examples in the "
    assert any(w.startswith(said + "validation file") for w in out["warnings"])
    assert spec["guards"] == [{"metric": "accuracy", "max_drop": 0.02}]
    refused = run_json("check", str(tmp_path / "bank"), expect=2)
    assert "data.source, data.permission must be stated" in refused["error"]

    human = run_cli("init", "bank2", "--dir", str(tmp_path), *args)
    assert human.returncode == 0, human.stderr
    assert "inferred chat rows: column 'messages'" in human.stdout
    assert "state data.source and data.permission in it" in human.stdout


def test_a_gsm8k_file_gets_its_answer_convention_as_the_format(tmp_path, tiny_model_dir):
    out = run_json("init", "math", "--dir", str(tmp_path), "--base", str(tiny_model_dir),
                   "--from", str(EXAMPLES / "gsm8k-format" / "data" / "gsm8k.jsonl"))  # fmt: skip
    assert out["task"] == "format" and out["fields"] == {
        "text": "question", "target": "answer", "id": "id"
    }  # fmt: skip
    spec = yaml.safe_load((tmp_path / "math" / "pilot.yaml").read_text())
    assert spec["task"]["regex"].startswith("(?s)(?:.*\\n)?#### (?P<answer>")
    assert spec["task"]["system"] == "Answer the request. End with a line '#### <number>'."
    assert spec["success"]["metric"] == "format_valid_rate"


def test_bad_sources_are_refused_and_nothing_is_written(tmp_path):
    good = _csv(tmp_path / "rows.csv", _tickets(12))
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    cases = [
        (["--from", str(tmp_path / "missing.csv")], "no such file"),
        (["--from", str(tmp_path / "notes.txt")], "cannot tell the format from the extension"),
        (["--from", str(good), "--from", str(good)], "cannot tell which split this file is"),
        (["--from", f"val={good}", "--from", f"test={good}"], "none of them the train split"),
        (["--from", str(good), "--text", "nope"], "--text 'nope': no such column"),
        (["--text", "body"], "--text: for a pilot made from your data; give --from too"),
    ]
    for args, said in cases:
        out = run_json("init", "p", "--dir", str(tmp_path), *args, expect=2)
        assert said in out["error"], (args, out["error"])
        assert not (tmp_path / "p").exists()
    out = run_json("init", "taken", "--dir", str(tmp_path), "--from", str(good), expect=2)
    assert "exists and is not empty" in out["error"]
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_the_demo_scaffold_is_unchanged_without_from(tmp_path):
    out = run_json("init", "demo", "--dir", str(tmp_path))
    assert out["task"] == "classification" and "inferred" not in out
    rows = (tmp_path / "demo" / "data" / "examples.jsonl").read_text().splitlines()
    assert len(rows) == out["n_examples"] and json.loads(rows[0])["label"]


def test_a_folder_of_images_becomes_an_image_pilot(tmp_path):
    """One folder per label (hidden files left behind), or train/val/test folders of those."""
    from image_helpers import LABELS, noise

    src = tmp_path / "photos"
    for k, label in enumerate(LABELS):
        for i in range(6):
            (src / label).mkdir(parents=True, exist_ok=True)
            noise(100 * k + i, size=(300, 240)).save(src / label / f"{i}.png")
    (src / ".DS_Store").write_text("x")
    out = run_json("init", "pics", "--dir", str(tmp_path), "--from", str(src),
                   "--source", "our photos", "--permission", "ours")  # fmt: skip
    pilot = tmp_path / "pics"
    assert out["task"] == "image_classification" and out["labels"] == LABELS
    assert out["n_examples"] == 18 and out["label_counts"] == dict.fromkeys(LABELS, 6)
    assert sorted(p.name for p in (pilot / "data" / "images").iterdir()) == LABELS
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    assert spec["model"]["base"] == "efficientnet-lite0"
    assert spec["task"]["image"]["size"] == 224  # the images are larger: the base's own
    assert spec["data"]["file"] == "data/images" and spec["data"]["leakage"] == "together"
    assert (
        "inferred from 18 sampled: 300x240 to 300x240 px, RGB" in (pilot / "pilot.yaml").read_text()
    )
    data = run_json("data", str(pilot))
    assert data["n_examples"] == 18 and set(data["per_category"]) == set(LABELS)

    split = tmp_path / ".cache" / "split"  # under a hidden folder: its images still count
    for part, n in (("train", 4), ("test", 2)):
        for k, label in enumerate(LABELS):
            (split / part / label).mkdir(parents=True)
            for i in range(n):
                noise(1000 * k + 10 * i + n).save(split / part / label / f"{i}.png")
    (split / "train" / "stray.txt").write_text("notes")
    out = run_json("init", "pics2", "--dir", str(tmp_path), "--from", str(split))
    spec = yaml.safe_load((tmp_path / "pics2" / "pilot.yaml").read_text())
    assert spec["data"]["files"] == {"train": "data/images/train", "test": "data/images/test"}
    assert spec["data"]["split"] == {"seed": 0, "val": 0.15}
    assert spec["task"]["image"]["size"] == 112  # 24x20 noise: small images, upscaled
    assert out["n_examples"] == 18 and any("1 file(s) at the top" in w for w in out["warnings"])

    (tmp_path / "one" / "cat").mkdir(parents=True)
    noise(1).save(tmp_path / "one" / "cat" / "a.png")
    bad = run_json("init", "p3", "--dir", str(tmp_path), "--from", str(tmp_path / "one"), expect=2)
    assert "1 folder(s) of images; an image pilot reads one folder per label" in bad["error"]
    assert not (tmp_path / "p3").exists()


def test_a_table_of_image_paths_becomes_an_image_pilot_with_its_images(tmp_path):
    """A CSV of image paths (relative to its folder) and labels, one photographer's images
    several rows: the table copied as it is, each image under the path it names, the
    photographer a split group; a path that names no file is warned, one out of the folder
    refused with nothing written."""
    from image_helpers import LABELS, noise

    src = tmp_path / "studio"
    rows = []
    for k, label in enumerate(LABELS):
        for i in range(8):
            rel = f"photos/{label}-{i}.jpg"
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            noise(100 * k + i, size=(150, 200)).save(src / rel)
            rows.append({"file": rel, "class": label, "photographer_id": f"p{(i + k) % 12}"})
    rows.append({"file": "photos/gone.jpg", "class": "cat", "photographer_id": "p1"})
    table = _csv(src / "labels.csv", rows)
    out = run_json("init", "shoot", "--dir", str(tmp_path), "--from", str(table),
                   "--source", "our studio", "--permission", "ours")  # fmt: skip
    pilot = tmp_path / "shoot"
    assert out["task"] == "image_classification" and out["labels"] == LABELS
    assert out["fields"] == {"image": "file", "label": "class", "id": None}
    assert out["images_copied"] == 24 and out["n_examples"] == 25
    assert (pilot / "data" / "labels.csv").read_bytes() == table.read_bytes()  # untouched
    assert (pilot / "photos" / "fox-7.jpg").read_bytes() == (src / "photos/fox-7.jpg").read_bytes()
    (gone,) = [w for w in out["warnings"] if "name no file" in w]
    assert "1 image path(s) in column 'file' name no file (first: 'photos/gone.jpg')" in gone
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    assert spec["data"]["fields"] == {"image": "file", "label": "class", "id": None}
    assert spec["data"]["split"]["group"] == "photographer_id"
    assert spec["task"]["image"]["size"] == 160  # 150 px on the shorter side, rounded up
    assert "# on_error: skip" in (pilot / "pilot.yaml").read_text()
    spec["data"]["on_error"] = "skip"
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    data = run_json("data", str(pilot))
    assert data["n_examples"] == 24 and set(data["per_category"]) == set(LABELS)
    assert data["groups"]["shared"] == []

    # images.csv beside images/<id>.png, the table naming each by its id only
    ids = tmp_path / "catalogue"
    (ids / "images").mkdir(parents=True)
    named = []
    for k, label in enumerate(LABELS):
        for i in range(7):
            uid = f"{k}{i}aa-{i}"
            noise(10 * k + i).save(ids / "images" / f"{uid}.png")
            named.append({"image": uid, "sender": k, "label": label})
    out = run_json("init", "byid", "--dir", str(tmp_path), "--from",
                   str(_csv(ids / "images.csv", named)))  # fmt: skip
    assert out["fields"] == {"image_template": "images/{image}.png", "label": "label", "id": None}
    assert out["images_copied"] == 21 and not any("no file" in w for w in out["warnings"])
    assert "input: column 'image' (its values name image files)" in out["inferred"][0]
    assert (tmp_path / "byid" / "images" / "20aa-0.png").is_file()
    spec = yaml.safe_load((tmp_path / "byid" / "pilot.yaml").read_text())
    spec["data"].update(source="s", permission="p")
    (tmp_path / "byid" / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    data = run_json("data", str(tmp_path / "byid"))
    assert data["n_examples"] == 21 and set(data["per_category"]) == set(LABELS)

    outside = _csv(tmp_path / "abs.csv", [{"image": str(src / "photos/cat-0.jpg"), "label": x}
                                          for x in ("a", "b") * 6])  # fmt: skip
    bad = run_json("init", "p4", "--dir", str(tmp_path), "--from", str(outside), expect=2)
    assert "12 image path(s) in column 'image' are absolute or lead up out of" in bad["error"]
    assert not (tmp_path / "p4").exists()


def test_conversations_of_several_turns_are_sized_whole(tmp_path, tiny_model_dir):
    """A chat file whose answer follows earlier exchanges: max_length fits the whole
    conversation, so `data` cuts none of it."""
    long = " ".join(f"detail{i}" for i in range(120))
    rows = []
    for i in range(40):
        k = ["billing", "delivery"][i % 2]
        turns = [{"role": "user", "content": f"hello, case {i}"},
                 {"role": "assistant", "content": "How can I help?"},
                 {"role": "user", "content": f"{long if i == 7 else 'about my order'} {i}"},
                 {"role": "assistant", "content": "Which order?"},
                 {"role": "user", "content": f"order {i}, {k} problem"},
                 {"role": "assistant", "content": k}]  # fmt: skip
        rows.append({"messages": turns})
    src = tmp_path / "dialogs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_json("init", "dialogs", "--dir", str(tmp_path), "--from", str(src),
                   "--base", str(tiny_model_dir), "--source", "s", "--permission", "p")  # fmt: skip
    assert out["task"] == "classification" and out["labels"] == ["billing", "delivery"]
    assert any("conversations of up to 5 turns before the answer" in r for r in out["inferred"])
    pilot = tmp_path / "dialogs"
    data = run_json("data", str(pilot))
    assert data["truncation"]["n_truncated"] == 0 and data["mask_audit"]["ok"]
    assert data["messages"]["with_earlier_turns"] == 40
    assert data["truncation"]["longest_prompt_tokens"] > 120  # the long turn is counted


def test_shards_by_a_quoted_pattern_are_copied_and_read_as_one_split(tmp_path, tiny_model_dir):
    """`--from 'train=hub/train-*.csv'`: the shards a data set is published in, copied with
    their names into data/train/, and the spec's pattern reads them all back."""
    hub = tmp_path / "download"
    hub.mkdir()
    rows = _tickets(60)
    for i in range(3):
        _csv(hub / f"train-0000{i}-of-00003.csv", rows[i * 15 : (i + 1) * 15])
    _csv(hub / "test-00000-of-00001.csv", rows[45:])
    (hub / ".train-00009-of-00003.csv").write_text("hidden")  # not a shard
    out = run_json("init", "hub", "--dir", str(tmp_path),
                   "--from", f"train={hub}/train-*.csv", "--from", str(hub / "test-*.csv"),
                   "--base", str(tiny_model_dir), "--source", "s", "--permission", "p")  # fmt: skip
    pilot = tmp_path / "hub"
    assert out["copied"] == {"train": "data/train/train-*.csv", "test": "data/test/test-*.csv"}
    assert sorted(p.name for p in (pilot / "data" / "train").iterdir()) == [
        f"train-0000{i}-of-00003.csv" for i in range(3)
    ]
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    assert spec["data"]["files"] == {"train": "data/train/train-*.csv",
                                     "test": "data/test/test-*.csv"}  # fmt: skip
    data = run_json("data", str(pilot))
    assert sum(data["splits"].values()) == 60 and data["splits"]["test"] == 15
    bad = run_json("init", "h2", "--dir", str(tmp_path), "--from", f"{hub}/dev-*.csv",
                   expect=2)  # fmt: skip
    assert "the pattern matches no file" in bad["error"] and not (tmp_path / "h2").exists()
