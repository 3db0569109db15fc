"""Sentence embeddings: batching planner, mean pooling, L2 normalisation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.errors import CancelledError


@dataclass(frozen=True)
class BatchLimits:
    """What one forward call may hold. ``max_tokens`` bounds batch x padded length, which
    bounds activation memory (the attention scores grow with batch x heads x len^2)."""

    max_batch: int = 32
    max_tokens: int = 8192


def plan_batches(lengths: Sequence[int], limits: BatchLimits) -> list[list[int]]:
    """Group input indices into chunks of similar length (sorted, longest first), each within
    ``limits``. Sorting keeps padding small; results do not depend on the grouping."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    chunks: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # longest in the chunk (sorted)
        if cur and (len(cur) >= limits.max_batch or (len(cur) + 1) * width > limits.max_tokens):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average the token vectors the mask marks (padding excluded), as sentence-transformers."""
    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def embed_ids(
    model: Any,
    token_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    limits: BatchLimits,
    normalize: bool = True,
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
) -> np.ndarray:
    """Run an encoder over tokenized inputs; one row per input, in input order."""
    B = model.B
    n = len(token_ids)
    out = np.zeros((n, model.args.hidden_size), dtype=np.float32)
    done = 0
    for chunk in plan_batches([len(t) for t in token_ids], limits):
        if cancel is not None and cancel.is_set():
            raise CancelledError(f"Embedding cancelled after {done} of {n} inputs.")
        width = max(len(token_ids[i]) for i in chunk)
        ids = np.full((len(chunk), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.float32)
        for r, i in enumerate(chunk):
            ids[r, : len(token_ids[i])] = token_ids[i]
            mask[r, : len(token_ids[i])] = 1.0
        pos = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape)
        hidden = model(B.array(ids), B.array(np.ascontiguousarray(pos)),
                       B.array(np.zeros((len(chunk), 1), dtype=np.int64)), B.array(mask))
        out[chunk] = mean_pool(B.to_numpy(hidden), mask)
        done += len(chunk)
        if progress is not None:
            progress(done, n)
    return l2_normalize(out) if normalize else out
