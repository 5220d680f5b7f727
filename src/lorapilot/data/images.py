"""Image files as data: each opened once with Pillow under a pixel limit, checked, measured
and hashed; the ImageFolder layout (`<folder>/<label>/*.png`) read as records.

A corrupt, truncated or unsupported file, a decompression bomb, a path that leaves the pilot
folder (`..`, an absolute path, a symlink pointing out) is a BadRow naming the file: under
`data.on_error: fail` the load stops there (exit 2), under `skip` it is counted. The pixel
count is checked from the header before any pixel is decoded, so no allocation is unbounded.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from lorapilot.data.rows import UNLABELLED, BadRow, ImageMeta, Record, Skipped
from lorapilot.errors import UsageError
from lorapilot.spec import IMAGE_EXTENSIONS, DataSpec, TaskSpec

# The most bytes per pixel any supported format stores uncompressed (16-bit RGBA TIFF), plus
# headers: a file larger than this for its pixel limit is not an image worth decoding.
_BYTES_PER_PIXEL = 8
_HEADER_SLACK = 1 << 20


def _pil() -> Any:
    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, never half an image
    return Image


# Pillow's modes of more than 8 bits a channel that it converts by clipping at 255.
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_ORIENTATION = 0x0112


def orientation(img: Any) -> int:
    """The EXIF Orientation tag (1 = upright, 2-8 = mirrored and/or rotated), 1 if none."""
    try:
        value = img.getexif().get(_ORIENTATION, 1)
    except Exception:  # a malformed EXIF block: Pillow shows the pixels as stored
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def upright(img: Any) -> Any:
    """The image as a viewer shows it: turned by its EXIF orientation (a phone photo is often
    stored sideways with a tag saying so). transformers' `load_image` turns it the same way."""
    from PIL import ImageOps

    return ImageOps.exif_transpose(img) if orientation(img) != 1 else img


def eight_bit(img: Any) -> Any:
    """A 16-bit (or 32-bit integer) grayscale image scaled to 8 bits, value / 257 (65535 ->
    255). Pillow's `convert` clips such values at 255, which turns most of the image white."""
    if img.mode not in WIDE_MODES:
        return img
    Image = _pil()
    scaled = np.rint(np.asarray(img, dtype=np.float64) / 257.0)
    return Image.fromarray(np.clip(scaled, 0, 255).astype(np.uint8), mode="L")


def has_alpha(img: Any) -> bool:
    """Any pixel less than opaque in an alpha band, or a transparent colour (a palette or PNG
    `tRNS` entry): an all-opaque alpha band changes nothing."""
    if "A" in img.getbands():
        return img.getchannel("A").getextrema()[0] < 255
    return img.info.get("transparency") is not None


def flat_on_white(img: Any) -> Any:
    """Transparency composited onto white, as transformers' `convert_to_rgb` does: dropping
    the alpha band instead would show the model whatever colour transparent pixels store
    (often black), and the model would meet other pixels where it is served."""
    if not has_alpha(img):
        return img
    Image = _pil()
    rgba = img.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)


PIXEL_RULES = "exif-upright,16bit/257,alpha-on-white"
"""`model_pixels`' rules, in the data version of every image set they change."""


def pixel_rules_of(meta: ImageMeta) -> list[str]:
    """The rules of `model_pixels` that change this image against a plain `convert`:
    turned_upright (an EXIF orientation), transparent, scaled_16_bit."""
    applies = {
        "turned_upright": meta.orientation != 1,
        "transparent": meta.transparent,
        "scaled_16_bit": meta.mode in WIDE_MODES,
    }
    return [rule for rule, hit in applies.items() if hit]


def pixel_rules_apply(meta: ImageMeta) -> bool:
    """Whether `model_pixels` may differ from a plain `convert` for this image."""
    return bool(pixel_rules_of(meta))


def model_pixels(img: Any, mode: str) -> Any:
    """What every transform starts from: upright, 8 bits, transparency on white, in `mode`."""
    return flat_on_white(eight_bit(upright(img))).convert(mode)


