"""The reference backend: plain NumPy in float32. Every other backend is tested against it."""

from __future__ import annotations

import math

import numpy as np

from inference.backends.base import QUANT_TYPES, Backend, tiled_attention
from inference.formats.quants import dequantize
from inference.formats.tensor import TensorData
from inference.sampling import SamplingParams, sample_row


def _erf(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), ample for float32 GELU.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                        + t * 1.061405429))))
    return (sign * (1.0 - poly * np.exp(-a * a))).astype(x.dtype, copy=False)


def rope_angles(n: int, offset: int, dim: int, theta: float,
                freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables (n, dim/2) for positions offset..offset+n-1, as Hugging Face builds them."""
    inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    ang = np.arange(offset, offset + n, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class NumpyBackend(Backend):
    name = "numpy"
    device = "CPU (NumPy)"

    def quant_types(self) -> set[str]:
        return set(QUANT_TYPES)

    def array(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def weight(self, t: TensorData) -> np.ndarray:
        return np.ascontiguousarray(dequantize(t), dtype=np.float32)

    def dense(self, t: TensorData) -> np.ndarray:
        return np.ascontiguousarray(dequantize(t), dtype=np.float32)

    def embedding(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return table[np.asarray(ids, dtype=np.int64)]

    def linear(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        y = x @ w.T
        return y + bias if bias is not None else y

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        ms = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x / np.sqrt(ms + eps)) * w

    def layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        d = x - mu
        var = np.mean(np.square(d), axis=-1, keepdims=True)
        return d / np.sqrt(var + eps) * w + b

    def rope(self, x: np.ndarray, offset: int, theta: float, traditional: bool = False, *,
             freq_factors: np.ndarray | None = None) -> np.ndarray:
        dim = x.shape[-1]
        cos, sin = rope_angles(x.shape[-2], offset, dim, theta, freq_factors)
        if traditional:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = x1 * cos - x2 * sin
            out[..., 1::2] = x2 * cos + x1 * sin
            return out
        h = dim // 2
        x1, x2 = x[..., :h], x[..., h:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, *,
                  causal_offset: int | None = None, key_mask: np.ndarray | None = None,
                  window: int | None = None, softcap: float | None = None) -> np.ndarray:
        tiled = tiled_attention(self.attention, q, k, v, scale, causal_offset, key_mask,
                                lambda parts: np.concatenate(parts, axis=2),
                                window=window, softcap=softcap)
        if tiled is not None:
            return tiled
        b, hq, t, d = q.shape
        hk, s = k.shape[1], k.shape[2]
        # Grouped-query attention without copying K/V: fold the query groups into rows.
        qg = q.reshape(b, hk, (hq // hk) * t, d)
        scores = (qg @ k.transpose(0, 1, 3, 2)) * scale  # (b, hk, g*t, s)
        scores = scores.reshape(b, hk, hq // hk, t, s)
        if softcap is not None:
            scores = self.softcap(scores, softcap)
        if causal_offset is not None:
            last = causal_offset + np.arange(t)[:, None]
            allowed = np.arange(s)[None, :] <= last
            if window is not None:
                allowed &= np.arange(s)[None, :] > last - window
            scores = np.where(allowed, scores, -np.inf)
        if key_mask is not None:
            scores = np.where(key_mask[:, None, None, None, :] > 0, scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out = p.reshape(b, hk, (hq // hk) * t, s) @ v
        return out.reshape(b, hq, t, d).astype(np.float32, copy=False)

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        # sigmoid via tanh: no exp overflow for large |gate|.
        return gate * (0.5 + 0.5 * np.tanh(0.5 * gate)) * up

    def gelu_tanh_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        inner = np.float32(math.sqrt(2.0 / math.pi)) * (gate + np.float32(0.044715) * gate ** 3)
        return np.float32(0.5) * gate * (1.0 + np.tanh(inner)) * up

    def gelu(self, x: np.ndarray) -> np.ndarray:
        return 0.5 * x * (1.0 + _erf(x / np.float32(math.sqrt(2.0))))

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        c = np.float32(cap)
        return (c * np.tanh(x / c)).astype(np.float32, copy=False)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    def sample(self, logits: np.ndarray, params: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
        return sample_row(np, np.asarray(logits), params, history, rng)


def probe() -> tuple[bool, str]:
    return True, "reference CPU backend, always available"


def create() -> NumpyBackend:
    return NumpyBackend()
