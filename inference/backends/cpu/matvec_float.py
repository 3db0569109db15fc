"""Decode mat-vec kernels over float32 activations and packed weights (:mod:`.layout`).

Why: the inner loop runs over the lanes, i.e. 32 output rows at once, so LLVM vectorises
it with plain loads, converts and FMAs, and no horizontal sum per group is needed; the
``x`` values are broadcast scalars. Inside it, the group's codes (a constant-count loop,
fully unrolled) are summed in four independent chains held in registers: one chain is
bound by FMA latency, and a partial-sum array in memory costs a load and a store per code
row. A block is one contiguous run of memory (codes, scale, bias together), read front to
back, with the block ``PREFETCH`` ahead prefetched: the weights of a token no longer fit
in L2, and with three separate arrays the hardware
prefetchers lost ~40% of the speed.
Codes go through int32 before float: from uint8 & 15 numba would widen to int64, and
int64 -> float32 converts take twice the instructions. The lane loops take their trip
count from the array shape, not the constant: a constant 32 gets the loop fully unrolled
before the loop vectoriser runs, and the SLP vectoriser then leaves the int8 -> float
converts scalar (3x slower; seen in the assembly).

``sum_j (s*q_j + z) * x_j = s * sum_j q_j x_j + z * sum_j x_j``: the bias costs one FMA
per group with the precomputed group sums ``xsum`` of ``x``.

Vector width: LLVM's tuning for AVX-512 CPUs prefers 256-bit vectors (older Xeons lower
their clock for 512-bit code). These loops are bound by instruction throughput, so on a
CPU with AVX-512 the preference is lifted before anything is compiled
(:func:`_tune_target`; 1.5x on the mat-vec where it was measured, an Intel Xeon with
AVX-512), unless the user set NUMBA_CPU_FEATURES. CPUs without AVX-512 are unaffected.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import overload

from inference.backends.cpu.ir import _NO_REASSOC, PREFETCH, _f32, _half, _jit, _prefetch_block
from inference.backends.cpu.layout import (
    AFFINE,
    AFFINE_F16,
    GROUP,
    LANES,
    SUB16,
    SUPER6,
    SYMMETRIC_F16,
    _block_scales,
    code,
    code_rows,
    scale_scratch,
    super_row,
)


@_jit()
def group_sums(x: np.ndarray) -> np.ndarray:
    """(T, K) -> (T, K/32) sums of each group of 32 activations."""
    t, k = x.shape
    out = np.empty((t, k // GROUP), dtype=np.float32)
    for i in range(t):
        for g in range(k // GROUP):
            s = _f32(0.0)
            for j in range(GROUP):
                s += x[i, g * GROUP + j]
            out[i, g] = s
    return out



@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes4(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 32 4-bit codes, in four chains."""
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(0, 16, 2):
        q = np.int32(cb[j, lane])
        r = np.int32(cb[j + 1, lane])
        p0 += _f32(np.int32(q & 15)) * xi[b0 + j]
        p1 += _f32(np.int32(q >> 4)) * xi[b0 + 16 + j]
        p2 += _f32(np.int32(r & 15)) * xi[b0 + j + 1]
        p3 += _f32(np.int32(r >> 4)) * xi[b0 + 17 + j]
    return (p0 + p1) + (p2 + p3)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes5(cb: np.ndarray, hb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """As :func:`_codes4` for 5-bit codes, bit 4 from the plane ``hb`` (module docstring)."""
    el, ol = np.int32(hb[0, lane]), np.int32(hb[1, lane])
    eh, oh = np.int32(hb[2, lane]), np.int32(hb[3, lane])
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(0, 16, 2):
        q = np.int32(cb[j, lane])
        r = np.int32(cb[j + 1, lane])
        b = np.int32(j >> 1)
        p0 += _f32(np.int32(q & 15) | (((el >> b) & 1) << 4)) * xi[b0 + j]
        p1 += _f32(np.int32(q >> 4) | (((eh >> b) & 1) << 4)) * xi[b0 + 16 + j]
        p2 += _f32(np.int32(r & 15) | (((ol >> b) & 1) << 4)) * xi[b0 + j + 1]
        p3 += _f32(np.int32(r >> 4) | (((oh >> b) & 1) << 4)) * xi[b0 + 17 + j]
    return (p0 + p1) + (p2 + p3)


def _codes_nib(cb, high, blk, xi, b0, lane):  # type: ignore[no-untyped-def]  # numba only
    raise NotImplementedError


@overload(_codes_nib, inline="always")
def _codes_nib_ov(cb, high, blk, xi, b0, lane):  # type: ignore[no-untyped-def]
    """:func:`_codes4`, or :func:`_codes5` when there is a plane of high bits (chosen when
    numba compiles, by ``high``'s type). Two planes are Q6_K's, whose ``SUB16`` scales
    take :func:`_sub16`: never this sum."""
    if isinstance(high, types.NoneType):
        return lambda cb, high, blk, xi, b0, lane: _codes4(cb, xi, b0, lane)
    if high.ndim == 3:
        return lambda cb, high, blk, xi, b0, lane: _codes5(cb, high[blk], xi, b0, lane)
    return lambda cb, high, blk, xi, b0, lane: _f32(0.0)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes6(cb: np.ndarray, hb: np.ndarray, xi: np.ndarray, b0: int, lane: int,
            j0: int) -> float:
    """:func:`_codes16` over Q6_K's 6-bit codes ``q - 32`` (nibbles of ``cb``, bits 4 and
    5 from the planes ``hb``), the same chains in the same order: the 8-bit form's bits."""
    sh = np.int32(j0 >> 2)  # codes 16-31: the high nibbles
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(j0, j0 + 16, 4):
        i = j & 15
        m = np.int32(15)
        p0 += _f32(code((np.int32(cb[i, lane]) >> sh) & m, hb, j, lane)) * xi[b0 + j]
        p1 += _f32(code((np.int32(cb[i + 1, lane]) >> sh) & m, hb, j + 1, lane)) * xi[b0 + j + 1]
        p2 += _f32(code((np.int32(cb[i + 2, lane]) >> sh) & m, hb, j + 2, lane)) * xi[b0 + j + 2]
        p3 += _f32(code((np.int32(cb[i + 3, lane]) >> sh) & m, hb, j + 3, lane)) * xi[b0 + j + 3]
    return (p0 + p1) + (p2 + p3)


def _sub16(cb, high, blk, xi, b0, lane, c):  # type: ignore[no-untyped-def]  # numba only
    raise NotImplementedError


@overload(_sub16, inline="always")
def _sub16_ov(cb, high, blk, xi, b0, lane, c):  # type: ignore[no-untyped-def]
    """``SUB16``'s sum of a lane over nibble codes: ``f(sc0) * sum(codes 0-15) + f(sc1) *
    sum(codes 16-31)`` as :func:`matvec_q8_f32` takes it; only Q6_K's 6-bit codes (two
    planes of high bits) are ``SUB16`` among them, the others never reach it."""
    if isinstance(high, types.NoneType) or high.ndim != 4:
        return lambda cb, high, blk, xi, b0, lane, c: _f32(0.0)

    def sub16(cb, high, blk, xi, b0, lane, c):  # type: ignore[no-untyped-def]
        hb = high[blk]
        return (_f32(np.int32(np.int8(cb[4 * c, lane]))) * _codes6(cb, hb, xi, b0, lane, 0)
                + _f32(np.int32(np.int8(cb[4 * c + 1, lane]))) * _codes6(cb, hb, xi, b0, lane, 16))
    return sub16


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes16(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int, j0: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 8-bit codes j0 .. j0+15, in four chains."""
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(j0, j0 + 16, 4):
        p0 += _f32(np.int32(cb[j, lane])) * xi[b0 + j]
        p1 += _f32(np.int32(cb[j + 1, lane])) * xi[b0 + j + 1]
        p2 += _f32(np.int32(cb[j + 2, lane])) * xi[b0 + j + 2]
        p3 += _f32(np.int32(cb[j + 3, lane])) * xi[b0 + j + 3]
    return (p0 + p1) + (p2 + p3)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes8(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 32 8-bit codes."""
    return _codes16(cb, xi, b0, lane, 0) + _codes16(cb, xi, b0, lane, 16)


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q4_f32(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, flat: np.ndarray,
              high: np.ndarray | None, kind: int, zero: float, x: np.ndarray,
              out: np.ndarray) -> None:
    """out (T, tiles*LANES) = x (T, K) @ W.T for a 4-bit W, a 5-bit W given its plane of
    high bits ``high`` (nblk, 4, LANES) or a 6-bit one (Q6_K, ``SUB16``) given its two
    (nblk, 2, 4, LANES); T is small (decode).

    codes (nblk, 4*R, LANES), halves (nblk, R, 2*LANES) and flat (nblk*R*4*LANES,) are
    byte, uint16 and flat byte views of blocks (nblk, R, LANES) float32; SUB16 / SUPER6:
    codes the blocks' bytes, blocks the super rows (:mod:`.layout`)."""
    groups = x.shape[1] // GROUP
    xsum = group_sums(x)
    tiles = codes.shape[0] // groups
    row_bytes = codes.shape[1] * LANES  # a block's bytes (codes: its byte view)
    nl = codes.shape[2]  # == LANES, but a runtime trip count: see module docstring
    c = code_rows(high)  # the block's row of scales
    for t in prange(tiles):
        acc = np.empty(nl, dtype=np.float32)
        sk, sk2, zk = scale_scratch(nl)
        for i in range(x.shape[0]):
            acc[:] = 0.0
            xi = x[i]
            for g in range(groups):
                blk = t * groups + g
                if i == 0:
                    _prefetch_block(flat, blk + PREFETCH, row_bytes)
                cb = codes[blk]
                b0 = g * GROUP
                xs = xsum[i, g]
                # One lane loop per scale layout (kind is the same for every block).
                if kind == AFFINE_F16:
                    h = halves[blk, c]
                    for lane in range(nl):
                        acc[lane] += (_half(h[lane]) * _codes_nib(cb, high, blk, xi, b0, lane)
                                      + _half(h[nl + lane]) * xs)
                elif kind == AFFINE:
                    sg, zg = blocks[blk, c], blocks[blk, c + 1]
                    for lane in range(nl):
                        acc[lane] += (sg[lane] * _codes_nib(cb, high, blk, xi, b0, lane)
                                      + zg[lane] * xs)
                elif kind == SUB16:  # Q6_K: matvec_q8_f32's expression, so its bits
                    h = halves[super_row(blk), 0]
                    for lane in range(nl):
                        acc[lane] += _half(h[lane]) * _sub16(cb, high, blk, xi, b0, lane, c)
                elif kind == SUPER6:  # AFFINE's scales, made in memory: AFFINE's bits
                    _block_scales(codes, blocks, halves, blk, c, kind, zero, sk, sk2, zk)
                    for lane in range(nl):
                        acc[lane] += (sk[lane] * _codes_nib(cb, high, blk, xi, b0, lane)
                                      + zk[lane] * xs)
                elif kind == SYMMETRIC_F16:  # SYMMETRIC's float32 scales, as float16
                    h, zx = halves[blk, 0], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += _half(h[lane]) * (_codes_nib(cb, high, blk, xi, b0, lane)
                                                       - zx)
                else:
                    sg, zx = blocks[blk, c], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += sg[lane] * (_codes_nib(cb, high, blk, xi, b0, lane) - zx)
            out[i, t * LANES:(t + 1) * LANES] = acc


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q8_f32(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, flat: np.ndarray,
              kind: int, zero: float, x: np.ndarray, out: np.ndarray) -> None:
    """As :func:`matvec_q4_f32` for an 8-bit W (codes uint8, or int8 for Q8_0 and Q6_K).

    Its own kernel, not a ``bits`` argument of one: a merged kernel branching on the code
    width per lane ran 3x slower (1536x576, 2 threads: Q4_1 28.8 -> 8.8 Gweights/s), as
    the branch kept the lane loops from vectorising."""
    groups = x.shape[1] // GROUP
    xsum = group_sums(x)
    tiles = codes.shape[0] // groups
    row_bytes = codes.shape[1] * LANES  # a block's bytes (codes: its byte view)
    nl = codes.shape[2]  # == LANES, but a runtime trip count: see module docstring
    for t in prange(tiles):
        acc = np.empty(nl, dtype=np.float32)
        for i in range(x.shape[0]):
            acc[:] = 0.0
            xi = x[i]
            for g in range(groups):
                blk = t * groups + g
                if i == 0:
                    _prefetch_block(flat, blk + PREFETCH, row_bytes)
                cb = codes[blk]
                b0 = g * GROUP
                xs = xsum[i, g]
                if kind == SUB16:  # Q6_K: a scale per 16 codes times a float16 d
                    h = halves[super_row(blk), 0]
                    for lane in range(nl):
                        acc[lane] += _half(h[lane]) * (
                            _f32(np.int32(cb[32, lane])) * _codes16(cb, xi, b0, lane, 0)
                            + _f32(np.int32(cb[33, lane])) * _codes16(cb, xi, b0, lane, 16))
                elif kind == AFFINE_F16:
                    h = halves[blk, 8]
                    for lane in range(nl):
                        acc[lane] += (_half(h[lane]) * _codes8(cb, xi, b0, lane)
                                      + _half(h[nl + lane]) * xs)
                elif kind == AFFINE:
                    sg, zg = blocks[blk, 8], blocks[blk, 9]
                    for lane in range(nl):
                        acc[lane] += sg[lane] * _codes8(cb, xi, b0, lane) + zg[lane] * xs
                elif kind == SYMMETRIC_F16:
                    h, zx = halves[blk, 0], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += _half(h[lane]) * (_codes8(cb, xi, b0, lane) - zx)
                else:
                    sg, zx = blocks[blk, 8], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += sg[lane] * (_codes8(cb, xi, b0, lane) - zx)
            out[i, t * LANES:(t + 1) * LANES] = acc


@_jit(inline="always", fastmath=_NO_REASSOC)
def _chains2(wf: np.ndarray, xa: np.ndarray, xb: np.ndarray, b0: int, j0: int,
             s: np.ndarray, add: bool) -> None:
    """Chains j0 and j0+1 of :func:`_codes16` (codes j0, j0+4, j0+8, j0+12 and those +1)
    for rows a and b at once, each code loaded once for both, over converted codes
    ``wf``: s[lane] (row a) and s[nl + lane] (row b) = the two chains' sum, or += it when
    ``add``. Two chains per pass, not four: four for two rows made a loop body LLVM did
    not vectorise (seen in the assembly)."""
    nl = wf.shape[1]
    for lane in range(nl):
        a0 = a1 = c0 = c1 = _f32(0.0)
        for j in range(j0, j0 + 16, 4):
            w0 = wf[j, lane]
            w1 = wf[j + 1, lane]
            a0 += w0 * xa[b0 + j]
            a1 += w1 * xa[b0 + j + 1]
            c0 += w0 * xb[b0 + j]
            c1 += w1 * xb[b0 + j + 1]
        if add:
            s[lane] = s[lane] + (a0 + a1)
            s[nl + lane] = s[nl + lane] + (c0 + c1)
        else:
            s[lane] = a0 + a1
            s[nl + lane] = c0 + c1


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q8_f32_pairs(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                   flat: np.ndarray, kind: int, x: np.ndarray, out: np.ndarray) -> None:
    """:func:`matvec_q8_f32` for an even number of rows of x (one decode step of several
    sequences) and the scale-only layouts (SYMMETRIC with zero 0, i.e. Q8_0; SUB16, i.e.
    Q6_K), each row's result bitwise the one it gets alone.

    Converting int8 codes to float is most of a row's work in matvec_q8_f32, so here a block's
    codes are converted once and the rows sum over the floats, two rows per pass. Each
    row keeps matvec_q8_f32's chains, group order and scaling expressions: the server's
    batching relies on this exactness (inference/server/scheduler.py)."""
    rows = x.shape[0]
    groups = x.shape[1] // GROUP
    tiles = codes.shape[0] // groups
    row_bytes = codes.shape[1] * LANES  # a block's bytes (codes: its byte view)
    nl = codes.shape[2]
    for t in prange(tiles):
        acc = np.zeros((rows, nl), dtype=np.float32)
        s = np.empty(2 * nl, dtype=np.float32)  # rows a, b: sums of codes 0-15
        h = np.empty(2 * nl, dtype=np.float32)  # and of codes 16-31
        wf = np.empty((GROUP, nl), dtype=np.float32)
        for g in range(groups):
            blk = t * groups + g
            _prefetch_block(flat, blk + PREFETCH, row_bytes)
            cb = codes[blk]
            b0 = g * GROUP
            for j in range(GROUP):
                for lane in range(nl):
                    wf[j, lane] = _f32(np.int32(cb[j, lane]))
            for i in range(0, rows, 2):
                xa, xb = x[i], x[i + 1]
                _chains2(wf, xa, xb, b0, 0, s, False)
                _chains2(wf, xa, xb, b0, 2, s, True)
                _chains2(wf, xa, xb, b0, 16, h, False)
                _chains2(wf, xa, xb, b0, 18, h, True)
                for r in range(2):
                    a = acc[i + r]
                    if kind == SUB16:
                        d = halves[super_row(blk), 0]
                        for lane in range(nl):
                            a[lane] += _half(d[lane]) * (
                                _f32(np.int32(cb[32, lane])) * s[r * nl + lane]
                                + _f32(np.int32(cb[33, lane])) * h[r * nl + lane])
                    elif kind == SYMMETRIC_F16:
                        d = halves[blk, 0]
                        for lane in range(nl):
                            a[lane] += _half(d[lane]) * (s[r * nl + lane] + h[r * nl + lane])
                    else:
                        sg = blocks[blk, 8]
                        for lane in range(nl):
                            a[lane] += sg[lane] * (s[r * nl + lane] + h[r * nl + lane])
        out[:, t * LANES:(t + 1) * LANES] = acc

