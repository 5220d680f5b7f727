"""Image files as data: decoded once under a pixel limit, every bad file a named row."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from image_helpers import LABELS, image_pilot, noise
from PIL import Image

from lorapilot.data.dataset import load_all
from lorapilot.data.images import open_image, perceptual_hash, pixel_hash, resolve_image
from lorapilot.data.rows import BadRow
from lorapilot.errors import UsageError
from lorapilot.spec import load_pilot


def test_folder_layout_reads_one_record_per_file_labelled_by_its_folder(tmp_path):
    pilot = load_pilot(image_pilot(tmp_path, per_label=3))
    records, skipped = load_all(pilot)
    assert skipped == []
    assert [r.label for r in records] == [lab for lab in LABELS for _ in range(3)]
    r = records[0]
    assert r.id == r.text == r.source == "data/images/cat/cat-00.png"
    assert (r.image.width, r.image.height, r.image.mode, r.image.format) == (24, 20, "RGB", "PNG")
    assert r.image.bytes == (tmp_path / r.text).stat().st_size
    assert len(r.image.thumb) == 16 * 16


def test_jsonl_layout_reads_image_paths_and_labels(tmp_path):
    pilot = load_pilot(image_pilot(tmp_path, per_label=2, layout="jsonl"))
    records, _ = load_all(pilot)
    assert [r.id for r in records[:2]] == ["cat-0", "cat-1"]
    assert records[0].source == "data/images.jsonl:1" and records[0].image.format == "PNG"


def test_a_folder_outside_the_labels_is_refused_or_left_out_counted(tmp_path):
    folder = image_pilot(tmp_path, per_label=3)
    (folder / "data/images/not-sure").mkdir()
    noise(7).save(folder / "data/images/not-sure/x.png")
    with pytest.raises(UsageError, match="folder 'not-sure' is not one of the task labels"):
        load_all(load_pilot(folder))
    records, skipped = load_all(load_pilot(folder, sets=["data.unlisted_labels=drop"]))
    assert len(records) == 3 * len(LABELS)
    assert [(s.file, s.label) for s in skipped] == [("data/images/not-sure/x.png", "not-sure")]


def test_a_group_split_needs_a_column_an_image_folder_lacks(tmp_path):
    from lorapilot.data.dataset import prepare_image_data

    pilot = load_pilot(image_pilot(tmp_path, per_label=3), sets=["data.split.group=owner"])
    with pytest.raises(UsageError, match="data.split.group: 'owner' is a column, and an image"):
        prepare_image_data(pilot, {})


def _pilot_with(tmp_path: Path, on_error: str, bad: dict[str, bytes | None]) -> object:
    folder = image_pilot(tmp_path, per_label=2)
    for rel, content in bad.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            continue
        p.write_bytes(content)
    return load_pilot(folder, sets=[f"data.on_error={on_error}"])


def _png(img: Image.Image) -> bytes:
    import io

    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_a_corrupt_png_stops_the_load_naming_the_file(tmp_path):
    pilot = _pilot_with(tmp_path, "fail", {"data/images/dog/bad.png": b"\x89PNG\r\n\x1a\nnot"})
    with pytest.raises(UsageError, match=r"data/images/dog/bad.png.*not an image Pillow can read"):
        load_all(pilot)


def test_under_skip_bad_files_are_counted_with_the_reason(tmp_path):
    whole = _png(noise(7, (40, 40)))
    pilot = _pilot_with(
        tmp_path,
        "skip",
        {
            "data/images/dog/truncated.png": whole[: len(whole) // 2],
            "data/images/dog/empty.png": b"",
            "data/images/dog/notes.txt": b"hello",
            "data/images/wolf/w.png": _png(noise(8)),
            "data/images/top.png": _png(noise(9)),
        },
    )
    records, skipped = load_all(pilot)
    assert len(records) == 6
    why = {Path(s.file).name: s.problem for s in skipped}
    assert set(why) == {"truncated.png", "empty.png", "notes.txt", "w.png", "top.png"}
    assert "corrupt or truncated" in why["truncated.png"]
    assert "empty (0 bytes)" in why["empty.png"]
    assert "not an image file extension" in why["notes.txt"]
    assert "folder 'wolf' is not one of the task labels" in why["w.png"]
    assert "top of an image folder" in why["top.png"]


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path):
    path = tmp_path / "big.png"
    Image.new("L", (3000, 3000)).save(path)  # 9 Mpx of zeros: a few kB on disk
    assert path.stat().st_size < 100_000
    with pytest.raises(BadRow, match=r"3000x3000 = 9000000 pixels, over task.image.max_pixels"):
        open_image(path, "big.png", max_pixels=1_000_000)


def test_paths_out_of_the_pilot_folder_are_refused(tmp_path):
    inside = tmp_path / "pilot"
    inside.mkdir()
    outside = tmp_path / "secret.png"
    noise(1).save(outside)
    os.symlink(outside, inside / "link.png")
    with pytest.raises(
        BadRow, match="leads out of the pilot folder through the symlink 'link.png'"
    ):
        resolve_image(inside, "link.png")
    # a linked folder is named as the way out, not the file inside it
    (tmp_path / "photos").mkdir()
    noise(2).save(tmp_path / "photos" / "a.png")
    os.symlink(tmp_path / "photos", inside / "images")
    with pytest.raises(
        BadRow,
        match=r"image 'images/a\.png' leads out of the pilot folder through the symlink "
        r"'images' \(to .*photos\); .* copy the images into it",
    ):
        resolve_image(inside, "images/a.png")
    with pytest.raises(BadRow, match="points outside the pilot folder"):
        resolve_image(inside, "../secret.png")
    with pytest.raises(BadRow, match="must be relative"):
        resolve_image(inside, str(outside))


def test_a_missing_image_says_where_a_file_of_that_name_is(tmp_path):
    pilot = tmp_path / "pilot"
    (pilot / "data/images").mkdir(parents=True)
    noise(1).save(pilot / "data/images/a1.png")
    with pytest.raises(BadRow, match=r"there is 'data/images/a1\.png': image paths are relative "
                       r"to the pilot folder, not to the data file"):  # fmt: skip
        resolve_image(pilot, "images/a1.png", Path("data"))
    with pytest.raises(BadRow, match=r"there is 'data/images/a1\.png': write the file's whole"):
        resolve_image(pilot, "data/images/a1", Path("data"))
    with pytest.raises(BadRow, match=r"no such file$"):
        resolve_image(pilot, "data/images/b2.png", Path("data"))


def test_pixel_hash_ignores_the_encoding_and_sees_one_pixel(tmp_path):
    gray = noise(3, mode="L")
    gray.save(tmp_path / "a.png")
    gray.convert("RGB").save(tmp_path / "b.bmp")
    a, _ = open_image(tmp_path / "a.png", "a.png", 10**6)
    b, _ = open_image(tmp_path / "b.bmp", "b.bmp", 10**6)
    assert pixel_hash(a) == pixel_hash(b)
    px = gray.copy()
    px.putpixel((0, 0), (px.getpixel((0, 0)) + 1) % 256)
    assert pixel_hash(px) != pixel_hash(gray)


def test_perceptual_hash_is_close_for_a_resized_copy_and_far_for_another_image():
    img = noise(5, (64, 64)).resize((64, 64))
    smooth = img.resize((16, 16)).resize((64, 64), Image.Resampling.BICUBIC)  # some structure
    near = smooth.resize((128, 128), Image.Resampling.BILINEAR)
    other = noise(6, (64, 64)).resize((16, 16)).resize((64, 64), Image.Resampling.BICUBIC)
    assert bin(perceptual_hash(smooth) ^ perceptual_hash(near)).count("1") <= 4
    assert bin(perceptual_hash(smooth) ^ perceptual_hash(other)).count("1") >= 16


def _image_dataset(tmp_path: Path, extra: list | None = None) -> Path:
    """An image pilot whose data is a `save_to_disk` DatasetDict with an `Image` column (the
    bytes embedded in the arrow files) and a ClassLabel label."""
    import yaml
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as HFImage

    folder = image_pilot(tmp_path, per_label=2)
    shutil.rmtree(folder / "data" / "images")
    features = Features({"image": HFImage(), "label": ClassLabel(names=LABELS)})

    def part(seed: int, n: int) -> Dataset:
        rows = [{"bytes": _png(noise(seed + i)), "path": f"img{seed + i}.png"} for i in range(n)]
        return Dataset.from_dict(
            {"image": rows, "label": [i % len(LABELS) for i in range(n)]}, features=features
        )

    train = part(0, 6)
    if extra:
        train = Dataset.from_dict(
            {"image": [*train["image"], *extra], "label": [*train["label"], 0]}, features=features
        )
    DatasetDict({"train": train, "validation": part(50, 3)}).save_to_disk(folder / "data" / "ds")
    spec = yaml.safe_load((folder / "pilot.yaml").read_text())
    spec["data"]["file"] = "data/ds"
    spec["data"].pop("split")
    (folder / "pilot.yaml").write_text(yaml.safe_dump(spec))
    return folder


def test_an_hf_image_column_is_read_like_image_files(tmp_path):
    folder = _image_dataset(tmp_path)
    records, skipped = load_all(load_pilot(folder))
    assert skipped == [] and len(records) == 9
    assert {r.split for r in records} == {"train", "val"}
    r = records[0]
    assert r.text.startswith(".cache/hf-images/") and r.text.endswith(".png")
    assert (folder / r.text).read_bytes() == _png(noise(0))  # the embedded bytes, unchanged
    assert (r.image.width, r.image.height, r.image.format) == (24, 20, "PNG")
    assert r.source == "data/ds/train:row 1" and r.label == LABELS[0]
    again, _ = load_all(load_pilot(folder))  # the stored file is reused, records identical
    assert [x.text for x in again] == [x.text for x in records]


def test_a_corrupt_image_in_an_hf_column_names_its_row(tmp_path):
    bad = {"bytes": b"\x89PNG\r\n\x1a\nnot", "path": "bad.png"}
    folder = _image_dataset(tmp_path, extra=[bad])
    with pytest.raises(UsageError, match=r"data/ds/train:row 7: .*not an image Pillow can read"):
        load_all(load_pilot(folder))
    records, skipped = load_all(load_pilot(folder, sets=["data.on_error=skip"]))
    assert len(records) == 9 and len(skipped) == 1
    assert skipped[0].file == "data/ds/train" and skipped[0].line == 7
