"""Prefill products over integer activations on AVX2: a tile of 32 weight rows unpacked once
per block, then multiplied with every token row (integer GEMM).

The decode kernels (:mod:`.matvec_int`) unpack a block's codes for one or two activation
rows; at prefill sizes that unpacking is repeated for every pair of token rows. Here a
thread takes a range of weight tiles; for each block (a tile's 32 lanes x 32 codes) the
codes are unpacked once into a small buffer, each lane's codes in pairs ``(j, j + 1)`` as
the x86 multiply-adds take them, and the buffer (1-2 KB, in L1) is multiplied with all token
rows, ``ROWS`` at a time with the sums in registers (:func:`_make_block`):

- 4-bit codes x int8 activations: ``vpmaddubsw`` (32 multiply-adds an instruction), 16-bit
  sums over 16 codes (at most 8 * 2 * 15 * 127 = 30480), widened per half block;
- every other pairing: codes widened to 16 bits, ``vpmaddwd`` and an add (one
  ``vpdpwssd`` where the CPU has AVX-VNNI), 32-bit sums.

The float tail of each block is the decode kernels' expression (:class:`.matvec_int._Tail`)
with the same operations in the same order, without fused multiply-adds, and the blocks are
added in the same order: a row's result is bitwise the one the decode mat-vec gives it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from inference.backends.cpu.ir import _i64_of, _item_ptr, _jit
from inference.backends.cpu.layout import (
    AFFINE,
    GROUP,
    LANES,
    SUPER6,
    _block_scales,
    scale_scratch,
)
from inference.backends.cpu.matvec_int import (
    _HALVES,
    _NO_FUSE,
    _block_rows,
    _interleave,
    _nibbles,
    _pair,
    _pair_bytes,
    _pair_words,
    _runs,
    _tail_args,
    _two_halves,
    _words,
    madd_add,
)

_i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
# Code widths whose prefill products take this GEMM on AVX2 with integer activations
# (``routing.prefill_route``). Per product at 138 rows, Llama 3.2 1B's shapes, 1 and 2
# threads, against dequant+sgemm (docs/cpu-backend.md, "Prefill"): 4-bit codes x int8
# 0.48-0.79x its time, 4- and 8-bit codes x int16 0.61-0.90x; 5-bit codes x int16 (Q5_0
# 6912x1152, SmolLM2's Q5_1/Q5_K) 0.76-1.03x, whole 5-bit prefills 12-16% faster. ``vpmaddwd``
# (int16) does 16 multiply-adds an instruction, as many as an FMA, so int16 saves only the
# dequantize and sgemm's packing; ``vpmaddubsw`` (int8) does 32.
GEMM_BITS = frozenset({4, 5, 6, 8})
# Token rows a call of the sums takes, by whether the activations are int8 (their
# accumulators stay in AVX2's 16 registers): 4 for bytes (2 x 16-bit vectors a row), 2 for
# words (4 x 32-bit vectors a row; with 3 the accumulators spilled).
ROWS = {True: 4, False: 2}


def _make_block(nrows: dict[bool, int]):  # type: ignore[no-untyped-def]
    """An intrinsic ``(codes, high, blk, u, xp, row, g, blocks, kind, zero, dx, xs, accs)``
    (``high`` as the decode kernels take it: its type tells the scales' row): for
    activation rows ``row .. row + n - 1`` (``n = nrows[narrow]``, narrow: ``xp`` int8) of
    group ``g`` (``xp`` its 32 codes of each row), the integer sums
    ``sum_j code_j[lane] * xp[row + r, j]`` over each
    half block (codes 0-15, 16-31), ``u`` block ``blk``'s codes unpacked (16 pairs x 32
    lanes x 2; uint8 for int8 ``xp``, else int16: :func:`_buffer`); then their float tail,
    the decode kernels' own IR (:class:`.matvec_int._Tail`), added into ``accs[r]``."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        _, high, _, uty, xty = signature.args[:5]
        _, _, cblk, uarr, xarr, crow, cg = args[:7]
        narrow = xty.dtype == types.int8
        n = nrows[narrow]
        blk, row, g = (_i64_of(builder, v) for v in (cblk, crow, cg))
        p0 = ir.Constant(_i64, 0)  # xp holds the group's codes only
        rows = [builder.add(row, ir.Constant(_i64, r)) for r in range(n)]
        v32i8, v16i16, v8i32 = (ir.VectorType(_i8, 32), ir.VectorType(_i16, 16),
                                ir.VectorType(_i32, 8))
        if narrow:
            maddubs = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v16i16, [v32i8, v32i8]),
                "llvm.x86.avx2.pmadd.ub.sw")
            nvec, vt, zero = 2, v32i8, ir.Constant(v16i16, [0] * 16)

            def acc_add(a: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
                return builder.add(a, builder.call(maddubs, [w, x]))
        else:
            nvec, vt, zero = 4, v16i16, ir.Constant(v8i32, [0] * 8)

            def acc_add(a: ir.Value, w: ir.Value, x: ir.Value) -> ir.Value:
                return madd_add(builder, a, w, x)
        width = LANES // nvec  # lanes a vector of sums holds; u's elements per vector: 32
        lanes_of = [list(range(v * width, (v + 1) * width)) for v in range(nvec)]
        halves = []
        for half in range(2):
            acc = [[zero] * nvec for _ in rows]
            for p in range(8 * half, 8 * half + 8):
                w = []
                for v in range(nvec):
                    ptr = _item_ptr(context, builder, uty, uarr,
                                    [ir.Constant(_i64, p), ir.Constant(_i64, v * (64 // nvec))])
                    w.append(builder.load(builder.bitcast(ptr, vt.as_pointer()), align=1))
                for r, rw in enumerate(rows):
                    pair = _pair(context, builder, xty, xarr, rw, p0, p)
                    x = _pair_bytes(builder, pair) if narrow else _pair_words(builder, pair)
                    for v in range(nvec):
                        acc[r][v] = acc_add(acc[r][v], w[v], x)
            if narrow:
                acc = [[builder.sext(a, ir.VectorType(_i32, 16)) for a in ra] for ra in acc]
            halves.append([_runs(builder, ra, lanes_of) for ra in acc])
        c = (8 if signature.args[0].dtype == types.int8  # the scales' row (_scale_row)
             else 4 if isinstance(high, types.NoneType) else 2 + high.ndim)
        _tail_args(context, builder, signature, args, 7, blk, g, c).emit(
            row, _two_halves(halves))
        return context.get_dummy_value()

    @intrinsic
    def block(typingctx, codes, high, blk, u, xp, row, g, blocks, kind, zero, dx, xs, accs
              ):  # type: ignore[no-untyped-def]
        return (types.void(codes, high, blk, u, xp, row, g, blocks, kind, zero, dx, xs, accs),
                codegen)

    return block


_block, _block1 = _make_block(ROWS), _make_block({True: 1, False: 1})


def _step(xp):  # type: ignore[no-untyped-def]  # numba only: rows a call of _block takes
    raise NotImplementedError


@overload(_step, inline="always")
def _step_ov(xp):  # type: ignore[no-untyped-def]
    n = ROWS[xp.dtype == types.int8]
    return lambda xp: n


def _scale_row(codes, high):  # type: ignore[no-untyped-def]  # numba only: the scales' row
    raise NotImplementedError


@overload(_scale_row, inline="always")
def _scale_row_ov(codes, high):  # type: ignore[no-untyped-def]
    c = (8 if codes.dtype == types.int8  # as _make_block's
         else 4 if isinstance(high, types.NoneType) else 2 + high.ndim)
    return lambda codes, high: c


@intrinsic
def _buffer(typingctx, xp):  # type: ignore[no-untyped-def]
    """A block's unpacked codes, ``(16, 2 * LANES)`` (uint8 for int8 ``xp``, else int16),
    in the calling kernel's own stack frame: at the same distance from its spill slots on
    every thread. As a heap buffer that distance followed the caller's stack depth, and at
    some depths a thread's products took 1.5x as long (half a 16384x2048 Q4_K product, 138
    rows: 73-80 ms against 44-47 on the other thread), the 1B prefill 0.72-0.76x."""
    dtype = types.uint8 if xp.dtype == types.int8 else types.int16
    aty = types.Array(dtype, 2, "C")

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        from numba.np.arrayobj import populate_array  # a compile's: not every import's 23 ms

        ety = context.get_data_type(dtype)
        n = 16 * 2 * LANES
        slot = cgutils.alloca_once(builder, ir.ArrayType(ety, n))
        slot.align = 64
        data = builder.bitcast(slot, ety.as_pointer())
        ary = context.make_array(aty)(context, builder)
        size = context.get_constant(types.intp, dtype.bitwidth // 8)
        populate_array(ary, data=data,
                       shape=[context.get_constant(types.intp, 16),
                              context.get_constant(types.intp, 2 * LANES)],
                       strides=[context.get_constant(types.intp, n // 16 * dtype.bitwidth // 8),
                                size],
                       itemsize=size, meminfo=None)
        return ary._getvalue()

    return aty(xp), codegen


@_jit(inline="always")
def _unpack4(codes: np.ndarray, blk: int, u: np.ndarray) -> None:
    """Block ``blk``'s 4-bit codes (byte j: code j low nibble, code j + 16 high) into ``u``
    (16 pairs, lane-major pairs of codes 2p, 2p + 1), bytes or int16 by ``u``'s type."""
    for p in range(16):
        j, sh = (2 * p) & 15, np.uint8(4 * (p >> 3))
        for lane in range(LANES):
            u[p, 2 * lane] = (codes[blk, j, lane] >> sh) & np.uint8(15)
            u[p, 2 * lane + 1] = (codes[blk, j + 1, lane] >> sh) & np.uint8(15)


@intrinsic
def _unpack_planes(typingctx, codes, high, blk, u):  # type: ignore[no-untyped-def]
    """Block ``blk``'s 5- or 6-bit codes (:func:`_unpack4`'s nibbles, bit 4 from the plane
    in code rows 16-19, bit 5 from rows 20-23; ``high``'s type says how many planes) into
    ``u`` as int16 pairs: 5-bit codes as they are, Q6_K's as the signed ``q - 32``. The
    decode kernels' unpacking (code rows paired, nibbles and planes masked:
    :func:`.matvec_int._nibbles`), 32 lanes a vector: as a numba loop over the lanes it
    took a tenth of the product (Q6_K 3072x8192, 138 rows: 73 -> 67 ms at 1 thread, 38 -> 34
    at 2; docs/cpu-backend.md). The 4-bit loop (:func:`_unpack4`) costs less than half as
    much, and its IR form measured no faster (inline: slower on two threads; called out of
    line: slower on one and two)."""

    six = high.ndim == 4  # else 3: one plane

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        cty, _, _, uty = signature.args
        carr, _, cblk, uarr = args
        block = _i64_of(builder, cblk)
        v32i8 = ir.VectorType(_i8, 32)
        planes = _block_rows(context, builder, cty, carr, block,
                             range(16, 24 if six else 20), v32i8)
        tops = [[(_interleave(builder, planes[k], planes[k + 1], lanes),
                  _interleave(builder, planes[k + 2], planes[k + 3], lanes))
                 for k in range(0, len(planes), 4)] for lanes in _HALVES]
        thirty_two = ir.Constant(v32i8, [32] * 32)
        for p in range(8):
            r0, r1 = _block_rows(context, builder, cty, carr, block, (2 * p, 2 * p + 1), v32i8)
            for h, lanes in enumerate(_HALVES):
                pairs = _interleave(builder, r0, r1, lanes)
                for half, code in enumerate(_nibbles(builder, pairs, tops[h], p)):
                    # codes 2p, 2p + 1 (half 0) or 2p + 16, 2p + 17: pair p + 8 * half
                    words = (_words(builder, builder.sub(code, thirty_two), signed=True)
                             if six else _words(builder, code, signed=False))
                    for lane, v in zip((lanes[0], lanes[8]), words, strict=True):
                        ptr = _item_ptr(context, builder, uty, uarr, [
                            ir.Constant(_i64, p + 8 * half), ir.Constant(_i64, 2 * lane)])
                        builder.store(v, builder.bitcast(ptr, v.type.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(codes, high, blk, u), codegen


@_jit(inline="always")
def _unpack8(codes: np.ndarray, blk: int, u: np.ndarray) -> None:
    """Block ``blk``'s 8-bit codes into ``u`` as int16 pairs (:func:`_unpack4`'s order)."""
    for p in range(16):
        for lane in range(LANES):
            u[p, 2 * lane] = codes[blk, 2 * p, lane]
            u[p, 2 * lane + 1] = codes[blk, 2 * p + 1, lane]


def _unpack(codes, high, blk, u):  # type: ignore[no-untyped-def]  # numba only
    raise NotImplementedError


@overload(_unpack, inline="always")
def _unpack_ov(codes, high, blk, u):  # type: ignore[no-untyped-def]
    """:func:`_unpack8` for int8 codes (8-bit), :func:`_unpack_planes` for planes of high
    bits (5-bit codes, Q6_K), else :func:`_unpack4`."""
    if codes.dtype == types.int8:
        return lambda codes, high, blk, u: _unpack8(codes, blk, u)
    if not isinstance(high, types.NoneType):
        return lambda codes, high, blk, u: _unpack_planes(codes, high, blk, u)
    return lambda codes, high, blk, u: _unpack4(codes, blk, u)


@_jit(fastmath=_NO_FUSE)
def gemm_int(codes: np.ndarray, high: np.ndarray | None, blocks: np.ndarray, kind: int,
             zero: float, xp: np.ndarray, dx: np.ndarray, xs: np.ndarray, out: np.ndarray,
             t0: int, t1: int) -> None:
    """out[:, tiles t0..t1's columns] = x @ W.T on the calling thread, for a packed W of
    4-bit codes (``codes`` its uint8 view, ``high`` None), Q6_K's 6-bit ones (``high``
    its two planes of high bits) or 8-bit ones (int8: Q8_0) and ``x`` quantized by
    :func:`.quantize.quantize_rows` (``xp`` int8 for 4-bit codes only, else int16;
    ``dx``, ``xs``); ``out`` (T, tiles * LANES). Bitwise the decode kernels' result for
    every row (module docstring)."""
    rows, groups = dx.shape
    # The activations group by group, each group's rows contiguous: read in place, the
    # rows of a group lie K bytes apart, on few cache sets (K a power of two), and evicted
    # each other (2048x8192 took 1.1x the time of 2048x2048 x 4).
    xg = np.empty((groups, rows, GROUP), dtype=xp.dtype)
    for r in range(rows):
        for g in range(groups):
            xg[g, r] = xp[r, g * GROUP:(g + 1) * GROUP]
    u = _buffer(xp)
    acc = np.empty((rows, LANES), dtype=np.float32)
    step = _step(xp)
    # SUPER6: a block's scales f32(d) * sc and biases -(f32(dmin) * m) made once, into
    # the rows an AFFINE block holds them in (``own``), which the tail then reads, instead
    # of at each step of rows. Both are exact in float32 and AFFINE's tail is SUPER6's
    # expression, so every result keeps its bits (Q4_K 2048x2048, 138 rows, 1 thread:
    # 11.7 ms against Q4_0's 10.4 before).
    super6 = kind == SUPER6
    c = _scale_row(codes, high)
    own = np.zeros((1, c + 2, LANES), dtype=np.float32)
    sg, sg2, zg = scale_scratch(LANES)
    halves = blocks.view(np.uint16)
    for t in range(t0, t1):
        acc[:] = 0.0
        for g in range(groups):
            blk = t * groups + g
            _unpack(codes, high, blk, u)
            if super6:
                _block_scales(codes, blocks, halves, blk, c, kind, zero, sg, sg2, zg)
                own[0, c] = sg
                own[0, c + 1] = zg
            scales, at, how = (own, 0, AFFINE) if super6 else (blocks, blk, kind)
            i = 0
            while rows - i >= step:
                _block(codes, high, at, u, xg[g], i, g, scales, how, zero, dx, xs, acc[i:])
                i += step
            while i < rows:
                _block1(codes, high, at, u, xg[g], i, g, scales, how, zero, dx, xs,
                        acc[i:])
                i += 1
        out[:, t * LANES:(t + 1) * LANES] = acc
