"""An image pilot through `check`, `data` and `inspect`, as a user runs them (#18's first part)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from conftest import run_cli, run_json
from image_helpers import LABELS, image_pilot, noise
from PIL import Image


def test_data_and_inspect_report_images_per_category(tmp_path):
    pilot = image_pilot(tmp_path / "p")
    assert run_cli("check", str(pilot)).returncode == 0
    d = run_json("data", str(pilot))
    assert d["n_examples"] == 24 and set(d["per_category"]) == set(LABELS)
    cat = d["images"]["per_category"]["cat"]
    assert cat["n"] == 8 and cat["mode"] == {"RGB": 8} and cat["size"] == {"24x20": 8}
    assert d["transforms"]["size"] == 16 and d["transforms"]["source"] == "spec"
    assert d["duplicates"]["counts"]["exact"] == 0 and d["shortcuts"] == []
    assert d["version"].startswith("dv-")

    r = run_json("inspect", str(pilot), "--per-category", "2")
    assert r["ok"] is True and r["version"] == d["version"]
    assert set(r["per_category"]) == set(LABELS)
    for c in LABELS:
        entry = r["per_category"][c]
        assert entry["mode"] == {"RGB": entry["n"]} and entry["width"]["max"] == 24
        with Image.open(entry["contact_sheet"]) as sheet:
            assert sheet.format == "PNG" and sheet.height > 2 * 128
    assert [e["transformed"]["shape"] for e in r["examples"]] == [[3, 16, 16]] * 6

    rep = run_json("report", str(pilot))
    html = Path(rep["html"]).read_text()
    assert "Images per category (all splits)" in html
    for c in LABELS:  # the contact sheets travel inside the one HTML file
        assert f'alt="contact sheet: {c}"' in html
    assert "Images per category" in Path(rep["markdown"]).read_text()


def test_a_class_converted_to_rgba_is_warned_about_by_name(tmp_path):
    pilot = image_pilot(tmp_path / "p")
    for f in (pilot / "data/images/dog").iterdir():
        Image.open(f).convert("RGBA").save(f)
    r = run_json("inspect", str(pilot))
    assert any("category 'dog' differs from the others in mode" in w for w in r["warnings"])
    assert {(w["category"], w["property"]) for w in r["shortcuts"]} == {("dog", "mode")}
    d = run_json("data", str(pilot))
    assert any("'dog'" in w and "mode" in w for w in d["warnings"])


def test_a_corrupt_png_exits_2_naming_the_file_or_is_skipped_and_counted(tmp_path):
    pilot = image_pilot(tmp_path / "p")
    (pilot / "data/images/fox/broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    proc = run_cli("data", str(pilot))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "data/images/fox/broken.png" in proc.stderr
    d = run_json("data", str(pilot), "--set", "data.on_error=skip")
    assert [s["file"] for s in d["skipped"]] == ["data/images/fox/broken.png"]
    assert d["n_examples"] == 24


def test_the_same_image_in_train_and_val_is_a_leak(tmp_path):
    pilot = image_pilot(tmp_path / "p")
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    shutil.move(pilot / "data/images", pilot / "data/train")
    (pilot / "data/val").mkdir()
    for label in LABELS:
        (pilot / "data/val" / label).mkdir()
        for i in range(3):
            noise(1000 + 10 * LABELS.index(label) + i).save(pilot / f"data/val/{label}/v{i}.png")
    noise(0).convert("L").save(pilot / "data/val/cat/copy.png")  # cat-00, stored gray
    Image.open(pilot / "data/train/cat/cat-00.png").save(pilot / "data/val/cat/same.bmp")
    spec["data"].pop("file")
    spec["data"]["files"] = {"train": "data/train", "val": "data/val"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec))
    proc = run_cli("data", str(pilot), "--json")
    assert proc.returncode == 1, proc.stderr
    assert "train:data/train/cat/cat-00.png ~ val:data/val/cat/same.bmp (exact, 1.00)" in (
        proc.stderr
    )


def test_an_image_too_small_for_the_default_base_is_a_usage_error(tmp_path, image_model_dir):
    pilot = image_pilot(tmp_path / "p")  # 16 px
    proc = run_cli("probe", str(pilot))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "task.image.size: 16 is too small for efficientnet-lite0" in proc.stderr


def test_baseline_is_a_linear_probe_fitted_on_train_and_scored_on_val(tmp_path, image_model_dir):
    pilot = image_pilot(tmp_path / "p", size=32)
    out = run_json("baseline", str(pilot), "--no-progress")
    assert out["status"] == "completed" and out["n"] == 6
    m = out["metrics"]
    assert set(m["per_category"]) == set(LABELS) and 0 <= m["macro_f1"] <= 1
    assert m["confusion"]["labels"] == LABELS
    assert set(out["random_head_metrics"]) == {"accuracy", "macro_f1", "invalid_rate"}
    assert out["protocol"]["mode"] == "classify" and "probe" not in out["protocol"]
    assert out["probe"]["fitted_on"] == {"split": "train", "n": 12}
    assert out["base"]["id"] == "efficientnet-lite0" and out["probe"]["iterations"] > 0
    rows = [json.loads(x) for x in Path(out["predictions"]).read_text().splitlines()]
    assert [r["gold"] for r in rows] == [r["category"] for r in rows]
    assert all(set(r["scores"]) == set(LABELS) and r["parsed"] in LABELS for r in rows)
    li = out["label_issues"]  # the probe reviews the training images' labels too
    assert li["n"] == 12 and Path(li["file"]).is_file()
    assert li["n_suspects"] == len(Path(li["file"]).read_text().splitlines())
    again = run_json("baseline", str(pilot), "--no-progress")
    assert again["metrics"] == m and again["eval_protocol"] == out["eval_protocol"]
    # the training split's features are kept for the next probe fit (the final test's)
    kept = pilot / out["probe"]["train_features"]
    assert kept.parent == pilot / "runs" / ".features" and kept.is_file()
    assert out["probe"]["train_features_reused"] is False
    assert again["probe"]["train_features_reused"] is True
    assert again["probe"]["train_features"] == out["probe"]["train_features"]
    assert Path(again["predictions"]).read_text() == Path(out["predictions"]).read_text()
    kept.write_bytes(b"not an array")  # unreadable: computed again and replaced, same result
    third = run_json("baseline", str(pilot), "--no-progress")
    assert third["probe"]["train_features_reused"] is False and third["metrics"] == m
    listed = run_json("runs", str(pilot), "--format", "json")["runs"]
    assert len(listed) == 3 and {r["kind"] for r in listed} == {"baseline"}  # .features: no run


def test_settings_not_built_for_images_are_refused_by_key(tmp_path):
    pilot = image_pilot(tmp_path / "p")
    for setting, key in (("train.grad_checkpointing=true", "train.grad_checkpointing"),):
        proc = run_cli("train", str(pilot), "--set", setting)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"{key}: " in proc.stderr and "not available for image pilots yet" in proc.stderr


def test_images_the_model_sees_otherwise_are_counted_and_named(tmp_path):
    """Transparency composited on white and an EXIF-turned photo: counted in `pixels`, each
    named in a warning; an opaque alpha band (the RGBA class above) is not counted."""
    pilot = image_pilot(tmp_path / "p")
    cat = pilot / "data/images/cat"
    rgba = Image.open(cat / "cat-00.png").convert("RGBA")
    rgba.putpixel((0, 0), (0, 0, 0, 0))
    rgba.save(cat / "cat-00.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(cat / "cat-01.png").save(cat / "cat-01.png", exif=exif)
    Image.open(cat / "cat-02.png").convert("RGBA").save(cat / "cat-02.png")  # opaque
    d = run_json("data", str(pilot))
    px = d["pixels"]
    assert px["transparent"] == {"n": 1, "examples": ["data/images/cat/cat-00.png"]}
    assert px["turned_upright"] == {"n": 1, "examples": ["data/images/cat/cat-01.png"]}
    assert px["scaled_16_bit"]["n"] == 0
    assert any("composited onto white" in w and "cat-00.png" in w for w in d["warnings"])
    assert any("EXIF orientation" in w and "cat-01.png" in w for w in d["warnings"])


def test_copies_of_an_image_stay_in_one_split_under_together(tmp_path):
    """data.leakage: together on an image folder that lorapilot splits: the copies (one stored
    gray, one as BMP) are found before the split and placed with their original."""
    pilot = image_pilot(tmp_path / "p")
    for i in range(4):  # cat-00 is noise(0)
        noise(0).convert("L").save(pilot / f"data/images/cat/gray{i}.png")
    Image.open(pilot / "data/images/cat/cat-00.png").save(pilot / "data/images/cat/same.bmp")
    failed = run_json("data", str(pilot), expect=1)
    assert failed["duplicates"]["n_cross_split"] > 0
    out = run_json("data", str(pilot), "--set", "data.leakage=together")
    assert out["duplicates"]["n_cross_split"] == 0 and out["n_examples"] == 24 + 5
    counts = out["duplicates"]["counts"]
    assert counts["exact"] + counts["near"] >= 5, counts  # six copies of one image
