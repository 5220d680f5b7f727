"""The image baseline's kept training features: read back exactly, narrowed only where that
is exact, and never trusted when unreadable or of another shape."""

from __future__ import annotations

import numpy as np

from lorapilot.evaluate.feature_cache import cached as _cached
from lorapilot.evaluate.feature_cache import keep as _keep


def test_kept_features_read_back_exactly_in_half_the_bytes_when_float32_holds_them(tmp_path):
    f = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32).astype(np.float64)
    path = tmp_path / "runs" / ".features" / "train-x.npy"
    _keep(path, f)
    assert np.load(path).dtype == np.float32 and not list(path.parent.glob("*.tmp*"))
    back = _cached(path, 5)
    assert back is not None and back.dtype == np.float64 and np.array_equal(back, f)
    wide = f + 1e-12  # not a float32 value: kept as it is
    _keep(path, wide)
    assert np.load(path).dtype == np.float64 and np.array_equal(_cached(path, 5), wide)


def test_features_of_another_shape_or_unreadable_are_not_used(tmp_path):
    path = tmp_path / "train-x.npy"
    assert _cached(path, 5) is None  # none kept
    _keep(path, np.zeros((4, 3)))
    assert _cached(path, 5) is None  # another number of images
    path.write_bytes(b"\x93NUMPY garbage")
    assert _cached(path, 4) is None
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert _cached(path, 1) is None  # an object array would need pickle: refused
