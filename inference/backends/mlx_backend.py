"""MLX backend: Metal on Apple silicon, MLX's CPU device elsewhere (so CI runs it).

Weights: GGML blocks are repacked into MLX affine groups of 32, exactly, for every type
(:mod:`inference.formats.affine`; Q2_K, Q3_K and Q6_K hold each 16-weight sub-block as a
group of two digits a weight and read an expanded activation, :data:`MLX_TYPES`) and
multiplied with ``mx.quantized_matmul``; MLX-quantized safetensors keep their codes.

Precision: activations, dense weights, scales, biases and the KV cache share one dtype,
``float16`` on Metal (half the bytes a token reads) and ``float32`` on the CPU device and
in the parity tests; ``INFERDESK_MLX_DTYPE`` (float32, float16, bfloat16) overrides it, and
the probe's reason names it. Sampling runs in float32 whatever the mode. Matmuls
accumulate in float32 in every mode: Metal's kernels do; MLX's CPU ``quantized_matmul``
accumulates in the input dtype, so on the CPU device a 16-bit mode feeds it float32 and
rounds the product to the mode's dtype (the numbers Metal computes, see docs/mlx.md).

The token loop follows mlx-lm's ``generate_step``: the sampler (:class:`MlxSampler`) is
compiled, keeps the repetition history on the device, returns the token as an
``mx.array`` and ``async_eval``s it; generate_step queues step n+1 before reading step n
(one ``.item()`` per token). Evaluating the token evaluates every layer's KV-cache write,
so the graph never grows across tokens (tested).

Memory: prefill runs in chunks of :attr:`MlxBackend.prefill_chunk` tokens with
``mx.clear_cache`` between them, the KV cache grows in steps, peak memory is reset per
generation, and on Metal the wired limit is raised to the device's recommended working
set while any model is loaded (restored when the last one closes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import mlx.core as mx
import numpy as np

from inference.backends.base import (
    QUANT_TYPES,
    SCORE_COPIES,
    Backend,
    TokenSampler,
    host_rss,
    tiled_attention,
)
from inference.errors import BackendUnavailableError
from inference.events import MemorySample
from inference.formats.affine import (
    _BIT_SHIFTS,
    AFFINE_TYPES,
    GROUP,
    SUB,
    AffineType,
    Groups,
    block_groups,
    to_affine,
)
from inference.formats.quants import _CRUMB_SHIFTS, _f16, _q3_k_scales, dequantize
from inference.formats.tensor import TensorData
from inference.sampling import SamplingParams


def _q2_k_digits(b: np.ndarray) -> Groups:
    """Q2_K sub-block -> one group of 32 one-bit codes: ``q = lo + 2*hi``, scale
    ``3*d*sc``, bias ``-dmin*m`` (read against ``[x/3, 2*x/3]``)."""
    codes, s, z = block_groups(b, "Q2_K")  # lo = q, hi = 0 per sub-block
    q = codes.reshape(len(b), 16, 2, SUB)[:, :, :1]
    return np.concatenate([q & 1, q >> 1], axis=2).reshape(len(b), 512), 3 * s, z


def _q3_k_digits(b: np.ndarray) -> Groups:
    """Q3_K sub-block -> one group of 32 two-bit codes: ``q + 4 = lo + 4*hi`` (lo the low
    crumb, hi the high bit), scale ``5*d*sc``, bias ``-4*d*sc`` (read against
    ``[x/5, 4*x/5]``)."""
    n = len(b)
    low = (b[:, 32:96].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    high = (b[:, None, 0:32] >> _BIT_SHIFTS) & 1
    codes = np.concatenate([low.reshape(n, 16, 1, SUB), high.reshape(n, 16, 1, SUB)], axis=2)
    s = _f16(b, 108) * _q3_k_scales(b[:, 96:108]).astype(np.float32)  # exact: <= 17 bits
    return codes.reshape(n, 512), 5 * s, -4 * s


# The affine form MLX holds each GGML type in. Q2_K and Q3_K are split into digits two
# codes a weight (1 and 2 bits) instead of the shared table's (2-bit lo + empty hi; 8-bit
# pairs of sub-blocks): 4 and 6 bits a weight in float16 instead of 6 and 9.
MLX_TYPES: dict[str, AffineType] = {
    **AFFINE_TYPES, "Q2_K": AffineType(1, (3.0, 2.0)), "Q3_K": AffineType(2, (5.0, 4.0))}
_MLX_DECODERS = {"Q2_K": _q2_k_digits, "Q3_K": _q3_k_digits}


def to_mlx_affine(raw: np.ndarray, qtype: str
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, AffineType]:
    """:func:`inference.formats.affine.to_affine` with MLX's forms (:data:`MLX_TYPES`)."""
    return to_affine(raw, qtype, MLX_TYPES[qtype], _MLX_DECODERS.get(qtype))


DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
DTYPE_ENV = "INFERDESK_MLX_DTYPE"


@dataclass
class QWeight:
    """An (out, in) matrix in MLX affine layout: ``w`` packed uint32, per-group scales.

    ``expand`` (``(div, mult)``, see :mod:`inference.formats.affine`) means each weight has
    two codes and the activation is expanded per 16 inputs before the matmul."""

    w: mx.array
    scales: mx.array
    biases: mx.array
    group_size: int
    bits: int
    expand: tuple[float, float] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        codes = self.w.shape[1] * 32 // self.bits
        return self.w.shape[0], codes // (1 if self.expand is None else 2)

    @property
    def nbytes(self) -> int:
        return int(self.w.nbytes + self.scales.nbytes + self.biases.nbytes)


def _metal() -> bool:
    return mx.metal.is_available()


def _device_info() -> dict[str, Any]:
    return dict(mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info())


def _working_set() -> int:
    """Bytes Metal recommends one process keep resident (the GPU's usable total)."""
    return int(_device_info()["max_recommended_working_set_size"])


def _device_name() -> str:
    return str(_device_info().get("device_name", "unknown"))


def default_precision() -> str:
    """float16 on Metal, float32 on the CPU device; the environment variable wins."""
    name = os.environ.get(DTYPE_ENV) or ("float16" if _metal() else "float32")
    if name not in DTYPES:
        raise BackendUnavailableError(
            f"{DTYPE_ENV}={name} is not a precision MLX runs in; use one of {', '.join(DTYPES)}.")
    return name


