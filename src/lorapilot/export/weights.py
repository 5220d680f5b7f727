"""Model weights read one tensor at a time. A GGUF conversion then holds one tensor and its
converted copy, not the model in float32 (4 bytes a parameter: 32 GB for an 8B base, which no
24 or 32 GB machine has to spare; bench/gguf_memory.py measures it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np


class Weights(Mapping[str, np.ndarray]):
    """Tensors by name: shapes known up front, float32 data read when a tensor is asked for
    (and not kept). `replaced` derives another such mapping (a merge, a dequantization)."""

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        read: Callable[[str], np.ndarray],
        dtypes: Mapping[str, str] | None = None,
    ):
        self._shapes = {k: tuple(int(x) for x in v) for k, v in shapes.items()}
        self._read = read
        self._dtypes = dict(dtypes or {})

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> Weights:
        """Arrays already in memory (small models, tests)."""
        dtypes = {k: "F32" if np.issubdtype(np.asarray(v).dtype, np.floating) else
                  np.asarray(v).dtype.name for k, v in arrays.items()}  # fmt: skip
        return cls(
            {k: np.shape(v) for k, v in arrays.items()}, lambda k: _float32(arrays[k]), dtypes
        )

    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[key]

    def is_float(self, key: str) -> bool:
        """Whether a tensor is stored floating (read as float32), without reading it."""
        return self._dtypes.get(key, "F").startswith(("F", "BF"))

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._shapes:
            raise KeyError(key)
        return self._read(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def replaced(self, fn: Callable[[str, Callable[[], np.ndarray]], np.ndarray]) -> Weights:
        """The same names and shapes, each tensor given by fn(name, read) when asked for, where
        read() reads this mapping's tensor (called only if fn needs it)."""
        return Weights(self._shapes, lambda k: fn(k, lambda: self._read(k)), self._dtypes)


def _float32(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if np.issubdtype(a.dtype, np.floating) else a


def _numpy(t) -> np.ndarray:
    """A torch tensor as numpy, floating ones widened to float32 exactly (bf16, the dtype of
    most 1-8B checkpoints, has no numpy dtype)."""
    return (t.float() if t.is_floating_point() else t).numpy()


def of_safetensors(files: list[Path]) -> Weights:
    """Every tensor of the safetensors files, each read from its file when asked for."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                where[key] = path
                sliced = f.get_slice(key)
                shapes[key], dtypes[key] = tuple(sliced.get_shape()), sliced.get_dtype()

    def read(key: str) -> np.ndarray:
        with safe_open(str(where[key]), framework="pt") as f:
            return _numpy(f.get_tensor(key))

    return Weights(shapes, read, dtypes)


def of_folder(folder: Path) -> Weights:
    return of_safetensors(sorted(folder.glob("*.safetensors")))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A (small) safetensors file whole, as numpy arrays, floating tensors float32: adapters."""
    weights = of_safetensors([path])
    return {k: weights[k] for k in weights}
