"""Pieces every architecture shares: config parsing and weight lookup."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from inference.backends.base import Backend
from inference.errors import CancelledError, UnsupportedModelError
from inference.formats.quants import dequantize
from inference.formats.tensor import Checkpoint, TensorData
from inference.validate import config_values


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Build a config dataclass from a Hugging Face config dict, ignoring unknown keys; each
    value is checked against its field's type and the architecture's ranges first."""
    return cls(**config_values(cls, d))


class Weights:
    """Looks tensors up by Hugging Face name and converts them through the backend.

    Reports ``progress(bytes_done, bytes_total)`` per converted tensor and stops with
    CancelledError between tensors once ``cancel`` is set: loading is cancellable.
    """

    def __init__(self, ckpt: Checkpoint, backend: Backend,
                 progress: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None):
        self.ckpt = ckpt
        self.B = backend
        self.progress = progress
        self.cancel = cancel
        self.total = sum(t.nbytes for t in ckpt.tensors.values())
        self.done = 0

    def _convert(self, name: str, fn: Callable[[TensorData], Any]) -> Any:
        if self.cancel is not None and self.cancel.is_set():
            raise CancelledError(f"Loading {self.ckpt.path.name} was cancelled.")
        t = self.tensor(name)
        out = fn(t)
        self.done += t.nbytes
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)
        return out

    def has(self, name: str) -> bool:
        return name in self.ckpt.tensors

    def tensor(self, name: str) -> TensorData:
        try:
            return self.ckpt.tensors[name]
        except KeyError:
            raise UnsupportedModelError(
                f"{self.ckpt.path.name} has no tensor '{name}', which this architecture needs."
            ) from None

    def linear(self, name: str) -> Any:
        return self._convert(name, self.B.weight)

    def dense(self, name: str) -> Any:
        return self._convert(name, self.B.dense)

    def dense_rows(self, name: str, first: int) -> Any:
        """A table without its first ``first`` rows (XLM-R's positions start after the pad id)."""
        if not first:
            return self.dense(name)
        return self._convert(name, lambda t: self.B.dense(TensorData(
            t.name, (t.shape[0] - first, *t.shape[1:]), "F32",
            dequantize(t).astype(np.float32)[first:])))

    def optional_dense(self, name: str) -> Any | None:
        return self.dense(name) if self.has(name) else None

    def norm(self, name: str, offset: float = 0.0) -> Any:
        """A norm weight plus ``offset`` (Gemma's ``(1 + w)`` RMSNorm stores ``w``)."""
        if not offset:
            return self.dense(name)
        return self._convert(name, lambda t: self.B.dense(TensorData(
            t.name, t.shape, "F32", dequantize(t).astype(np.float32) + np.float32(offset))))

    def linear_split(self, name: str, sizes: list[int]) -> list[Any]:
        """A fused weight (Phi-3's qkv_proj, gate_up_proj) as one linear per block of rows;
        rows are independent in every layout, so quantized blocks are sliced, not decoded."""
        def split(t: TensorData) -> list[Any]:
            if sum(sizes) != t.shape[0]:
                raise UnsupportedModelError(
                    f"{self.ckpt.path.name}: {name} has {t.shape[0]} rows, expected "
                    f"{' + '.join(map(str, sizes))}.")
            out, r = [], 0
            for n in sizes:
                extra = {k: v[r:r + n] if isinstance(v, np.ndarray) else v
                         for k, v in t.extra.items()}
                out.append(self.B.weight(TensorData(f"{t.name}[{r}:{r + n}]",
                                                    (n, *t.shape[1:]), t.qtype,
                                                    t.data[r:r + n], extra)))
                r += n
            return out

        return self._convert(name, split)
