"""An export folder written whole or not at all: filled beside its final path, then renamed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lorapilot.base.manifest import MANIFEST, adapter_files
from lorapilot.errors import UsageError
from lorapilot.fsutil import atomic_write_json, follow_umask


def require_new_folder(out: Path) -> Path:
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not empty; choose a new folder")
    return out


def write_folder(out: Path, write: Callable[[Path], dict | None]) -> dict:
    """Fill a temp folder beside `out` with `write`, which returns the manifest to add (None:
    it wrote its own) and may raise to leave nothing behind, then rename the folder into
    place: a killed export leaves no half folder. Returns the files' sha256 (the manifest
    excluded)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        body = write(tmp)
        files = adapter_files(tmp)
        if body is not None:
            atomic_write_json(tmp / MANIFEST, {**body, "files": files})
        follow_umask(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files
