"""Numbers the embedding pane shows, computed off the GUI thread. Pure numpy, no Qt."""

from __future__ import annotations

import numpy as np

HEATMAP_MAX_SIDE = 400  # beyond this the heatmap shows block means (pixels, not sentences)


def normalise(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.maximum(norms, 1e-12)


def heatmap(v: np.ndarray, max_side: int = HEATMAP_MAX_SIDE) -> tuple[np.ndarray, int]:
    """Cosine-similarity image of at most ``max_side`` squared pixels, and the block size.

    For n > max_side the rows are split into contiguous blocks and each pixel is the mean
    similarity between two blocks; that mean equals the dot product of the blocks' mean
    vectors, so the full n x n matrix is never built (20 000 sentences stay cheap).
    """
    v = normalise(v)
    n = len(v)
    if n <= max_side:
        return v @ v.T, 1
    block = -(-n // max_side)
    pad = block * max_side - n
    means = np.concatenate([v, np.zeros((pad, v.shape[1]), np.float32)])
    counts = np.concatenate([np.ones(n), np.zeros(pad)]).reshape(max_side, block).sum(1)
    means = means.reshape(max_side, block, -1).sum(1)
    keep = counts > 0
    means = means[keep] / counts[keep, None].astype(np.float32)
    return means @ means.T, block


def project_2d(v: np.ndarray) -> np.ndarray:
    """PCA to two dimensions via the covariance eigenvectors (dim x dim, cheap for large n)."""
    v = np.asarray(v, dtype=np.float64)
    if len(v) < 2:
        return np.zeros((len(v), 2), np.float32)
    centred = v - v.mean(0)
    _, vecs = np.linalg.eigh(centred.T @ centred)
    return (centred @ vecs[:, ::-1][:, :2]).astype(np.float32)


def nearest(v: np.ndarray, query: np.ndarray, k: int = 10) -> list[tuple[int, float]]:
    """Indices and cosine scores of the ``k`` rows closest to ``query``, best first."""
    scores = normalise(v) @ normalise(query.reshape(1, -1))[0]
    k = min(k, len(scores))
    top = np.argpartition(-scores, k - 1)[:k] if k else np.array([], int)
    top = top[np.argsort(-scores[top])]
    return [(int(i), float(scores[i])) for i in top]
