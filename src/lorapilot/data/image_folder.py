"""What a folder of images holds, for `lorapilot init --from FOLDER`: one folder per label
(`cat/*.jpg`), or train/val/test folders of those; the images per label, what is not a
labelled image (warned: `data` refuses it), and the sizes of a sample (read from the files'
headers) that task.image.size is chosen from."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lorapilot.data.infer import SPLIT_WORDS
from lorapilot.errors import UsageError
from lorapilot.spec import IMAGE_EXTENSIONS


@dataclass
class ImageFolder:
    """A folder of images, one folder per label (`<label>/...`), or split folders of those
    (`train/<label>/...`, `val/...`, `test/...`)."""

    path: Path
    counts: dict[str, int]
    splits: dict[str, str] = field(default_factory=dict)
    """Split -> its folder (`{"train": "train", "val": "dev"}`), in order; empty: lorapilot
    splits the images."""
    warnings: list[str] = field(default_factory=list)
    seen: str = ""
    """Sizes and modes of a sample of the images, as pilot.yaml says them."""
    shortest: int = 0
    """The smallest shorter side in that sample (0: none read)."""

    @property
    def size(self) -> int:
        """task.image.size: 224 (the default base's) unless the images are smaller: then
        their shorter side rounded up to 32, at least 112 (a tiny image upscaled 4x)."""
        if not self.shortest or self.shortest >= 224:
            return 224
        return max(112, 32 * math.ceil(self.shortest / 32))

    @property
    def labels(self) -> list[str]:
        return sorted(self.counts)


def scan_image_folder(path: Path) -> ImageFolder:
    """What the folder holds: labels and images per label, split folders, sampled sizes;
    UsageError when it is not a folder of label folders."""
    subdirs = sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    named = {d: SPLIT_WORDS[d.lower()] for d in subdirs if d.lower() in SPLIT_WORDS}
    if named and len(named) == len(subdirs):  # train/ val/ test/
        if "train" not in named.values():
            raise UsageError(f"--from {path}: split folders without a train folder")
        counts: dict[str, int] = {}
        warnings: list[str] = []
        order = sorted(named, key=lambda d: ("train", "val", "test").index(named[d]))
        for d in order:
            for label, n in _label_folders(path / d, warnings).items():
                counts[label] = counts.get(label, 0) + n
        return ImageFolder(path, counts, {named[d]: d for d in order}, warnings,
                           *_sample_sizes(path))  # fmt: skip
    warnings = []
    counts = _label_folders(path, warnings)
    return ImageFolder(path, counts, {}, warnings, *_sample_sizes(path))


def _sample_sizes(path: Path) -> tuple[str, int]:
    images = sorted(
        f for f in path.rglob("*")
        if f.suffix.lower() in IMAGE_EXTENSIONS
        and not any(p.startswith(".") for p in f.relative_to(path).parts)
    )  # fmt: skip
    return sample_sizes(images)


def sample_sizes(images: list[Path], n: int = 64) -> tuple[str, int]:
    """('64 sampled: 28x28 to 28x28 px, L', the smallest shorter side) for up to `n` of the
    images, spread over the list (headers only)."""
    from PIL import Image, UnidentifiedImageError

    files = images[:: max(1, len(images) // n)][:n]
    sizes, modes = [], Counter()
    for f in files:
        try:
            with Image.open(f) as im:
                sizes.append(im.size)
                modes[im.mode] += 1
        except (OSError, UnidentifiedImageError):
            continue  # `data` names it
    if not sizes:
        return "", 0
    small = min(sizes, key=lambda wh: wh[0] * wh[1])
    large = max(sizes, key=lambda wh: wh[0] * wh[1])
    said = (f"{len(sizes)} sampled: {small[0]}x{small[1]} to {large[0]}x{large[1]} px, "
            f"{', '.join(modes)}")  # fmt: skip
    return said, min(min(wh) for wh in sizes)


def _label_folders(path: Path, warnings: list[str]) -> dict[str, int]:
    """Images per label folder under `path`; files elsewhere and other files are warned."""
    counts: dict[str, int] = {}
    top, other = 0, 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        parts = Path(dirpath).relative_to(path).parts
        for f in filenames:
            if f.startswith("."):
                continue
            if not parts:
                top += 1
            elif Path(f).suffix.lower() in IMAGE_EXTENSIONS:
                counts[parts[0]] = counts.get(parts[0], 0) + 1
            else:
                other += 1
    if len(counts) < 2:
        raise UsageError(
            f"--from {path}: {len(counts)} folder(s) of images; an image pilot reads one "
            "folder per label (at least 2), e.g. cat/*.jpg and dog/*.jpg"
        )
    if top:
        warnings.append(f"{path}: {top} file(s) at the top, in no label folder; `lorapilot "
                        "data` refuses them unless data.on_error is skip")  # fmt: skip
    if other:
        warnings.append(f"{path}: {other} file(s) without an image extension "
                        f"({', '.join(IMAGE_EXTENSIONS)}); `lorapilot data` refuses them unless "
                        "data.on_error is skip")  # fmt: skip
    rare = sorted(k for k, v in counts.items() if v < 3)
    if rare:
        warnings.append(f"label folder(s) with fewer than 3 images: {', '.join(rare)}")
    return counts
