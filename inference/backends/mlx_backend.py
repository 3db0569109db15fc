"""MLX backend: Metal on Apple silicon, MLX's CPU device elsewhere (so CI runs it).

Quantized weights stay quantized: GGML blocks are repacked into MLX affine groups of 32
(policy and exactness per type in :mod:`inference.backends.mlx_repack`) and multiplied
with ``mx.quantized_matmul``; MLX-quantized safetensors keep their packed codes (scales
widened to float32, exactly). Dense weights
are float32 (the activation dtype of every backend, so parity holds on CPU and Metal).

Ops use MLX's fused kernels (``mx.fast.rms_norm``/``layer_norm``/``rope``/
``scaled_dot_product_attention``); masks are built from positions on the device.
MLX is lazy: nothing runs until a value is needed. The token loop materialises once per
step, in :meth:`MlxBackend.sample` (``.item()`` on the id), which evaluates every layer's
KV-cache write too, so the graph never grows across tokens (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from inference.backends.base import QUANT_TYPES, Backend, MemorySample, SamplingParams, host_rss
from inference.backends.mlx_repack import GROUP, repack
from inference.formats.quants import dequantize
from inference.formats.tensor import TensorData


@dataclass
class QWeight:
    """An (out, in) matrix in MLX affine layout: ``w`` packed uint32, per-group scales."""

    w: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    bits: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape[0], self.w.shape[1] * 32 // self.bits


def _metal() -> bool:
    return mx.metal.is_available()


def _device_name() -> str:
    info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
    return str(info.get("device_name", "unknown"))


def _floats(a: Any) -> np.ndarray:
    """MLX scales/biases from a reader as float32 (exact): float16, float32, or bfloat16
    bit patterns (uint16; NumPy has no bfloat16)."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