def _floats(a: Any) -> np.ndarray:
    """MLX scales/biases from a reader as float32 (exact): float16, float32, or bfloat16
    bit patterns (uint16; NumPy has no bfloat16)."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


class _WiredLimit:
    """``mx.set_wired_limit(max_recommended_working_set_size)`` while any MLX model is
    loaded on Metal (weights stay resident instead of being paged between tokens); the
    previous limit comes back when the last one closes."""

    users = 0
    previous = 0

    @classmethod
    def acquire(cls) -> None:
        if cls.users == 0:
            cls.previous = mx.set_wired_limit(_working_set())
        cls.users += 1

    @classmethod
    def release(cls) -> None:
        cls.users -= 1
        if cls.users == 0:
            mx.synchronize()
            mx.set_wired_limit(cls.previous)


# Elementwise chains, each compiled into one fused kernel for any shape.
@partial(mx.compile, shapeless=True)
def _silu_mul(gate: mx.array, up: mx.array) -> mx.array:
    return gate * mx.sigmoid(gate) * up


@partial(mx.compile, shapeless=True)
def _gelu(x: mx.array) -> mx.array:
    return 0.5 * x * (1.0 + mx.erf(x * (1.0 / math.sqrt(2.0))))


@partial(mx.compile, shapeless=True)
def _gelu_tanh_mul(gate: mx.array, up: mx.array) -> mx.array:
    inner = math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3)
    return 0.5 * gate * (1.0 + mx.tanh(inner)) * up


@partial(mx.compile, shapeless=True)
def _softcap(x: mx.array, cap: mx.array) -> mx.array:
    return cap * mx.tanh(x / cap)


class MlxBackend(Backend):
    name = "mlx"
    prefill_chunk = 2048  # as mlx-lm's prefill_step_size
    preallocate_kv = False
    # Measured with mx.get_peak_memory on the CPU device (docs/app.md): the
    # fused attention with a causal mask keeps about one score array, with a key mask (or
    # the explicit soft-capped/windowed path) as many as the tiling budgets (the scores, the
    # masked scores, their softmax); one chunk's lazy graph keeps about twelve hidden-sized
    # rows a token live.
    score_copies = 1
    hidden_rows = 12

    def __init__(self, precision: str | None = None) -> None:
        self.precision = precision or default_precision()
        self.dtype = DTYPES[self.precision]
        self.device = f"{_device_name()} (Metal)" if _metal() else "CPU (MLX)"
        self._expanded: tuple[Any, Any, mx.array] | None = None
        self._wired = _metal()
        if self._wired:
            _WiredLimit.acquire()
        # The CPU device's quantized_matmul sums in its input dtype: upcast (see linear).
        self._upcast = not _metal() and self.dtype != mx.float32

    def close(self) -> None:
        if self._wired:
            self._wired = False
            _WiredLimit.release()
        self._expanded = None
        mx.clear_cache()

    def quant_types(self) -> set[str]:
        return set(QUANT_TYPES)

    def memory(self) -> MemorySample:
        # Active = bytes held by live arrays; MLX's buffer cache (mx.get_cache_memory) is
        # reusable free space and not counted as used. The total is what Metal recommends
        # one process keep resident, not the machine's RAM.
        total = _working_set() if _metal() else None
        return MemorySample(int(mx.get_active_memory()), total, int(mx.get_peak_memory()),
                            host_rss())

    def synchronize(self, *outputs: Any) -> None:
        """Run queued work; with ``outputs``, first make sure those lazy arrays are
        computed (a bare synchronize cannot see work that was never scheduled)."""
        arrays = [o for o in outputs if isinstance(o, mx.array)]
        if arrays:
            mx.eval(*arrays)
        mx.synchronize()

    def end_chunk(self, *outputs: Any) -> None:
        mx.eval(*[o for o in outputs if isinstance(o, mx.array)])
        mx.clear_cache()

    def start_generation(self, params: SamplingParams, prompt_ids: Sequence[int],
                         rng: np.random.Generator) -> MlxSampler:
        mx.reset_peak_memory()
        return MlxSampler(params, prompt_ids, rng)

    # --- moving data ----------------------------------------------------------------
    def array(self, a: np.ndarray) -> mx.array:
        a = np.asarray(a)
        if a.dtype.kind in "iu":
            return mx.array(a.astype(np.int32, copy=False))  # token ids and positions
        if a.dtype.kind == "f":
            return mx.array(a.astype(np.float32, copy=False)).astype(self.dtype)
        return mx.array(a)

    def to_numpy(self, x: mx.array) -> np.ndarray:
        if x.dtype == mx.bfloat16:  # NumPy has no bfloat16; float32 holds it exactly
            x = x.astype(mx.float32)
        return np.array(x)

    def weight(self, t: TensorData) -> mx.array | QWeight:
        if not t.is_quantized:
            return self.dense(t)
        # Scales and biases in the activations' dtype: quantized_matmul would cast them to
        # it on every call otherwise.
        if t.qtype == "MLX":
            x = t.extra
            rows = int(np.prod(t.shape[:-1]))
            s, z = _floats(x["scales"]), _floats(x["biases"])
            return QWeight(mx.array(np.asarray(t.data).reshape(rows, -1).view(np.uint32)),
                           self._scales(s.reshape(rows, -1)), self._scales(z.reshape(rows, -1)),
                           int(x["group_size"]), int(x["bits"]))
        raw = np.asarray(t.data).reshape(-1, t.data.shape[-1])
        w, s, z, at = to_mlx_affine(raw, t.qtype)
        return QWeight(mx.array(w), self._scales(s), self._scales(z), GROUP, at.bits, at.expand)

    def _score_copies(self, masked: bool, capped: bool) -> int:
        return SCORE_COPIES if masked or capped else self.score_copies

    def held_bytes(self, t: TensorData) -> int:
        """Affine codes plus a scale and a bias per group in the activations' dtype (twice
        the codes for the expanded types); everything else in that dtype."""
        n, size = math.prod(int(d) for d in t.shape), self.dtype.size
        if not t.is_quantized:
            return n * size
        if t.qtype == "MLX":
            bits, group, per = int(t.extra["bits"]), int(t.extra["group_size"]), 1
        else:
            at = MLX_TYPES[t.qtype]
            bits, group, per = at.bits, GROUP, at.codes_per_weight
        return per * (n * bits // 8 + 2 * (n // group) * size)

    def _scales(self, a: np.ndarray) -> mx.array:
        return mx.array(a).astype(self.dtype)

    def dense(self, t: TensorData) -> mx.array:
        return mx.array(np.ascontiguousarray(dequantize(t), dtype=np.float32)).astype(self.dtype)

    # --- ops --------------------------------------------------------------------------
    def embedding(self, table: mx.array | QWeight, ids: mx.array) -> mx.array:
        if not isinstance(table, QWeight):
            return table[ids]
        rows = ids.reshape(-1)
        w, s, z = table.w[rows], table.scales[rows], table.biases[rows]
        if table.expand is None:  # gather the packed rows, dequantize only those
            out = mx.dequantize(w, s, z, group_size=table.group_size, bits=table.bits)
        else:
            # Codes as exact integers, folded per weight: (s/div)*(lo + mult*hi) +
            # b*(1+mult)/div; each factor and the result are exact in float32.
            div, mult = table.expand
            one = mx.ones(s.shape, dtype=mx.float32)
            q = mx.dequantize(w, one, 0 * one, group_size=GROUP, bits=table.bits)
            q = q.reshape(len(rows), -1, 2, SUB)
            sf, zf = s.astype(mx.float32)[..., None], z.astype(mx.float32)[..., None]
            out = ((sf / div) * (q[:, :, 0] + mult * q[:, :, 1]) + zf * ((1 + mult) / div))
            out = out.reshape(len(rows), -1).astype(self.dtype)
        return out.reshape(*ids.shape, out.shape[-1])

    def _expand(self, x: mx.array, expand: tuple[float, float]) -> mx.array:
        """Each 16 inputs -> [x/div, mult*x/div]; reused while the same x feeds several
        matrices (q/k/v, gate/up)."""
        if self._expanded is not None and self._expanded[0] is x and self._expanded[1] == expand:
            return self._expanded[2]
        div, mult = expand
        lo = (x / div).reshape(*x.shape[:-1], -1, 1, SUB)
        xe = mx.concatenate([lo, lo * mult], axis=-2).reshape(*x.shape[:-1], 2 * x.shape[-1])
        self._expanded = (x, expand, xe)
        return xe

    def linear(self, x: mx.array, w: mx.array | QWeight, bias: mx.array | None = None
               ) -> mx.array:
        if isinstance(w, QWeight):
            if w.expand is not None:
                x = self._expand(x, w.expand)
            y = self._quantized_matmul(x, w)
        else:
            y = x @ w.T
        return y + bias if bias is not None else y

    def _quantized_matmul(self, x: mx.array, w: QWeight) -> mx.array:
        """``x @ w.T`` summed in float32: Metal's kernels do it for 16-bit inputs; on the
        CPU device the inputs are upcast (exactly) and the product rounded to the mode's
        dtype, as a Metal kernel's output is."""
        if not self._upcast:
            return mx.quantized_matmul(x, w.w, w.scales, w.biases, transpose=True,
                                       group_size=w.group_size, bits=w.bits)
        f32 = mx.float32
        y = mx.quantized_matmul(x.astype(f32), w.w, w.scales.astype(f32), w.biases.astype(f32),
                                transpose=True, group_size=w.group_size, bits=w.bits)
        return y.astype(self.dtype)

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
        tiled = tiled_attention(self.attention, q, k, v, scale, causal_offset, key_mask,
                                lambda parts: mx.concatenate(parts, axis=2),
                                window=window, softcap=softcap)
        if tiled is not None:
            return tiled
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
        return _softcap(x, mx.array(cap, dtype=x.dtype))

    def silu_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return _silu_mul(gate, up)

    def gelu_tanh_mul(self, gate: mx.array, up: mx.array) -> mx.array:
        return _gelu_tanh_mul(gate, up)

    def gelu(self, x: mx.array) -> mx.array:
        return _gelu(x)

    def zeros(self, shape: tuple[int, ...]) -> mx.array:
        return mx.zeros(shape, dtype=self.dtype)

    def sample(self, logits: mx.array, params: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
        s = MlxSampler(params, history, rng)
        return s.read(s.sample(logits))


class MlxSampler(TokenSampler):
    """Device-side sampling for one generation: tokens stay ``mx.array``s.

    The repetition history is a device array of the last ``repetition_window`` tokens
    (-1 = empty slot), rolled by the compiled step. A draw takes one host uniform from
    ``rng`` (uploaded, never read back), so draws equal the NumPy sampler's."""

    lazy = True

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int],
                 rng: np.random.Generator):
        self.params = params
        self.rng = rng
        self.step = _compiled_sampler(params.temperature, params.top_k, params.top_p,
                                      params.min_p, params.repetition_penalty)
        w = max(1, params.repetition_window)
        recent = list(prompt_ids)[-w:] if params.repetition_penalty != 1.0 else []
        self.history = mx.array([-1] * (w - len(recent)) + recent, dtype=mx.int32)

    def sample(self, row: mx.array) -> mx.array:
        u = mx.array(0.0 if self.params.greedy else self.rng.random(), dtype=mx.float32)
        tok, self.history = self.step(row, self.history, u)
        mx.async_eval(tok, self.history)
        return tok

    def as_input(self, tok: mx.array) -> mx.array:
        return tok.reshape(1, 1)

    def read(self, tok: mx.array) -> int:
        return int(tok.item())


