"""numba kernels over GGML blocks exactly as the file stores them (CPU backend).

Types with no lane-block form within the memory rule (:mod:`.pack`: Q2_K, Q3_K, F16,
BF16) stay as file bytes, 1.0x the file. Decode with float activations reads them here
(with int16/int8 activations on AVX2, Q2_K and Q3_K go to :mod:`.kdot`, 3-4x faster):
a row is walked block by block, each block decoded into a small float32 buffer and dotted
with the activations (4-7 Gweights/s at 2 threads). Before these kernels the backend
dequantized the whole matrix with NumPy on every call: 0.3 Gweights/s.

Each ``_decode_*`` repeats the float32 arithmetic of :mod:`inference.formats.quants`
operation for operation (e.g. ``(d * sc) * q - dmin * m``), so :func:`dequant_rows`,
compiled without fastmath (no fused multiply-add), equals ``dequantize_raw`` bit for bit;
the mat-vec, compiled with fastmath, sums in its own order (tests: tolerance).
Block layouts: ggml-common.h, as in the ``BLOCK_TYPES`` table.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from inference.backends.cpu.ir import _bits_to_f32, _f32, _half, _jit
from inference.formats.quants import BLOCK_TYPES

# Type codes the kernels branch on (the branch is the same for every block of a call).
F16, BF16, Q2_K, Q3_K = range(4)
CODE = {"F16": F16, "BF16": BF16, "Q2_K": Q2_K, "Q3_K": Q3_K}
RAW_TYPES = tuple(CODE)
FLOAT_RUN = 64  # float types are walked in runs of 64 values, as if blocks of that size
_SIZES = np.array([(FLOAT_RUN, 2 * FLOAT_RUN) if BLOCK_TYPES[t].is_float
                   else (BLOCK_TYPES[t].block_size, BLOCK_TYPES[t].type_size)
                   for t in RAW_TYPES], dtype=np.int64)  # (values, bytes) of a block
ROWS_PER_TASK = 8  # rows per parallel task: enough work to amortise the scheduling


def run_size(qtype: str) -> int:
    """Values a row must hold a whole number of (the kernels' block size)."""
    return int(_SIZES[CODE[qtype], 0])


@_jit(inline="always")
def _u16(b: np.ndarray, off: int) -> np.uint16:
    return np.uint16(np.int32(b[off]) | (np.int32(b[off + 1]) << np.int32(8)))


@_jit(inline="always")
def _f16_at(b: np.ndarray, off: int) -> float:
    return _half(_u16(b, off))


# Q2_K, Q3_K: element e = half*128 + s*32 + lane takes its low bits from byte
# half*32 + lane shifted by s's bit position, and the scale of sub-block e // 16; the
# loops walk (half, s, 16-lane run) so the innermost loop has one scale and contiguous
# bytes, and vectorises. Trip counts come from out.shape:
# a constant 16 is fully unrolled before the loop vectoriser runs, and the unrolled code
# stayed scalar (measured on a Q6_K decoder: 1.25 -> 2.96 Gweights/s).

@_jit(inline="always")
def _decode_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    d = _f16_at(b, 80)
    dmin = _f16_at(b, 82)
    n16 = out.shape[0] // 16  # 16, as a runtime trip count (see the note above)
    for half in range(2):
        for s in range(4):
            for h in range(2):
                sc = np.int32(b[half * 8 + s * 2 + h])
                dl = d * _f32(sc & np.int32(15))
                ml = dmin * _f32(sc >> np.int32(4))
                q0 = 16 + half * 32 + h * 16
                e0 = half * 128 + s * 32 + h * 16
                for lane in range(n16):
                    q = (np.int32(b[q0 + lane]) >> np.int32(2 * s)) & np.int32(3)
                    out[e0 + lane] = dl * _f32(q) - ml


@_jit(inline="always")
def _q3_k_scale(b: np.ndarray, i: int) -> np.int32:
    """Signed 6-bit scale i of 16: low 4 bits from bytes 96-103, high 2 from 104-107."""
    lo = (np.int32(b[96 + i % 8]) >> np.int32(4 * (i // 8))) & np.int32(15)
    hi = (np.int32(b[104 + i % 4]) >> np.int32(2 * (i // 4))) & np.int32(3)
    return (lo | (hi << np.int32(4))) - np.int32(32)


@_jit(inline="always")
def _decode_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    d = _f16_at(b, 108)
    n16 = out.shape[0] // 16
    for half in range(2):
        for s in range(4):
            for h in range(2):
                dl = d * _f32(_q3_k_scale(b, half * 8 + s * 2 + h))
                q0 = 32 + half * 32 + h * 16
                m0 = h * 16
                bit = np.int32(half * 4 + s)  # hmask bit j belongs to elements j*32 + lane
                e0 = half * 128 + s * 32 + h * 16
                for lane in range(n16):
                    low = (np.int32(b[q0 + lane]) >> np.int32(2 * s)) & np.int32(3)
                    high = (np.int32(b[m0 + lane]) >> bit) & np.int32(1)
                    q = low - ((high ^ np.int32(1)) << np.int32(2))
                    out[e0 + lane] = dl * _f32(q)


@_jit(inline="always")
def _decode(code: int, b: np.ndarray, out: np.ndarray) -> None:
    """One block of type ``code`` (bytes ``b``) -> ``out`` (block_size float32)."""
    if code == F16:
        for e in range(out.shape[0]):
            out[e] = _f16_at(b, 2 * e)
    elif code == BF16:  # the high half of a float32
        for e in range(out.shape[0]):
            out[e] = _bits_to_f32(np.int32(_u16(b, 2 * e)) << np.int32(16))
    elif code == Q2_K:
        _decode_q2_k(b, out)
    else:
        _decode_q3_k(b, out)


@_jit(parallel=True)
def matvec(raw: np.ndarray, code: int, x: np.ndarray, out: np.ndarray) -> None:
    """out (T, rows) = x (T, K) @ W.T for W as file bytes: raw (rows, row_bytes) uint8.
    Parallel over tasks of ROWS_PER_TASK rows; T is small (decode)."""
    rows = raw.shape[0]
    bs, ts = _SIZES[code, 0], _SIZES[code, 1]
    nb = raw.shape[1] // ts
    t_rows = x.shape[0]
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        buf = np.empty(bs, dtype=np.float32)
        acc = np.empty(t_rows, dtype=np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            acc[:] = 0.0
            row = raw[r]
            for blk in range(nb):
                _decode(code, row[blk * ts:(blk + 1) * ts], buf)
                x0 = blk * bs
                for i in range(t_rows):
                    s = _f32(0.0)
                    for e in range(bs):
                        s += buf[e] * x[i, x0 + e]
                    acc[i] += s
            for i in range(t_rows):
                out[i, r] = acc[i]


@_jit(fastmath=False)
def dequant_rows(raw: np.ndarray, code: int, r0: int, r1: int, out: np.ndarray) -> None:
    """Rows r0..r1 of W (file bytes) -> out (r1-r0, K) float32, equal to dequantize_raw."""
    bs, ts = _SIZES[code, 0], _SIZES[code, 1]
    nb = raw.shape[1] // ts
    for r in range(r0, r1):
        row = raw[r]
        for blk in range(nb):
            _decode(code, row[blk * ts:(blk + 1) * ts], out[r - r0, blk * bs:(blk + 1) * bs])