class MlxBackend(Backend):
    name = "mlx"

    def __init__(self) -> None:
        self.device = f"{_device_name()} (Metal)" if _metal() else "CPU (MLX)"

    def quant_types(self) -> set[str]:
        return set(QUANT_TYPES)

    def memory(self) -> MemorySample:
        # Active = bytes held by live arrays; MLX's buffer cache (mx.get_cache_memory) is
        # reusable free space and not counted as used.
        total = None
        if _metal():
            info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
            total = int(info["memory_size"])
        return MemorySample(int(mx.get_active_memory()), total, int(mx.get_peak_memory()),
                            host_rss())

    def synchronize(self, *outputs: Any) -> None:
        """Run queued work; with ``outputs``, first make sure those lazy arrays are
        computed (a bare synchronize cannot see work that was never scheduled)."""
        arrays = [o for o in outputs if isinstance(o, mx.array)]
        if arrays:
            mx.eval(*arrays)
        mx.synchronize()

    # --- moving data ----------------------------------------------------------------
    def array(self, a: np.ndarray) -> mx.array:
        a = np.asarray(a)
        if a.dtype.kind in "iu":
            return mx.array(a.astype(np.int32, copy=False))  # token ids and positions
        if a.dtype.kind == "f":
            return mx.array(a.astype(np.float32, copy=False))
        return mx.array(a)

    def to_numpy(self, x: mx.array) -> np.ndarray:
        return np.array(x)

    def weight(self, t: TensorData) -> mx.array | QWeight:
        if not t.is_quantized:
            return self.dense(t)
        # Scales and biases in float32, the activations' dtype: quantized_matmul casts them
        # to it on every call, so float16 would save memory at rest but add traffic per token.
        if t.qtype == "MLX":
            x = t.extra
            rows = int(np.prod(t.shape[:-1]))
            s, z = _floats(x["scales"]), _floats(x["biases"])
            return QWeight(mx.array(np.asarray(t.data).reshape(rows, -1).view(np.uint32)),
                           mx.array(s.reshape(rows, -1)), mx.array(z.reshape(rows, -1)),
                           int(x["group_size"]), int(x["bits"]))
        raw = np.asarray(t.data).reshape(-1, t.data.shape[-1])
        w, s, z, bits = repack(raw, t.qtype)
        return QWeight(mx.array(w), mx.array(s), mx.array(z), GROUP, bits)

    def dense(self, t: TensorData) -> mx.array:
        return mx.array(np.ascontiguousarray(dequantize(t), dtype=np.float32))

    # --- ops --------------------------------------------------------------------------
    def embedding(self, table: mx.array | QWeight, ids: mx.array) -> mx.array:
        if not isinstance(table, QWeight):
            return table[ids]
        rows = ids.reshape(-1)
        # Gather the packed rows, then dequantize only those (float32 scales: exact).
        out = mx.dequantize(table.w[rows], table.scales[rows], table.biases[rows],
                            group_size=table.group_size, bits=table.bits)
        return out.reshape(*ids.shape, out.shape[-1])

    def linear(self, x: mx.array, w: mx.array | QWeight, bias: mx.array | None = None
               ) -> mx.array:
        if isinstance(w, QWeight):
            y = mx.quantized_matmul(x, w.w, w.scales, w.biases, transpose=True,
                                    group_size=w.group_size, bits=w.bits)
        else:
            y = x @ w.T
        return y + bias if bias is not None else y

    def rms_norm(self, x: mx.array, w: mx.array, eps: float) -> mx.array:
        return mx.fast.rms_norm(x, w, eps)

    def layer_norm(self, x: mx.array, w: mx.array, b: mx.array, eps: float) -> mx.array:
        return mx.fast.layer_norm(x, w, b, eps)

    def rope(self, x: mx.array, offset: int, theta: float, traditional: bool = False, *,
             freq_factors: mx.array | None = None) -> mx.array:
        # MLX's traditional=False is the Hugging Face half-split pairing, as ours.
        d = x.shape[-1]
        if freq_factors is None:
            return mx.fast.rope(x, d, traditional=traditional, base=theta, scale=1.0,
                                offset=offset)
        # MLX takes periods (1 / frequency): theta^(2i/d) * factor[i].
        periods = mx.power(theta, mx.arange(0, d, 2, dtype=mx.float32) / d) * freq_factors
        return mx.fast.rope(x, d, traditional=traditional, base=None, scale=1.0,
                            offset=offset, freqs=periods)

    def attention(self, q: mx.array, k: mx.array, v: mx.array, scale: float, *,
                  causal_offset: int | None = None, key_mask: mx.array | None = None,
                  window: int | None = None, softcap: float | None = None) -> mx.array:
        t, s = q.shape[2], k.shape[2]
        if softcap is not None or (window is not None and s > window):
            return self._attention_explicit(q, k, v, scale, causal_offset, key_mask, window,
                                            softcap)
        mask: Any = None
        if causal_offset is not None:
            if causal_offset + t == s:
                # The usual KV-cache case: bottom-right aligned; one query sees every key.
                mask = "causal" if t > 1 else None
            else:
                mask = mx.arange(s)[None, :] <= (causal_offset + mx.arange(t))[:, None]
        if key_mask is not None:
            keep = (key_mask > 0)[:, None, None, :]
            if isinstance(mask, str):
                mask = mx.arange(s)[None, :] <= (causal_offset + mx.arange(t))[:, None]
            mask = keep if mask is None else mx.logical_and(mask, keep)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def _attention_explicit(self, q: mx.array, k: mx.array, v: mx.array, scale: float,
                            causal_offset: int | None, key_mask: mx.array | None,
                            window: int | None, softcap: float | None) -> mx.array:
        """Scores, soft-cap, window mask, softmax as separate MLX ops (SDPA has neither
        soft-capping nor a window); GQA folds query groups into rows as NumPy does."""
        b, hq, t, d = q.shape
        hk, s = k.shape[1], k.shape[2]
        qg = q.reshape(b, hk, (hq // hk) * t, d)
        scores = (qg @ k.transpose(0, 1, 3, 2)) * scale
        scores = scores.reshape(b, hk, hq // hk, t, s)
        if softcap is not None:
            scores = self.softcap(scores, softcap)
        keep: Any = None
        if causal_offset is not None:
            last = causal_offset + mx.arange(t)[:, None]
            keep = mx.arange(s)[None, :] <= last
            if window is not None:
                keep = mx.logical_and(keep, mx.arange(s)[None, :] > last - window)
        if key_mask is not None:
            km = (key_mask > 0)[:, None, None, None, :]
            keep = km if keep is None else mx.logical_and(keep, km)
        if keep is not None:
            scores = mx.where(keep, scores, -mx.inf)
        p = mx.softmax(scores, axis=-1, precise=True).reshape(b, hk, (hq // hk) * t, s)
        return (p @ v).reshape(b, hq, t, d)

    def softcap(self, x: mx.array, cap: float) -> mx.array:
        return cap * mx.tanh(x / cap)

    def silu_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return gate * mx.sigmoid(gate) * up

    def gelu_tanh_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        inner = math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3)
        return 0.5 * gate * (1.0 + mx.tanh(inner)) * up

    def gelu(self, x: mx.array) -> mx.array:
        return 0.5 * x * (1.0 + mx.erf(x * (1.0 / math.sqrt(2.0))))

    def add(self, a: mx.array, b: mx.array) -> mx.array:
        return a + b

    def mul(self, a: mx.array, b: mx.array) -> mx.array:
        return a * b

    def reshape(self, x: mx.array, shape: tuple[int, ...]) -> mx.array:
        return x.reshape(shape)

    def transpose(self, x: mx.array, axes: tuple[int, ...]) -> mx.array:
        return x.transpose(axes)

    def zeros(self, shape: tuple[int, ...]) -> mx.array:
        return mx.zeros(shape, dtype=mx.float32)

    def set_slice(self, dst: mx.array, src: mx.array, axis: int, start: int) -> mx.array:
        # Lazy slice update, like mlx-lm's cache; once the old buffer has no other user
        # MLX writes in place. Materialised by the step's sample() (see module docstring).
        idx = [slice(None)] * dst.ndim
        idx[axis] = slice(start, start + src.shape[axis])
        dst[tuple(idx)] = src
        return dst

    def narrow(self, x: mx.array, axis: int, start: int, length: int) -> mx.array:
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(start, start + length)
        return x[tuple(idx)]

    def sample(self, logits: mx.array, params: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
        logits = penalize(logits, history, params.repetition_penalty, params.repetition_window)
        if params.greedy:
            return int(mx.argmax(logits).item())
        probs = filtered_probs(logits, params)
        # Same inverse-CDF draw as the NumPy sampler: count of cdf values <= u * total
        # is searchsorted(cdf, u * total, side="right").
        cdf = mx.cumsum(probs)
        idx = int(mx.sum(cdf <= rng.random() * cdf[-1]).item())
        return min(idx, probs.shape[0] - 1)


def penalize(logits: mx.array, history: list[int], penalty: float, window: int) -> mx.array:
    """CTRL repetition penalty of inference.sampling, on the device."""
    if penalty == 1.0 or not history:
        return logits
    recent = mx.array(sorted(set(history[-window:])), dtype=mx.int32)
    vals = logits[recent]
    return mx.put_along_axis(logits, recent, mx.where(vals > 0, vals / penalty, vals * penalty),
                             axis=0)


def filtered_probs(logits: mx.array, p: SamplingParams) -> mx.array:
    """inference.sampling.filtered_probs on the device, in float32 (Metal has no float64):
    temperature, then top-k, top-p, min-p as one kept prefix of the sorted order."""
    z = logits.astype(mx.float32) / p.temperature
    probs = mx.softmax(z, axis=-1, precise=True)
    order = mx.argsort(-probs)
    sorted_p = probs[order]
    n = sorted_p.shape[0]
    rank = mx.arange(n)
    keep = rank < (p.top_k if p.top_k > 0 else n)
    if p.top_p < 1.0:
        keep = mx.logical_and(keep, (mx.cumsum(sorted_p) - sorted_p) < p.top_p)
    if p.min_p > 0.0:
        keep = mx.logical_and(keep, sorted_p >= p.min_p * sorted_p[0])
    keep = mx.logical_or(keep, rank == 0)
    kept = mx.put_along_axis(mx.zeros_like(probs), order, mx.where(keep, sorted_p, 0.0), axis=0)
    return kept / kept.sum()


def probe() -> tuple[bool, str]:
    if _metal():
        return True, f"Metal GPU {_device_name()}"
    return True, "Metal unavailable, MLX runs on CPU"


def create() -> MlxBackend:
    return MlxBackend()
