"""The contract between file readers and backends.

A reader turns a file into a :class:`Checkpoint`: a Hugging Face style config and a dict of
:class:`TensorData` keyed by Hugging Face tensor names. Backends turn ``TensorData`` into
their own layout (dense or quantized); nothing else reads raw blocks.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Real models have at most a few hundred layers; the bound keeps a corrupt count from
# sizing per-layer structures before the tensors are compared with the config.
MAX_LAYERS = 10_000


@dataclass
class TensorData:
    """One weight as stored on disk.

    ``shape`` is the logical shape in NumPy order (outermost first): a linear weight is
    ``(out_features, in_features)`` whatever the file's own order.
    ``qtype`` is a GGML type name ("F32", "F16", "BF16", "Q4_0", ..., "Q6_K") or "MLX"
    for MLX affine-quantized safetensors.
    ``data`` holds float values for float types, and for block types the raw bytes as
    uint8 with shape ``(*shape[:-1], bytes_per_row)`` (usually a read-only memory map).
    For "MLX", ``data`` is the packed uint32 weight and ``extra`` holds
    ``scales``, ``biases``, ``group_size`` and ``bits``.
    """

    name: str
    shape: tuple[int, ...]
    qtype: str
    data: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in ("F32", "F16", "BF16")

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + sum(getattr(v, "nbytes", 0) for v in self.extra.values()))

    @property
    def layout(self) -> tuple[np.dtype, tuple[int, ...]]:
        """``data``'s element type and the shape of one of its rows (what stacking needs)."""
        return self.data.dtype, tuple(self.data.shape[1:])

    @staticmethod
    def stacked(name: str, parts: Sequence[TensorData], extra: dict[str, Any]) -> TensorData:
        """``parts`` one after another along the rows, as one tensor; made on first use."""
        first = parts[0]
        rows = sum(t.shape[0] for t in parts)
        out = DeferredTensor(name, (rows, *first.shape[1:]), first.qtype,
                             lambda: np.concatenate([t.data for t in parts]),
                             first.layout, sum(t.data_nbytes for t in parts), extra)
        out.parts = tuple(parts)  # a reader of some rows can take them from these alone
        return out

    @property
    def data_nbytes(self) -> int:
        return int(self.data.nbytes)


class DeferredTensor(TensorData):
    """A tensor whose ``data`` (rows permuted or stacked from views of the file) is made on
    first use and kept: a backend that finds the weight already converted in a cache of its
    own (:mod:`inference.formats.cache`) never reads the file's pages for it."""

    def __init__(self, name: str, shape: tuple[int, ...], qtype: str,
                 make: Callable[[], np.ndarray], layout: tuple[np.dtype, tuple[int, ...]],
                 nbytes: int, extra: dict[str, Any] | None = None) -> None:
        self._make: Callable[[], np.ndarray] | None = make
        self._data: np.ndarray | None = None
        self._layout, self._nbytes = layout, nbytes
        self.parts: tuple[TensorData, ...] = ()  # stacked(): the tensors its rows join
        super().__init__(name, shape, qtype, None, extra or {})  # type: ignore[arg-type]

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        if self._data is None:
            assert self._make is not None
            self._data, self._make = self._make(), None
        return self._data

    @data.setter
    def data(self, value: np.ndarray | None) -> None:
        if value is not None:
            self._data, self._make = value, None

    @property
    def layout(self) -> tuple[np.dtype, tuple[int, ...]]:
        return self._layout

    @property
    def data_nbytes(self) -> int:
        return self._nbytes

    @property
    def nbytes(self) -> int:
        return int(self._nbytes + sum(getattr(v, "nbytes", 0) for v in self.extra.values()))


@dataclass
class Checkpoint:
    """A model read from disk, before any backend sees it."""

    path: Path
    format: str  # "gguf" | "safetensors" | "mlx"
    config: dict[str, Any]  # Hugging Face config.json field names, incl. "model_type"
    tensors: dict[str, TensorData]
    metadata: dict[str, Any] = field(default_factory=dict)  # raw GGUF key/values, if any
    chat_template: str | None = None
    # What caches of derived data key on (GGUF: resolved path, size, modification time and
    # a digest of the header); None where the reader gives none.
    identity: str | None = None

    def release_pages(self) -> None:
        """Drop the memory-mapped file's pages from this process's resident memory (they
        stay in the page cache, and the map stays valid: a page read again comes back)."""
        seen: set[int] = set()
        for t in self.tensors.values():
            base = map_of(t._data if isinstance(t, DeferredTensor) else t.data)  # never made
            if base is not None and id(base) not in seen and hasattr(base, "madvise"):
                seen.add(id(base))
                try:
                    base.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError, AttributeError):
                    pass


def map_of(a: Any) -> mmap.mmap | None:
    """The memory map under an array (through its views, a np.memmap or a memoryview), or
    None."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else (
            getattr(a, "_mmap", None) or getattr(a, "base", None))
    return a


def release_array_pages(a: np.ndarray) -> None:
    """Drop the pages of the memory-mapped file under ``a`` from this process's resident
    memory, as :meth:`Checkpoint.release_pages` does for a whole file: the whole pages
    inside ``a``'s bytes (a neighbour's pages at either end stay). A no-op for an array
    that is no view of a map."""
    m = map_of(a)
    if m is None or not hasattr(m, "madvise") or not a.flags.c_contiguous:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        start = a.ctypes.data - np.frombuffer(m, dtype=np.uint8).ctypes.data
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, (start + a.nbytes) // page * page
        if hi > lo:
            m.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
