"""The image pipeline: resolved from spec and processor, applied, inverted for display."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lorapilot.errors import UsageError
from lorapilot.modality.image_transforms import contact_sheet, resolve_pipeline
from lorapilot.spec import ImageSpec

VIT = {  # as transformers writes a ViT image processor
    "do_normalize": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 2,
    "size": {"height": 32, "width": 32},
}


def test_unset_keys_come_from_the_processor_and_spec_keys_win():
    p = resolve_pipeline(ImageSpec(), VIT)
    assert (p.size, p.resize, p.crop, p.mean, p.source) == (
        32,
        "stretch",
        "none",
        (0.5,) * 3,
        "model",
    )
    q = resolve_pipeline(ImageSpec(size=20, resize="pad", crop="center", mean=[0.1, 0.2, 0.3]), VIT)
    assert (q.size, q.resize, q.mean, q.std, q.source) == (
        20, "pad", (0.1, 0.2, 0.3), (0.5, 0.5, 0.5), "model",  # std from the processor
    )  # fmt: skip
    full = ImageSpec(size=20, resize="pad", crop="none", mean=[0.1] * 3, std=[0.2] * 3)
    assert resolve_pipeline(full, VIT).source == "spec"


def test_what_nobody_states_is_an_error_naming_the_key():
    with pytest.raises(UsageError, match=r"task.image.size: not set"):
        resolve_pipeline(ImageSpec(), None)
    with pytest.raises(UsageError, match=r"task.image.normalize: from_model"):
        resolve_pipeline(ImageSpec(size=16), None)
    p = resolve_pipeline(ImageSpec(size=16, normalize="none"), None)
    assert (p.resize, p.crop, p.mean, p.std, p.source) == (
        "shorter_side", "center", (0.0,) * 3, (1.0,) * 3, "defaults",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("resize", "crop"), [("shorter_side", "center"), ("stretch", "none"), ("pad", "none")]
)
def test_every_geometry_ends_at_the_model_size(resize, crop):
    p = resolve_pipeline(ImageSpec(size=16, resize=resize, crop=crop, normalize="none"), None)
    x = p(Image.new("RGB", (40, 20), (255, 0, 0)))
    assert x.shape == (3, 16, 16) and x.dtype == np.float32
    if resize == "pad":  # the 40x20 picture fills the width, black bars above and below
        assert x[0, 0, 0] == 0.0 and x[0, 8, 8] == 1.0
    else:
        assert np.allclose(x[0], 1.0) and np.allclose(x[1:], 0.0)


def test_shorter_side_keeps_the_aspect_and_crops_the_middle():
    img = Image.new("L", (30, 10), 0)
    img.paste(255, (10, 0, 20, 10))  # a white middle third
    p = resolve_pipeline(ImageSpec(size=10, mode="L", normalize="none"), None)
    x = p(img)
    assert x.shape == (1, 10, 10) and np.allclose(x, 1.0)  # only the middle is left


def test_normalise_then_view_gives_back_the_pixels():
    spec = ImageSpec(size=8, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    p = resolve_pipeline(spec, None)
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    x = p(img)
    assert abs(float(x.mean())) > 0.01 or float(x.std()) > 1.5  # normalised, not raw
    assert np.array_equal(np.asarray(p.view(x)), np.asarray(img))


def test_a_gray_image_becomes_three_equal_channels_for_an_rgb_model():
    p = resolve_pipeline(ImageSpec(size=8, normalize="none"), None)
    x = p(Image.new("L", (8, 8), 128))
    assert x.shape == (3, 8, 8) and np.allclose(x, 128 / 255)


def test_augments_only_with_a_generator():
    p = resolve_pipeline(ImageSpec(size=8, normalize="none", augment=["hflip"]), None)
    img = Image.new("L", (8, 8), 0)
    img.putpixel((0, 0), 255)
    assert p(img)[0, 0, 0] == 1.0  # evaluation: never flipped
    flips = [p(img, np.random.default_rng(s))[0, 0, 7] == 1.0 for s in range(20)]
    assert 0 < sum(flips) < 20


def test_contact_sheet_has_a_row_per_example():
    rows = [(Image.new("L", (28, 28), 200), Image.new("RGB", (112, 112)), "x") for _ in range(3)]
    sheet = contact_sheet(rows, "coat")
    assert sheet.mode == "RGB" and sheet.height > 3 * 128 and sheet.width >= 256


@pytest.mark.parametrize(
    "image",
    [
        {
            "size": 32,
            "resize": "shorter_side",
            "crop": "center",
            "mean": [0.5] * 3,
            "std": [0.2] * 3,
        },
        {"size": 20, "resize": "stretch", "crop": "none", "normalize": "none"},
    ],
)
def test_an_exported_processor_config_resolves_to_the_same_pipeline(image):
    """What export writes as preprocessor_config.json gives back the pipeline it was measured
    with when read as a base's processor (every key from the config, none from the spec)."""
    from lorapilot.modality.image_export import processor_config_of

    pipe = resolve_pipeline(ImageSpec(**image), None)
    config = processor_config_of(pipe, {"image_processor_type": "ViTImageProcessor"})
    again = resolve_pipeline(ImageSpec(), config)
    assert config["image_processor_type"] == "ViTImageProcessor"
    assert config["lorapilot_transforms"] == pipe.to_dict()
    for key in ("size", "resize", "crop", "mode", "mean", "std", "resample"):
        assert getattr(again, key) == getattr(pipe, key), key


