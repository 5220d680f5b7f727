"""The default image base: converted once from its wheel's pinned file, hashed, reloaded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lorapilot.base import image_models
from lorapilot.base.image_models import build_efficientnet, fetch_image_model, load_image_default
from lorapilot.base.models import resolve_base, verify_model_dir
from lorapilot.errors import UsageError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPILOT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_fetch_writes_a_hashed_safetensors_folder_and_reuses_it(home):
    first = fetch_image_model()
    assert not first.reused and first.source["file_sha256"] == image_models.WEIGHTS_SHA256
    files = {p.name for p in first.path.iterdir()}
    assert files == {
        "model.safetensors",
        "config.json",
        "preprocessor_config.json",
        "MANIFEST.json",
    }
    assert verify_model_dir(first.path)["ok"]
    proc = json.loads((first.path / "preprocessor_config.json").read_text())
    assert proc["image_mean"] == [0.485, 0.456, 0.406] and proc["crop_size"]["height"] == 224
    assert fetch_image_model().reused
    (first.path / "model.safetensors").write_bytes(b"broken")
    again = fetch_image_model()
    assert not again.reused and again.sha256 == first.sha256
    resolved = resolve_base("efficientnet-lite0")
    assert resolved.path == first.path and resolved.weights_sha256


def test_a_file_that_is_not_the_pinned_one_is_refused(home, monkeypatch):
    monkeypatch.setattr(image_models, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(UsageError, match="is not the pinned"):
        fetch_image_model()
    assert not (home / "models" / "efficientnet-lite0").exists()


def test_an_unfetched_default_names_the_command(home):
    with pytest.raises(UsageError, match="lorapilot model fetch --image"):
        resolve_base("efficientnet-lite0")


def test_plain_1x1_convolutions_compute_what_the_package_computes():
    from efficientnet_lite_pytorch import EfficientNet

    torch.manual_seed(0)
    original = EfficientNet.from_name("efficientnet-lite0").eval()
    swapped = build_efficientnet().eval()
    swapped.load_state_dict(original.state_dict(), strict=True)
    kinds = {type(m).__name__ for m in swapped.modules() if isinstance(m, torch.nn.Conv2d)}
    assert "Conv2d" in kinds
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(original(x), swapped(x))


def test_the_weights_are_imagenet_ones(image_model_dir):
    """matplotlib's sample photo of Grace Hopper: 652 'military uniform' first."""
    from matplotlib import cbook
    from PIL import Image

    from lorapilot.modality.image_transforms import resolve_pipeline
    from lorapilot.spec import ImageSpec

    proc = json.loads((image_model_dir / "preprocessor_config.json").read_text())
    pipe = resolve_pipeline(ImageSpec(), proc)
    with cbook.get_sample_data("grace_hopper.jpg") as f:
        x = pipe(Image.open(f))
    model = load_image_default(image_model_dir)
    with torch.no_grad():
        top = model(torch.from_numpy(np.ascontiguousarray(x))[None]).softmax(-1)[0].topk(3)
    assert int(top.indices[0]) == 652 and float(top.values[0]) > 0.3
    head = load_image_default(image_model_dir, num_labels=10)._fc
    assert head.out_features == 10 and head.in_features == 1280
