"""The training split's probe features, kept between fits: extracting them is most of a
probe baseline's time, and the same features serve the baseline, the final test's refit and
`predict --base --linear-probe`. A file is named by the hash of everything the features
depend on (the caller's key: evaluation protocol, base weights, the examples' ids, dtype and
device), read back without pickle, and computed again when unreadable or of another shape.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from lorapilot.fsutil import atomic_write_bytes, sha256_json
from lorapilot.records import registry

FEATURES_DIR = ".features"  # under runs/: the training split's features, by what they hold


def cache_path(pilot_dir: Path, key: dict) -> Path:
    return registry.runs_dir(pilot_dir) / FEATURES_DIR / f"train-{sha256_json(key)[:16]}.npy"


def cached(path: Path, n: int) -> np.ndarray | None:
    """The kept features, or None when there are none, or unreadable or of another shape
    (they are then computed again and the file replaced)."""
    try:
        f = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    ok = f.ndim == 2 and f.shape[0] == n and f.dtype in (np.float32, np.float64)
    return f.astype(np.float64) if ok else None


def keep(path: Path, f: np.ndarray) -> None:
    """Written atomically: a killed process leaves no half file under the final name. In
    float32 where that holds them exactly (a model's features are float32 at most, widened
    for the fit): half the bytes in a pilot folder that travels to the rented machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    narrow = f.astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, narrow if np.array_equal(narrow, f) else f, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