EMBEDDED_DIR = ".cache/hf-images"
"""Where the images embedded in an HF dataset's `Image` column are stored, by sha256, inside
the pilot folder: from there every step reads, checks and hashes them as it does files."""


def embedded_image_path(pilot_dir: Path, value: Any) -> Any:
    """An HF `Image` column's value (`{"bytes", "path"}`) as a path relative to the pilot
    folder: embedded bytes are written once under PILOT/.cache/hf-images/ (atomically, named
    by their sha256, so two runs or ranks write the same file); a value with no bytes is its
    path (which must then lie inside the pilot folder). Anything else is returned as is, for
    the record builder to judge."""
    from lorapilot.fsutil import atomic_write_bytes

    if not isinstance(value, dict):
        return value
    data, path = value.get("bytes"), value.get("path")
    if not data:
        return path
    sha = hashlib.sha256(data).hexdigest()
    ext = Path(path).suffix.lower() if isinstance(path, str) else ""
    rel = f"{EMBEDDED_DIR}/{sha[:2]}/{sha}{ext if ext in IMAGE_EXTENSIONS else '.img'}"
    full = pilot_dir / rel
    if not full.is_file():
        full.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(full, bytes(data))
    return rel


def _stems(folder: Path) -> dict[str, list[str]]:
    """File name stem -> the names with that stem in `folder` (listed once per load)."""
    out: dict[str, list[str]] = {}
    with os.scandir(folder) as it:
        for e in it:
            out.setdefault(Path(e.name).stem, []).append(e.name)
    return out


def _missing_hint(root: Path, p: Path, near: Path | None) -> str:
    """Why a listed image may be missing: the path is written relative to the data file's
    folder, or without the file's extension (a set that names images by id)."""
    if near is not None and str(near) not in ("", ".") and (root / near / p).is_file():
        return (
            f" (there is {(near / p).as_posix()!r}: image paths are relative to the pilot "
            "folder, not to the data file)"
        )
    folder = (root / p).parent
    if folder.is_dir() and folder.resolve().is_relative_to(root):
        names = _STEMS.setdefault(folder, _stems(folder)).get(p.name, [])
        if names:
            shown = (p.parent / sorted(names)[0]).as_posix()
            return f" (there is {shown!r}: write the file's whole name, extension included)"
    return ""


_STEMS: dict[Path, dict[str, list[str]]] = {}


def resolve_image(pilot_dir: Path, rel: str, near: Path | None = None) -> Path:
    """The file an image path names, which must stay inside the pilot folder once symlinks
    are followed (BadRow otherwise). `near`: the data file's folder, to hint at a path
    written relative to it."""
    p = Path(rel)
    if p.is_absolute():
        raise BadRow(f"image path {rel!r} must be relative to the pilot folder")
    root = pilot_dir.resolve()
    full = (root / p).resolve()
    if not full.is_relative_to(root):
        link = next(
            (q for q in [*reversed((root / p).parents), root / p]
             if q.is_relative_to(root) and q != root and q.is_symlink()),
            None,
        )  # fmt: skip
        how = (
            f"leads out of the pilot folder through the symlink "
            f"{link.relative_to(root).as_posix()!r} (to {os.readlink(link)})"
            if link is not None
            else "points outside the pilot folder"
        )
        raise BadRow(
            f"image {rel!r} {how}; a pilot folder holds its data so that it can be copied "
            "whole to the machine that trains: copy the images into it"
        )
    if not full.exists():
        raise BadRow(f"image {rel!r}: no such file{_missing_hint(root, p, near)}")
    if not full.is_file():
        raise BadRow(f"image {rel!r}: not a regular file")
    return full


def open_image(path: Path, shown: str, max_pixels: int) -> tuple[Any, ImageMeta]:
    """Decode one file -> (the PIL image, loaded, first frame; its ImageMeta)."""
    img, data = _decode(path, shown, max_pixels)
    seen = upright(img)  # sizes and hashes as a viewer (and the model) sees the picture
    meta = ImageMeta(
        width=seen.width,
        height=seen.height,
        mode=img.mode,
        format=img.format or "?",
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        pixel_hash=pixel_hash(seen),
        phash=perceptual_hash(seen),
        thumb=thumbnail(seen),
        orientation=orientation(img),
        transparent=has_alpha(img),
    )
    return img, meta