# --------------------------------------------------------------------------- pixels as served


def _plain(size: int = 8) -> object:
    return resolve_pipeline(
        ImageSpec(size=size, resize="stretch", crop="none", normalize="none"), None
    )


def test_transparency_is_composited_on_white_as_transformers_does():
    from transformers.image_transforms import convert_to_rgb

    rgba = np.zeros((8, 8, 4), np.uint8)  # transparent black, one opaque red pixel
    rgba[2, 3] = (255, 0, 0, 255)
    rgba[5, 5] = (0, 0, 255, 128)  # half transparent blue
    img = Image.fromarray(rgba, "RGBA")
    seen = _plain()(img)
    expected = np.asarray(convert_to_rgb(img, return_numpy=True), np.float32) / 255.0
    assert np.allclose(seen, expected.transpose(2, 0, 1), atol=1e-6)
    assert seen[:, 0, 0].tolist() == [1.0, 1.0, 1.0]  # white, not the stored black
    pal = img.convert("P")  # a palette image with a transparent colour entry
    pal.info["transparency"] = pal.getpixel((0, 0))
    assert _plain()(pal)[:, 0, 0].tolist() == [1.0, 1.0, 1.0]


def test_exif_orientation_turns_the_image_upright_like_a_viewer(tmp_path):
    import io

    from lorapilot.data.images import open_image

    arr = np.random.default_rng(0).integers(0, 255, (12, 20, 3), np.uint8)
    upright_img = Image.fromarray(arr)  # 20 wide, 12 high as a viewer shows it
    stored = upright_img.transpose(Image.Transpose.ROTATE_90)  # stored turned: 12 x 20
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to view"
    buf = io.BytesIO()
    stored.save(buf, format="PNG", exif=exif)
    tagged = Image.open(io.BytesIO(buf.getvalue()))
    pipe = resolve_pipeline(ImageSpec(size=12, resize="shorter_side", normalize="none"), None)
    assert np.array_equal(pipe(tagged), pipe(upright_img))
    assert not np.array_equal(pipe(stored), pipe(upright_img))
    (tmp_path / "t.png").write_bytes(buf.getvalue())
    _, meta = open_image(tmp_path / "t.png", "t.png", 10**6)  # sizes as seen, tag recorded
    assert (meta.width, meta.height, meta.orientation) == (20, 12, 6)


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    from lorapilot.data.images import open_image, pixel_hash

    ramp = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000).astype(np.uint16)
    img = Image.fromarray(ramp)
    assert img.mode == "I;16"
    seen = resolve_pipeline(ImageSpec(size=8, resize="stretch", crop="none", normalize="none",
                                      mode="L"), None)(img)  # fmt: skip
    assert np.allclose(seen[0] * 255, np.rint(ramp / 257.0), atol=0.5)
    assert len(np.unique(seen)) == 64  # Pillow's convert leaves one grey and 63 whites
    other = Image.fromarray((ramp // 2 + 600).astype(np.uint16))  # clips to the same whites
    assert pixel_hash(img) != pixel_hash(other)
    img.save(tmp_path / "a.png")
    _, meta = open_image(tmp_path / "a.png", "a.png", 10**6)
    assert meta.mode == "I;16" and len(set(meta.thumb)) > 2
