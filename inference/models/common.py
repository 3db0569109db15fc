"""Pieces every architecture shares: config parsing and weight lookup."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from inference.backends.base import Backend
from inference.errors import CancelledError, UnsupportedModelError
from inference.formats.quants import dequantize
from inference.formats.tensor import Checkpoint, TensorData
from inference.validate import config_values, ids_in_range


def check_token_ids(B: Backend, ids: Any, rows: int) -> None:
    """Every id of ``ids`` (batch, seq; a host or backend array) in ``[0, rows)``, else
    InvalidInputError: the one check between token ids and a backend's embedding gather,
    whatever called the model (an id past the table reads out of bounds in a quantized
    gather). Host arrays (numpy, cpu) are always checked. One id per row already on a
    device (mlx, cuda: a decode step, batched or not) is not read back: in generation it is
    the samplers', drawn from the output head's rows (which ``check_tensors`` pins to the
    table's), and reading it would make a lazy decode step wait for the one before it (or
    break a CUDA graph's capture); a one-token prompt reaching the model there has passed
    the tokenizer's check at load or ``logits``' own."""
    if isinstance(ids, np.ndarray) and not getattr(ids, "on_device", False):
        host = ids
    elif math.prod(ids.shape) <= 1 or (len(ids.shape) == 2 and ids.shape[1] == 1):
        return
    else:
        host = B.to_numpy(ids)
    ids_in_range(host, rows)


# Bytes of tensors converted between two releases of the file's pages (Weights): a load's
# resident memory holds at most about this much of the file beside what it converted into.
# Without it a first load of Qwen 2.5 7B Q4_K_M (4.4 GB file, 5.9 GB packed) peaked at
# 11.3 GB: every page of the file it read stayed resident until the load's end.
RELEASE_EVERY = 256 << 20


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Build a config dataclass from a Hugging Face config dict, ignoring unknown keys; each
    value is checked against its field's type and the architecture's ranges first."""
    return cls(**config_values(cls, d))


class Weights:
    """Looks tensors up by Hugging Face name and converts them through the backend.

    Reports ``progress(bytes_done, bytes_total)`` per converted tensor and stops with
    CancelledError between tensors once ``cancel`` is set: loading is cancellable. Every
    ``RELEASE_EVERY`` bytes converted, the file's pages read so far leave the process's
    resident memory (:meth:`Checkpoint.release_pages`; read again if a weight kept in file
    layout needs them).
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
        self._released = 0  # self.done at the last release of the file's pages

    def _convert(self, name: str, fn: Callable[[TensorData], Any]) -> Any:
        return self._convert_all([name], lambda ts: fn(ts[0]))

    def _convert_all(self, names: list[str], fn: Callable[[list[TensorData]], Any]) -> Any:
        """``fn`` over the named tensors; counts their bytes as done; cancellable before."""
        if self.cancel is not None and self.cancel.is_set():
            raise CancelledError(f"Loading {self.ckpt.path.name} was cancelled.")
        ts = [self.tensor(n) for n in names]
        out = fn(ts)
        self.done += sum(t.nbytes for t in ts)
        if self.done - self._released >= RELEASE_EVERY:
            self.ckpt.release_pages()
            self._released = self.done
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

    def norm(self, name: str, offset: float = 0.0) -> Any:
        """A norm weight plus ``offset`` (Gemma's ``(1 + w)`` RMSNorm stores ``w``)."""
        if not offset:
            return self.dense(name)
        return self._convert(name, lambda t: self.B.dense(TensorData(
            t.name, t.shape, "F32", dequantize(t).astype(np.float32) + np.float32(offset))))

    def linears(self, names: list[str], biases: list[str] | None = None, *,
                fused: str | None = None, sizes: list[int] | None = None) -> Linears:
        """Linears that read the same input (q/k/v, gate/up), stacked into as few weights as
        their types allow; ``fused`` names one tensor that already holds them all (Phi-3's
        qkv_proj, gate_up_proj), whose rows split by ``sizes``."""
        bias = [b if b is not None and self.has(b) else None
                for b in (biases or [None] * len(names))]
        if fused is not None:
            t = self.tensor(fused)
            if sizes is None or sum(sizes) != t.shape[0]:
                raise UnsupportedModelError(
                    f"{self.ckpt.path.name}: {fused} has {t.shape[0]} rows, expected "
                    f"{' + '.join(map(str, sizes or []))}.")
            return Linears(self.B, [(self.linear(fused), list(sizes), None)])
        parts: list[tuple[Any, list[int], Any]] = []
        run: list[int] = []  # indices of a run of consecutive stackable tensors
        for i in range(len(names) + 1):
            if run and (i == len(names) or not _stackable(self.tensor(names[run[0]]),
                                                          self.tensor(names[i]))):
                parts.append(self._stack([names[j] for j in run], [bias[j] for j in run]))
                run = []
            run.append(i)
        return Linears(self.B, parts)

    def _stack(self, names: list[str], bias: list[str | None]) -> tuple[Any, list[int], Any]:
        ts = [self.tensor(n) for n in names]
        sizes = [t.shape[0] for t in ts]
        if len(ts) == 1:
            return self.linear(names[0]), sizes, bias[0] and self.dense(bias[0])

        def stack(ts: list[TensorData]) -> Any:
            first = ts[0]
            extra = {k: np.concatenate([t.extra[k] for t in ts]) if isinstance(v, np.ndarray)
                     else v for k, v in first.extra.items()}
            return self.B.weight(TensorData.stacked("+".join(t.name for t in ts), ts, extra))

        w = self._convert_all(names, stack)
        b = None
        if any(x is not None for x in bias):  # absent biases are zeros
            host = np.concatenate([np.zeros(n, np.float32) if x is None else
                                   dequantize(self.tensor(x)).astype(np.float32).reshape(-1)
                                   for x, n in zip(bias, sizes, strict=True)])
            b = self.B.dense(TensorData("+".join(map(str, bias)), host.shape, "F32", host))
        return w, sizes, b


def _stackable(a: TensorData, b: TensorData) -> bool:
    """Whether b's rows can follow a's in one weight: same type, width and layout."""
    return (a.qtype == b.qtype and len(a.shape) == len(b.shape) == 2 and a.shape[1] == b.shape[1]
            and a.layout == b.layout
            and a.extra.keys() == b.extra.keys()
            and all(isinstance(v, np.ndarray) or v == b.extra[k] for k, v in a.extra.items()))


class Linears:
    """Several linears over one input, computed as few products as the weights allow.

    Stacking rows changes no result: every output row is its own dot product in every
    layout. It saves the launches (one decode mat-vec for q, k and v instead of three)."""

    def __init__(self, B: Backend, parts: list[tuple[Any, list[int], Any]]):
        self.B = B
        self.parts = parts  # (weight, row counts of the linears it holds, bias or None)

    def __call__(self, x: Any) -> list[Any]:
        out = []
        ys = self.B.linears(x, [(w, bias) for w, _, bias in self.parts])
        for y, (_, sizes, _) in zip(ys, self.parts, strict=True):
            if len(sizes) == 1:
                out.append(y)
                continue
            r = 0
            for n in sizes:
                out.append(self.B.narrow(y, -1, r, n))
                r += n
        return out