@lru_cache(maxsize=32)
def _compiled_sampler(temperature: float, top_k: int, top_p: float, min_p: float,
                      penalty: float) -> Any:
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                       repetition_penalty=penalty)

    def step(logits: mx.array, history: mx.array, u: mx.array) -> tuple[mx.array, mx.array]:
        logits = logits.astype(mx.float32)
        n = logits.shape[0]
        finite = mx.all(mx.isfinite(logits))  # -1 below: the one value read tells NaN/Inf
        if penalty != 1.0:
            logits = penalize(logits, history, penalty)
        if p.greedy:
            tok = mx.argmax(logits)
        else:
            # Inverse-CDF draw, as the NumPy sampler: the count of cdf values <= u * total
            # is searchsorted(cdf, u * total, side="right").
            cdf = mx.cumsum(filtered_probs(logits, p))
            tok = mx.minimum(mx.sum(cdf <= u * cdf[-1]), n - 1)
        tok = mx.where(finite, tok.astype(mx.int32), -1)
        if penalty != 1.0:
            history = mx.concatenate([history[1:], tok[None]])
        return tok, history

    return mx.compile(step)


def penalize(logits: mx.array, history: mx.array, penalty: float) -> mx.array:
    """CTRL repetition penalty of inference.sampling, on the device. ``history`` holds
    token ids, -1 for an empty slot; those write into a spare slot past the vocabulary."""
    n = logits.shape[0]
    ids = mx.where(history < 0, n, history)
    padded = mx.concatenate([logits, mx.zeros((1,), dtype=logits.dtype)])
    vals = padded[ids]
    padded = mx.put_along_axis(padded, ids, mx.where(vals > 0, vals / penalty, vals * penalty),
                               axis=0)
    return padded[:n]


def filtered_probs(logits: mx.array, p: SamplingParams) -> mx.array:
    """inference.sampling.filtered_probs on the device, in float32 (Metal has no float64):
    temperature, then top-k, top-p, min-p as one kept prefix of the sorted order. With
    temperature alone nothing is sorted."""
    z = logits.astype(mx.float32) / p.temperature
    probs = mx.softmax(z, axis=-1, precise=True)
    n = probs.shape[0]
    if not (0 < p.top_k < n) and p.top_p >= 1.0 and p.min_p <= 0.0:
        return probs
    order = mx.argsort(-probs)
    sorted_p = probs[order]
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
    try:
        precision = default_precision()
    except BackendUnavailableError as e:
        return False, str(e)
    if _metal():
        return True, f"Metal GPU {_device_name()}, {precision}"
    return True, f"Metal unavailable, MLX runs on CPU, {precision}"


def create() -> MlxBackend:
    return MlxBackend()
