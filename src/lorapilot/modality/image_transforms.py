"""The image modality's preprocessing: one resolved pipeline (mode, resize, crop, scale,
normalise, training-only augments) that training, evaluation, `inspect` and the data version
all use, and its inverse for showing what the model sees.

The spec's `task.image` wins; what it leaves unset comes from the model's image processor
(`preprocessor_config.json`, as transformers writes it); what neither says is an error naming
the key, never a silent guess at the normalisation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lorapilot.data.images import eight_bit, model_pixels, upright
from lorapilot.errors import UsageError
from lorapilot.spec import ImageSpec

_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True)
class ImagePipeline:
    """Every parameter of the image -> tensor transform; `to_dict` is what is recorded."""

    size: int
    resize: str  # shorter_side | stretch | pad
    crop: str  # center | none
    mode: str  # RGB | L
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: tuple[str, ...]
    resample: str = "bilinear"
    source: str = "spec"  # where the unset keys came from: the model's processor, or defaults

    @property
    def channels(self) -> int:
        return 1 if self.mode == "L" else 3

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean"], d["std"], d["augment"] = list(self.mean), list(self.std), list(self.augment)
        return d

    def geometry(self, img: Any) -> Any:
        """Mode, resize and crop: the PIL image the model sees before scaling."""
        from PIL import Image, ImageOps

        resample = getattr(Image.Resampling, self.resample.upper())
        img = model_pixels(img, self.mode)  # upright, 8 bits, transparency on white
        s = self.size
        w, h = img.size
        if self.resize == "stretch":
            img = img.resize((s, s), resample)
        elif self.resize == "pad":
            scale = s / max(w, h)
            nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
            img = ImageOps.pad(img.resize((nw, nh), resample), (s, s), color=0)
        else:  # shorter_side
            scale = s / min(w, h)
            img = img.resize((max(s, round(w * scale)), max(s, round(h * scale))), resample)
        if self.crop == "center" and img.size != (s, s):
            w, h = img.size
            left, top = (w - s) // 2, (h - s) // 2
            img = img.crop((left, top, left + s, top + s))
        return img

    def __call__(self, img: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        """PIL image -> float32 array (channels, height, width), normalised; `rng` (training
        only) draws the augments."""
        from PIL import Image

        img = self.geometry(img)
        if rng is not None:
            if "hflip" in self.augment and rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if "vflip" in self.augment and rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
        x = np.asarray(img, dtype=np.float32) / 255.0
        x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)
        mean = np.asarray(self.mean, dtype=np.float32).reshape(-1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(-1, 1, 1)
        return np.ascontiguousarray((x - mean) / std)

    def view(self, x: np.ndarray) -> Any:
        """The inverse of scaling and normalising: the array as the image the model sees."""
        from PIL import Image

        mean = np.asarray(self.mean, dtype=np.float32).reshape(-1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(-1, 1, 1)
        px = np.clip(np.rint((x * std + mean) * 255.0), 0, 255).astype(np.uint8)
        if px.shape[0] == 1:
            return Image.fromarray(px[0], mode="L")
        return Image.fromarray(px.transpose(1, 2, 0), mode="RGB")


def _processor_size(proc: dict) -> int | None:
    for key in ("crop_size", "size"):
        v = proc.get(key)
        if isinstance(v, int):
            return v
        if isinstance(v, dict):
            for k in ("height", "shortest_edge", "width"):
                if isinstance(v.get(k), int):
                    return v[k]
    return None


def resolve_pipeline(spec: ImageSpec, processor: dict | None) -> ImagePipeline:
    """The pipeline that will run: spec keys first, then the model's processor, then the
    defaults (shorter side, center crop); size and normalisation must come from somewhere."""
    proc = processor or {}
    size = spec.size or _processor_size(proc)
    if size is None:
        raise UsageError(
            "task.image.size: not set, and the model has no image processor config "
            "(preprocessor_config.json) to take it from; set task.image.size"
        )
    resize = spec.resize
    crop = spec.crop
    if resize is None:
        v = proc.get("size")
        stretch = isinstance(v, dict) and "height" in v and "width" in v
        resize = "stretch" if stretch else "shorter_side"
    if crop is None:
        crop = "center" if proc.get("do_center_crop", not processor) else "none"
    channels = 1 if spec.mode == "L" else 3
    if spec.normalize == "none":
        mean: list[float] = [0.0] * channels
        std: list[float] = [1.0] * channels
    else:
        mean = spec.mean or proc.get("image_mean")
        std = spec.std or proc.get("image_std")
        if mean is None or std is None or proc.get("do_normalize") is False and not spec.mean:
            raise UsageError(
                "task.image.normalize: from_model, but the model has no image processor "
                "config with image_mean/image_std; set task.image.mean and .std, or "
                "normalize: none"
            )
        mean, std = _fit(list(mean), channels, "mean"), _fit(list(std), channels, "std")
    resample = _RESAMPLE.get(proc.get("resample", 2), "bilinear")
    unset = (
        spec.size is None
        or spec.resize is None
        or spec.crop is None
        or (spec.normalize == "from_model" and (spec.mean is None or spec.std is None))
    )
    return ImagePipeline(
        size=int(size),
        resize=resize,
        crop=crop,
        mode=spec.mode,
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
        augment=tuple(spec.augment),
        resample=resample,
        source="model" if processor and unset else ("defaults" if unset else "spec"),
    )


def _fit(values: list[float], channels: int, key: str) -> list[float]:
    """1 value for every channel; a 3-channel processor's stats averaged for a gray model."""
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    if channels == 1:
        return [sum(values) / len(values)]
    raise UsageError(
        f"task.image.{key}: {len(values)} values for {channels} channels (mode RGB needs 3)"
    )


# --------------------------------------------------------------------------- contact sheets

_TILE = 128
_CAPTION = 28


def contact_sheet(rows: list[tuple[Any, Any, str]], title: str) -> Any:
    """One PIL image: per example the original (left) beside what the model sees (right,
    de-normalised), captioned. Small images are enlarged with nearest so pixels stay pixels."""
    from PIL import Image, ImageDraw

    width = 2 * _TILE + 3 * 8
    height = _CAPTION + len(rows) * (_TILE + _CAPTION + 8) + 8
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    draw.text((8, 8), title[:40], fill=(0, 0, 0))
    y = _CAPTION
    for original, seen, caption in rows:
        for col, img in enumerate((original, seen)):
            tile = _fit_tile(img)
            x = 8 + col * (_TILE + 8) + (_TILE - tile.width) // 2
            sheet.paste(tile, (x, y + (_TILE - tile.height) // 2))
        draw.text((8, y + _TILE + 4), caption[:44], fill=(40, 40, 40))
        y += _TILE + _CAPTION + 8
    return sheet


def _fit_tile(img: Any) -> Any:
    from PIL import Image

    img = eight_bit(upright(img))
    img = img.convert("RGBA") if img.mode in ("P", "LA", "RGBA") else img.convert("RGB")
    if img.mode == "RGBA":  # show transparency on grey, so an RGBA class is visible as such
        back = Image.new("RGBA", img.size, (200, 200, 200, 255))
        img = Image.alpha_composite(back, img).convert("RGB")
    scale = _TILE / max(img.size)
    resample = Image.Resampling.NEAREST if scale >= 1 else Image.Resampling.LANCZOS
    if scale >= 1:
        scale = max(1, math.floor(scale))
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    return img.resize(size, resample)
