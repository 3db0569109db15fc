"""Activation rows quantized per group of 32 for the integer mat-vecs (:mod:`.matvec_int`):
``x ~ d * q``, ``d = max|x| / L``, ``q`` rounded to nearest, 16-bit (``L = 32767``) or 8-bit
(``L = 127``), with ``xsum = d * sum(q)`` per group."""

from __future__ import annotations

from functools import partial

import numpy as np

from inference.backends.cpu.ir import _bits_to_f32, _f32, _f32_to_bits, _jit
from inference.backends.cpu.layout import GROUP

LEVELS = {"int8": 127, "int16": 32767}  # largest |q| per activation width

# -- the activations --------------------------------------------------------------------


@_jit(fastmath=False)
def _quantize(x: np.ndarray, levels: float, q: np.ndarray, d: np.ndarray,
              xsum: np.ndarray) -> None:
    top = np.empty(d.shape[1], dtype=np.int32)
    for i in range(x.shape[0]):
        xi, qi = x[i], q[i]
        # Each group's max |x| as bits (sign cleared): non-negative floats order as their
        # bits, and an integer max vectorises where a float one is a serial chain without
        # fast-math. A pass of its own, apart from the rounding, and loops of a constant trip
        # count: 4x faster than one loop over range(g * GROUP, ...).
        for g in range(d.shape[1]):
            b, m = g * GROUP, np.int32(0)
            for j in range(GROUP):
                v = _f32_to_bits(xi[b + j]) & np.int32(0x7FFFFFFF)
                m = v if v > m else m
            top[g] = m
        for g in range(d.shape[1]):
            b, amax = g * GROUP, _bits_to_f32(top[g])
            inv = _f32(levels) / amax if amax > 0 else _f32(0.0)
            total = np.int32(0)
            for j in range(GROUP):
                c = np.int32(np.rint(xi[b + j] * inv))  # |c| <= levels
                qi[b + j] = c
                total += c
            d[i, g] = amax / _f32(levels)
            xsum[i, g] = d[i, g] * _f32(total)


def narrow(width: str, bits: int) -> bool:
    """Whether activations of ``width`` reach the kernels for ``bits``-bit codes as int8
    bytes: only 4-bit codes multiply bytes (``vpmaddubsw``); 5- and 8-bit ones widen every
    activation to 16 bits, so there int8's values (at most 127) are stored as int16 and
    run the 16-bit kernels: the same integer sums, one compiled kernel fewer per type."""
    return width == "int8" and bits == 4


def quantize_rows(x: np.ndarray, width: str, narrow: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, K) float32 -> the codes ``q`` (T, K; int8 for ``width`` int8 and ``narrow``,
    else int16, with values of ``width``), the scales ``d`` and ``xsum = d * sum(q)``
    (T, K/32) of each group of 32."""
    fill, xq = quantize_call(x, width, narrow)
    fill()
    return xq


def quantize_call(x: np.ndarray, width: str, narrow: bool = True
                  ) -> tuple[partial[None], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The buffers :func:`quantize_rows` returns, unfilled, and the call that fills them
    from ``x`` (a captured decode step replays it)."""
    t, k = x.shape
    q = np.empty((t, k), dtype=np.int8 if width == "int8" and narrow else np.int16)
    d = np.empty((t, k // GROUP), dtype=np.float32)
    xsum = np.empty_like(d)
    fill = partial(_quantize, x, float(LEVELS[width]), q, d, xsum)
    return fill, (q, d, xsum)


def quantize_part(x: np.ndarray, width: str, xq: tuple[np.ndarray, ...], r0: int, r1: int
                  ) -> None:
    """Rows ``r0:r1`` of :func:`quantize_rows` ``(x, width)`` into its buffers ``xq`` (from
    :func:`quantize_call`): one thread's part where a prefill shares the rows out."""
    q, d, xsum = xq
    _quantize(x[r0:r1], float(LEVELS[width]), q[r0:r1], d[r0:r1], xsum[r0:r1])


# The largest |q| as the code type's scalar: the one-call entries allocate the codes by it.
_LEVEL = {w: np.dtype(w).type(v) for w, v in LEVELS.items()}


def level(width: str, narrow: bool = True) -> np.integer:
    """The ``level`` argument of :func:`.matvec_int.linear_packed_int` for
    activations of ``width`` ("int8", "int16"); int8's stored as int16 unless ``narrow``
    (:func:`narrow`)."""
    return _LEVEL[width] if narrow else np.int16(LEVELS[width])


@_jit(inline="always")
def _quantized(x: np.ndarray, level: np.integer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`quantize_rows` inside compiled code: per-call arrays, the same ``_quantize``."""
    q = np.full(x.shape, level)  # of level's type, int8 or int16; every code is written
    d = np.empty((x.shape[0], x.shape[1] // GROUP), dtype=np.float32)
    xsum = np.empty_like(d)
    _quantize(x, np.float64(level), q, d, xsum)
    return q, d, xsum