def load_record_image(pilot_dir: Path, record: Record, max_pixels: int) -> Any:
    """A record's image again, for the model or a contact sheet, checked as at load time but
    not re-hashed; a file that changed on disk since `data` read it is a UsageError."""
    try:
        return _decode(resolve_image(pilot_dir, record.text), record.text, max_pixels)[0]
    except BadRow as e:
        raise UsageError(f"{record.source}: {e}") from None


def _decode(path: Path, shown: str, max_pixels: int) -> tuple[Any, bytes]:
    """The checks of every image file, then its first frame, loaded -> (image, file bytes)."""
    Image = _pil()
    size = path.stat().st_size
    if size == 0:
        raise BadRow(f"image {shown!r} is empty (0 bytes)")
    if size > max_pixels * _BYTES_PER_PIXEL + _HEADER_SLACK:
        raise BadRow(
            f"image {shown!r} is {size} bytes, more than an image of task.image.max_pixels="
            f"{max_pixels} pixels can hold"
        )
    data = path.read_bytes()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            if w * h > max_pixels:
                raise BadRow(
                    f"image {shown!r} is {w}x{h} = {w * h} pixels, over task.image.max_pixels="
                    f"{max_pixels} (a decompression bomb, or raise the limit)"
                )
            img.load()
    except BadRow:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise BadRow(f"image {shown!r} is too large to decode safely: {e}") from None
    except Image.UnidentifiedImageError:
        raise BadRow(
            f"image {shown!r} is not an image Pillow can read (corrupt or unsupported)"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise BadRow(f"image {shown!r} is corrupt or truncated: {e}") from None
    return img, data


def pixel_hash(img: Any) -> str:
    """sha256 of the pixels as RGBA with the size: the same picture stored as PNG or BMP, in
    mode L or RGB, hashes the same; any changed pixel changes it."""
    if img.mode in WIDE_MODES:  # every bit of a 16-bit image, not its clipped RGBA
        h = hashlib.sha256(f"{img.mode}:{img.width}x{img.height}:".encode())
        h.update(img.tobytes())
        return h.hexdigest()
    rgba = img.convert("RGBA")
    h = hashlib.sha256(f"{rgba.width}x{rgba.height}:".encode())
    h.update(rgba.tobytes())
    return h.hexdigest()


_DCT32 = None


def _dct_matrix(n: int = 32) -> np.ndarray:
    global _DCT32
    if _DCT32 is None:
        k = np.arange(n)[:, None]
        i = np.arange(n)[None, :]
        m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
        m[0] /= np.sqrt(2)
        _DCT32 = m
    return _DCT32


def perceptual_hash(img: Any) -> int:
    """64-bit pHash: grayscale 32x32, 2D DCT, the 8x8 lowest frequencies against their
    median. Resizing, re-encoding and small edits change few bits; different pictures about
    half of them."""
    Image = _pil()
    small = eight_bit(img).convert("L").resize((32, 32), Image.Resampling.LANCZOS)
    x = np.asarray(small, dtype=np.float64)
    d = _dct_matrix()
    low = (d @ x @ d.T)[:8, :8].ravel()
    bits = low > np.median(low)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


THUMB = 16


def thumbnail(img: Any) -> bytes:
    """The image as 16x16 grayscale bytes (bilinear): small enough to keep for every image,
    detailed enough to tell a re-encoded copy from a similar picture."""
    Image = _pil()
    return eight_bit(img).convert("L").resize((THUMB, THUMB), Image.Resampling.BILINEAR).tobytes()


def attach_images(
    records: list[Record], pilot_dir: Path, task: TaskSpec, data: DataSpec
) -> tuple[list[Record], list[Skipped]]:
    """Open every record's image (its `text` is the path): the kept records carry their
    ImageMeta; a bad image stops the load or is skipped, under data.on_error."""
    assert task.image is not None
    kept: list[Record] = []
    skipped: list[Skipped] = []
    _STEMS.clear()  # folder listings for the hints, fresh for each load
    for r in records:
        try:
            path = resolve_image(pilot_dir, r.text, Path(_where(r.source)[0]).parent)
            img, meta = open_image(path, r.text, task.image.max_pixels)
            img.close()
        except BadRow as e:
            if data.on_error == "fail":
                raise UsageError(f"{r.source}: {e}") from None
            file, line = _where(r.source)
            skipped.append(Skipped(file, line, str(e)))
            continue
        r.image = meta
        kept.append(r)
    return kept, skipped


_SOURCE = re.compile(r"(.*):(?:row )?(\d+)")


def _where(source: str) -> tuple[str, int]:
    """A record's source -> (file, line): `data/x.jsonl:7`, `x.parquet:row 7`; an image
    folder's record is its own file (line 0)."""
    m = _SOURCE.fullmatch(source)
    return (m.group(1), int(m.group(2))) if m else (source, 0)


def is_image_folder(path: Path) -> bool:
    """A folder of class folders (the ImageFolder layout), not a save_to_disk folder."""
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def folder_records(
    path: Path, rel: str, task: TaskSpec, split: str | None, data: DataSpec,
    answers: bool = True,
) -> tuple[list[Record], list[Skipped]]:  # fmt: skip
    """`<rel>/<label>/<file>` -> one record a file, labelled by its folder, in sorted order
    (ids and sources are the paths relative to the pilot folder). Hidden files are ignored;
    a file at the top level, a folder that is not a label, a file with another extension
    is a bad row. `answers` False (new photos to predict): a file at the top or in a folder
    that is not a label is an input without an answer."""
    labels = set(task.labels or [])
    rows: list[tuple[str, str | None, str | None]] = []  # (relative path, label, problem)
    unlisted: list[Skipped] = []  # under data.unlisted_labels: drop
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath).relative_to(path)
        for name in sorted(f for f in filenames if not f.startswith(".")):
            frel = Path(rel) / here / name
            shown = frel.as_posix()
            parts = here.parts
            if not answers and (not parts or parts[0] not in labels):
                ok = Path(name).suffix.lower() in IMAGE_EXTENSIONS
                known = ", ".join(IMAGE_EXTENSIONS)
                rows.append((shown, UNLABELLED, None if ok else
                             f"not an image file extension (known: {known})"))  # fmt: skip
            elif not parts:
                rows.append(
                    (
                        shown,
                        None,
                        "a file at the top of an image folder: put it in a "
                        "folder named after its label",
                    )
                )
            elif parts[0] not in labels:
                if data.unlisted_labels == "drop":
                    unlisted.append(Skipped(shown, 0, f"folder {parts[0]!r} is not in task.labels",
                                            label=parts[0]))  # fmt: skip
                    continue
                allowed = ", ".join(task.labels or [])
                rows.append(
                    (
                        shown,
                        None,
                        f"folder {parts[0]!r} is not one of the task labels ({allowed}); to "
                        "leave its images out, counted, set data.unlisted_labels: drop",
                    )
                )
            elif Path(name).suffix.lower() not in IMAGE_EXTENSIONS:
                rows.append(
                    (
                        shown,
                        None,
                        f"not an image file extension (known: {', '.join(IMAGE_EXTENSIONS)})",
                    )
                )
            else:
                rows.append((shown, parts[0], None))
    if not rows and not unlisted:
        raise UsageError(f"{rel}: no image files in the folder (expected {rel}/<label>/*.png)")
    records: list[Record] = []
    skipped: list[Skipped] = unlisted
    for i, (shown, label, problem) in enumerate(rows, 1):
        if problem is not None:
            if data.on_error == "fail":
                raise UsageError(f"{shown}: {problem}")
            skipped.append(Skipped(shown, i, problem))
            continue
        assert label is not None
        records.append(
            Record(
                id=shown,
                text=shown,
                label=None if label == UNLABELLED else label,
                target=None,
                source=shown,
                split=split,
                category=label,
            )
        )
    return records, skipped
