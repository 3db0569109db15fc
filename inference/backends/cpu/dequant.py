"""Packed weights back to float32: a slice of W.T for a prefill product's sgemm
(:func:`dequant_t`) and embedding rows (:func:`gather_rows`)."""

from __future__ import annotations

import numpy as np

from inference.backends.cpu.ir import _f32, _jit
from inference.backends.cpu.layout import (
    GROUP,
    LANES,
    _block_scales,
    _high,
    code,
    code_rows,
    scale_scratch,
)


def dequant_t(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
              high: np.ndarray | None, kind: int, bits: int, zero: float, groups: int,
              t0: int, t1: int, out: np.ndarray) -> None:
    """Tiles t0..t1 of W -> out (K, (t1-t0)*LANES) float32: that slice of W.T, row-major
    in the output rows, so BLAS computes x @ out without a transpose. One compiled kernel
    per code width: one kernel branching on ``bits`` inside ran 4x slower on 4-bit
    weights (Q4_1 1536x768, 1 thread: 2.3 -> 0.58 ms)."""
    if bits == 8:
        _dequant_t8(codes, blocks, halves, kind, zero, groups, t0, t1, out)
    else:
        _dequant_t_nibbles(codes, blocks, halves, high, kind, zero, groups, t0, t1, out)


@_jit()
def _dequant_t8(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, kind: int,
                zero: float, groups: int, t0: int, t1: int, out: np.ndarray) -> None:
    nl = codes.shape[2]  # == LANES, a runtime trip count (module docstring)
    sg, sg2, zg = scale_scratch(nl)
    for t in range(t0, t1):
        col = (t - t0) * LANES
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, 8, kind, zero, sg, sg2, zg)
            for j in range(GROUP):
                row = codes[blk, j]
                o = out[g * GROUP + j, col:col + nl]
                s = sg if j < 16 else sg2
                for lane in range(nl):
                    o[lane] = s[lane] * _f32(np.int32(row[lane])) + zg[lane]


@_jit()
def _dequant_t_nibbles(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                       high: np.ndarray | None, kind: int, zero: float, groups: int, t0: int,
                       t1: int, out: np.ndarray) -> None:
    """4-bit codes, or 5-bit / 6-bit ones with their planes of high bits ``high`` (nblk,
    4, LANES) / (nblk, 2, 4, LANES)."""
    nl = codes.shape[2]
    c = code_rows(high)
    sg, sg2, zg = scale_scratch(nl)
    for t in range(t0, t1):
        col = (t - t0) * LANES
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, c, kind, zero, sg, sg2, zg)
            for j in range(16):
                row = codes[blk, j]
                lo = out[g * GROUP + j, col:col + nl]
                hi = out[g * GROUP + 16 + j, col:col + nl]
                if high is None:
                    for lane in range(nl):  # one store per loop: two ran slower
                        lo[lane] = sg[lane] * _f32(np.int32(row[lane] & np.uint8(15))) + zg[lane]
                    for lane in range(nl):
                        hi[lane] = sg2[lane] * _f32(np.int32(row[lane] >> np.uint8(4))) + zg[lane]
                else:
                    hb = high[blk]
                    for lane in range(nl):
                        a = code(np.int32(row[lane] & np.uint8(15)), hb, j, lane)
                        lo[lane] = sg[lane] * _f32(a) + zg[lane]
                    for lane in range(nl):
                        b = code(np.int32(row[lane] >> np.uint8(4)), hb, j + 16, lane)
                        hi[lane] = sg2[lane] * _f32(b) + zg[lane]


@_jit(fastmath=False)
def gather_rows(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, kind: int,
                bits: int, zero: float, groups: int, ids: np.ndarray, out: np.ndarray) -> None:
    """Embedding lookup: rows ``ids`` of W, dequantized into out (n, K)."""
    c = bits  # rows of codes: 32 codes of ``bits`` bits are ``bits`` float32 words a lane
    sg, sg2, zg = scale_scratch(LANES)
    for i in range(ids.shape[0]):
        t, lane = divmod(ids[i], LANES)
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, c, kind, zero, sg, sg2, zg)
            s, s2, z = sg[lane], sg2[lane], zg[lane]
            if bits != 8:
                hb, hb5 = codes[blk, 16:20], codes[blk, 20:24]  # planes of bits 4 and 5
                for j in range(16):
                    q = np.int32(codes[blk, j, lane])
                    a = np.int32(q & 15)
                    b = np.int32(q >> 4)
                    if bits >= 5:
                        a |= _high(hb, j, lane)
                        b |= _high(hb, j + 16, lane)
                    if bits == 6:  # Q6_K: bit 5, and q - 32
                        a = (a | (_high(hb5, j, lane) << 1)) - 32
                        b = (b | (_high(hb5, j + 16, lane) << 1)) - 32
                    out[i, g * GROUP + j] = s * _f32(a) + z
                    out[i, g * GROUP + 16 + j] = s2 * _f32(b) + z
            else:
                for j in range(GROUP):
                    q = _f32(np.int32(codes[blk, j, lane]))
                    out[i, g * GROUP + j] = (s if j < 16 else s2) * q + z
