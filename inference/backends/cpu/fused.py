"""Fused row-wise ops of the CPU backend: norms, SiLU/GELU, RoPE and softmaxes, one numba
call instead of 4-6 NumPy passes (at one token NumPy's cost is its per-call overhead)."""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from inference.backends.cpu.ir import _NO_REASSOC, _dot8, _exp, _f32, _jit, _unit


# The decode step's row kernels: no reassociation (as attend_rows), so a specialisation
# compiled in this process and one loaded from numba's cache give the same bits (a lone
# row and a batch, contiguous or strided, may each take either); sums in a fixed order.
@_jit(fastmath=_NO_REASSOC)
def rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    n, d = x.shape
    for i in range(n):
        ss = _dot8(x[i], x[i])
        # Scalars kept float32: a float64 factor (math.sqrt, eps) widens the row loop.
        r = _f32(1.0 / math.sqrt(ss / d + eps))
        for k in range(d):
            out[i, k] = x[i, k] * r * w[k]


@_jit(fastmath=_NO_REASSOC)
def silu_mul_flat(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    for k in range(g.shape[0]):
        out[k] = g[k] / (_f32(1.0) + _exp(-g[k])) * u[k]


@_jit(fastmath=_NO_REASSOC)
def silu_mul_rows(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """out (T, n) = silu(g) * u for rows of g and u (T, n) of unit stride, strided or not
    (the gate and up columns of one stacked product): no copy, the bits of
    :func:`silu_mul_flat`."""
    for r in range(g.shape[0]):
        silu_mul_flat(_unit(g[r], out), _unit(u[r], out), out[r])


@_jit(fastmath=_NO_REASSOC)
def gelu_tanh_mul_flat(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """out = gelu_tanh(g) * u, as ``g * sigmoid(2 * inner)``: the same function as
    ``0.5 * g * (1 + tanh(inner))``, inner = sqrt(2 / pi) * (g + 0.044715 g^3), through
    :func:`.ir._exp`, so the loop vectorises (NumPy's form, four passes and a ``powf``
    per element, took 22-30 ms for 138 x 10240 elements; a Gemma 3 4B prefill has 34)."""
    for k in range(g.shape[0]):
        x = g[k]
        inner = _f32(-1.5957691216057308) * (x + _f32(0.044715) * (x * x * x))
        out[k] = x / (_f32(1.0) + _exp(inner)) * u[k]


@_jit(fastmath=_NO_REASSOC)
def gelu_tanh_mul_rows(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """:func:`silu_mul_rows` for :func:`gelu_tanh_mul_flat`."""
    for r in range(g.shape[0]):
        gelu_tanh_mul_flat(_unit(g[r], out), _unit(u[r], out), out[r])


SILU_CHUNK = 4096  # elements per unit of silu_mul_chunks' split


@_jit(inline="always")
def silu_rows_per(n: int) -> int:
    """Rows of ``n`` elements in one part of :func:`silu_mul_chunks` (about SILU_CHUNK
    elements, at least one row); the workers' split of a prefill's SiLU cuts the same."""
    return max(1, SILU_CHUNK // n)


@_jit(parallel=True, fastmath=_NO_REASSOC)
def silu_mul_chunks(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """:func:`silu_mul_rows` over parts of about SILU_CHUNK elements, split between numba's
    threads (a prefill's gate: ~200 k elements a SmolLM2 layer at 138 tokens)."""
    t, n = g.shape
    per = silu_rows_per(n)
    for c in prange((t + per - 1) // per):
        a = c * per
        b = min(a + per, t)
        silu_mul_rows(g[a:b], u[a:b], out[a:b])


@_jit(parallel=True, fastmath=_NO_REASSOC)
def gelu_tanh_mul_chunks(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """:func:`silu_mul_chunks` for :func:`gelu_tanh_mul_rows`."""
    t, n = g.shape
    per = silu_rows_per(n)
    for c in prange((t + per - 1) // per):
        a = c * per
        b = min(a + per, t)
        gelu_tanh_mul_rows(g[a:b], u[a:b], out[a:b])


@_jit(fastmath=_NO_REASSOC)
def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray) -> None:
    """NeoX (half-split) RoPE. x (rows, t, d) with tables (t, d/2)."""
    rows, t, d = x.shape
    h = d // 2
    for r in range(rows):
        for i in range(t):
            for k in range(h):
                a = x[r, i, k]
                b = x[r, i, k + h]
                out[r, i, k] = a * cos[i, k] - b * sin[i, k]
                out[r, i, k + h] = b * cos[i, k] + a * sin[i, k]


# --- encoder / prefill ops --------------------------------------------------------------
# Serial on purpose: they run between BLAS calls, and a numba (OpenMP) pool spinning next
# to OpenBLAS's pool on the same two cores halved MiniLM throughput (115 vs 229
# sentences/s, quiet machine, 2 threads). The encoder gets its parallelism from whole
# calls side by side (CpuBackend.map_calls), prefill from BLAS; the mat-vec kernels,
# which run with no BLAS around them, carry it in decode.

@_jit(inline="always")
def _erf(a: float) -> float:
    """Rational approximation of erf (Eigen's generic_fast_erf_float), |error| < 4e-7:
    pure multiply-adds and one division, so the GELU loop vectorises (math.erf is a
    scalar libm call, ~10x slower here)."""
    x = min(max(a, _f32(-4.0)), _f32(4.0))
    x2 = x * x
    p = x2 * _f32(-2.72614225801306e-10) + _f32(2.77068142495902e-08)
    p = x2 * p + _f32(-2.10102402082508e-06)
    p = x2 * p + _f32(-5.69250639462346e-05)
    p = x2 * p + _f32(-7.34990630326855e-04)
    p = x2 * p + _f32(-2.95459980854025e-03)
    p = x2 * p + _f32(-1.60960333262415e-02)
    q = x2 * _f32(-1.45660718464996e-05) + _f32(-2.13374055278905e-04)
    q = x2 * q + _f32(-1.68282697438203e-03)
    q = x2 * q + _f32(-7.37332916720468e-03)
    q = x2 * q + _f32(-1.42647390514189e-02)
    return x * p / q


@_jit()
def gelu_rows(x: np.ndarray, out: np.ndarray) -> None:
    """Exact (erf) GELU of a (rows, d) array."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            v = x[i, k]
            out[i, k] = _f32(0.5) * v * (_f32(1.0) + _erf(v * _f32(0.7071067811865476)))


@_jit(inline="always")
def _normalized(row: np.ndarray, mu: float, w: np.ndarray, b: np.ndarray, eps: float,
                out: np.ndarray) -> None:
    """out = LayerNorm(row) given its mean ``mu`` (float32 scalars: a float64 one widens
    the row loops); ``out`` may be ``row``."""
    d = row.shape[0]
    var = _f32(0.0)
    for k in range(d):
        t = row[k] - mu
        var += t * t
    r = _f32(1.0 / math.sqrt(var / d + eps))
    for k in range(d):
        out[k] = (row[k] - mu) * r * w[k] + b[k]


@_jit()
def layer_norm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float,
                    out: np.ndarray) -> None:
    n, d = x.shape
    for i in range(n):
        mu = _f32(0.0)
        for k in range(d):
            mu += x[i, k]
        _normalized(x[i], _f32(mu / d), w, b, eps, out[i])


@_jit()
def softmax_scores(sc: np.ndarray, scale: float, causal_offset: int,
                   mask: np.ndarray) -> None:
    """In place: sc (b, h, t, s) raw q.k scores -> attention weights.

    mask (b, s) is 1 for keys to attend and 0 for padding (exact zero weight);
    causal_offset >= 0 lets query i see keys 0 .. causal_offset + i, < 0: no limit.
    The two matmuls around it stay with BLAS; a fused numba kernel with short key loops
    measured 1.6x slower than NumPy, this split 1.4x faster."""
    b, h, t, s = sc.shape
    scale = _f32(scale)  # a Python float arrives as float64 and widened the whole loop
    for bh in range(b * h):
        bi = bh // h
        hh = bh - bi * h
        keep = mask[bi]
        for i in range(t):
            row = sc[bi, hh, i]
            last = s if causal_offset < 0 else min(s, causal_offset + i + 1)
            # Selects, not branches around the exp, so the loops vectorise.
            m = _f32(-3.0e38)
            for j in range(last):
                x = row[j] * scale if keep[j] > 0 else _f32(-3.0e38)
                row[j] = x
                m = x if x > m else m
            tot = _f32(0.0)
            for j in range(last):
                e = _exp(row[j] - m)
                e = e if keep[j] > 0 else _f32(0.0)
                row[j] = e
                tot += e
            inv = _f32(1.0) / tot
            for j in range(last):
                row[j] *= inv
            for j in range(last, s):
                row[j] = _f32(0.0)



@_jit()
def bias_gelu_rows(x: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(x + bias) over (rows, d), as np.add then :func:`gelu_rows`, the bias
    costing no pass of its own. ``out`` must not overlap ``x``: LLVM checks at run time,
    and on overlap takes its scalar loop (in place measured 8x slower)."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            v = x[i, k] + bias[k]
            out[i, k] = _f32(0.5) * v * (_f32(1.0) + _erf(v * _f32(0.7071067811865476)))


@_jit()
def add_norm_rows(x: np.ndarray, bias: np.ndarray, res: np.ndarray, w: np.ndarray,
                  b: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = layer_norm((x + bias) + res) over (rows, d), the sums rounded in that order
    as NumPy's two adds; one pass writes the sum into ``out``, the norm then runs in
    place there as :func:`layer_norm_rows`. ``out`` must not overlap ``x`` or ``res``
    (see :func:`bias_gelu_rows`): 3x the three separate passes when it does not."""
    n, d = x.shape
    for i in range(n):
        mu = _f32(0.0)
        for k in range(d):
            t = (x[i, k] + bias[k]) + res[i, k]
            out[i, k] = t
            mu += t
        _normalized(out[i], _f32(mu / d), w, b, eps, out[i])


@_jit()
def softmax_keys(sc: np.ndarray, scale: float, keep: np.ndarray) -> None:
    """In place: sc (b, s, m) raw scores with the keys on axis 1 (m = heads x queries) ->
    attention weights over axis 1; keys with ``keep[b, j] == 0`` (padding) get weight 0.

    The keys-outer layout makes every loop run over m (heads x queries, ~280 for a chunk of
    23-token inputs) instead of over one row's keys: :func:`softmax_scores` over (b, h,
    t, s) spent 3.2 ns a score with short encoder inputs, mostly in the scalar remainders
    of its vector loops."""
    b, s, m = sc.shape
    scale = _f32(scale)
    top = np.empty(m, dtype=np.float32)
    tot = np.empty(m, dtype=np.float32)
    for bi in range(b):
        x = sc[bi]
        top[:] = _f32(-3.0e38)
        for j in range(s):
            if keep[bi, j] > 0:
                row = x[j]
                for c in range(m):
                    v = row[c] * scale
                    top[c] = v if v > top[c] else top[c]
        tot[:] = _f32(0.0)
        for j in range(s):
            row = x[j]
            if keep[bi, j] > 0:
                for c in range(m):
                    e = _exp(row[c] * scale - top[c])
                    row[c] = e
                    tot[c] += e
            else:
                row[:] = _f32(0.0)
        for c in range(m):
            tot[c] = _f32(1.0) / tot[c]
        for j in range(s):
            if keep[bi, j] > 0:
                row = x[j]
                for c in range(m):
                    row[c] *= tot[c]
