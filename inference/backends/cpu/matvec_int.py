"""Decode mat-vec over integer activations and integer dot products (every target: x86
in pairs of codes with AVX2 or AVX-512, lane by lane elsewhere).

The same lane blocks as :mod:`.layout` (no second copy of the weights), multiplied by
the activations quantized per group of 32, ``x ~ d * q`` with ``d = max|x| / L`` and
``q`` rounded to nearest: 16-bit (``L = 32767``, the default) or 8-bit (``L = 127``, as
llama.cpp does). Per block and lane the integer sum ``sum_j code_j * q_j`` is exact; the
float scales come once at the end:

    sum_j (s * code_j + z) * (d * q_j)  =  s * d * isum + z * xsum,  xsum = d * sum_j q_j

so the result is exactly ``W @ (d * q)`` up to float32 rounding of the tail. ``xsum`` sums
the quantized values, not ``x``: the codes of Q4_1/Q4_K are unsigned, ``s * code`` carries
a large common offset that the bias cancels, and summing ``x`` would leave the offset's
share of the rounding error uncancelled (SmolLM2 int8 decode: mean |delta log p| 0.08
against 0.036 for ``d * sum q``).

What quantizing costs (SmolLM2 Q4_1 decoded token by token against transformers' float32
logits, docs/benchmarks.md): 8-bit loses too much for the parity bars (top-1 95-99.6%,
mean |delta log p| 0.025-0.042), 16-bit keeps them; so 16-bit is the default and 8-bit a
choice for speed. A row's result does not depend on the other rows, the thread count or
the batch: integer sums are exact in any order, and the tail is one fixed expression.

Why not plain numba: the lane loop of :mod:`.layout` puts one output row in each vector
lane, and LLVM widens, converts and FMAs 8 codes per instruction. x86's ``vpmaddwd``
multiplies 16-bit pairs and adds each pair into 32 bits, and ``vpmaddubsw`` does the same
for unsigned x signed bytes into 16 bits; with two code rows ``j, j+1`` interleaved lane by
lane (lane0 j, lane0 j+1, lane1 j, ...), one instruction does 8 (16-bit) or 16 (8-bit)
lanes x 2 codes against the broadcast activation pair ``(q_j, q_j+1)``. LLVM's vectoriser
does not find this on its own, so the block intrinsics (:func:`make_dot`) write a block's inner
products as LLVM IR (numba ``@intrinsic``), unrolled over the block:
- 4-bit codes (0..15) x 8-bit ``q``: ``vpmaddubsw``; a pair sum is at most 2 * 15 * 127 =
  3810, so eight of them (16 codes) add up in 16 bits without saturating (30480 < 32767);
  codes 0-15 and 16-31 keep separate 16-bit sums, widened to 32 bits at the end.
- everything else: codes widened to 16 bits, ``vpmaddwd``, 32-bit sums (at most
  16 * 255 * 32767 per half block, far inside 32 bits).
- 4-bit and Q6_K's 6-bit codes against 16-bit ``q`` (the default): ``q`` split into its
  bytes, ``256 * qh + ql`` (:func:`split_activations`, once a call), and each byte taken by
  ``vpmaddubsw`` against the code bytes as they are (:func:`_split_sums4`,
  :func:`_split_sums6`): the same exact sums without widening any code, which cost 12 of
  the 14 shuffles a pair of code rows took, the ports the loop was bound by. Measured in
  the Llama 1B and 3B Q4_K_M decode steps, 1 thread (AMD EPYC, AVX2): Q4_K 11.9-12.5 ->
  15.7-16.1 GB/s of weights; Q6_K 12.6-13.0 at first (its bits 4-5 cost what the
  widening did), 14.3-14.5 (medians; runs 12.7-14.9) once both halves of its codes
  shared one pass over the code bytes and its 16-bit sums went to 32 bits by
  ``vpmaddwd`` instead of shifts (docs/benchmarks.md).
Each intrinsic ends with the float tail of its rows, in IR too (:class:`_Tail`): the sums
go from registers through the scales into the rows' float accumulators.
Measured on SmolLM2's 1536x576 Q4_1 weight, 1 thread (AMD EPYC, AVX2), with the
quantization: 16-bit 2.0x, 8-bit 3.0x the float lane kernel (docs/benchmarks.md).

Where the target has AVX-512BW the same sums are taken in 512-bit vectors
(:func:`_wide_sums4` / :func:`_wide_sums8`): a block's two code rows for all 32
lanes in one register, half the multiply-adds; bitwise the same results. Measured on an
Intel Xeon (AVX-512), SmolLM2's Q4_1 shapes, against the AVX2 form: one row 1.06-1.21x,
pairs of rows (the server's batches) 1.3-1.7x (docs/cpu-backend.md).

Activation rows (a batched decode step's sequences) share each unpacking of a block's
codes: on AVX-512 in groups of 8, then 4, then a pair, then a single row; on AVX2 in
pairs, then a single row (:data:`ROW_GROUP`). With VNNI a group's multiply-adds are
each one ``vpdpwssd`` (:func:`_wide_madd`), without which the groups gain nothing. A
row's result is the same bits in any group.

Other CPUs (ARM, x86 without AVX2, NUMBA_CPU_NAME=generic) take the same sums lane by lane
in plain vector IR (:func:`_lane_sums4` / :func:`_lane_sums8`, :func:`form`): on
AArch64 NEON's widening multiply-add by element; bitwise the same results.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, partial

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from inference.backends.cpu.features import _x86, form, target_has
from inference.backends.cpu.ir import (
    PREFETCH,
    _i64_of,
    _item_ptr,
    _jit,
    _prefetch_block,
    _splat,
    half_to_float,
)
from inference.backends.cpu.layout import (
    AFFINE,
    AFFINE_F16,
    LANES,
    SUB16,
    SUPER6,
    SUPER_SHIFT,
    SYMMETRIC_F16,
)
from inference.backends.cpu.quantize import _quantized

_f32 = np.float32
_i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)




def _pair_bytes(builder: ir.IRBuilder, pair: ir.Value) -> ir.Value:
    """An int8 pair (in an int16) broadcast to 16 pairs (32 bytes): ``vpmaddubsw``'s operand."""
    return builder.bitcast(_splat(builder, pair, 16), ir.VectorType(_i8, 32))


def _pair_words(builder: ir.IRBuilder, pair: ir.Value, n: int = 8) -> ir.Value:
    """An activation pair broadcast to ``n`` pairs of int16 (``vpmaddwd``'s operand): an
    int16 pair (held in an int32) as it is, an int8 pair (held in an int16) sign-extended."""
    if pair.type.width == 16:
        two = builder.sext(builder.bitcast(pair, ir.VectorType(_i8, 2)), ir.VectorType(_i16, 2))
        pair = builder.bitcast(two, _i32)
    return builder.bitcast(_splat(builder, pair, n), ir.VectorType(_i16, 2 * n))


def _interleave(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, lanes: list[int]) -> ir.Value:
    """(a[l], b[l]) for each lane l in ``lanes``, as one vector of pairs."""
    n = a.type.count
    mask = [i for lane in lanes for i in (lane, n + lane)]
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_i32, len(mask)), mask))


def _block_rows(context, builder, cty, carr, blk, rows, vt):  # type: ignore[no-untyped-def]
    """Code rows ``rows`` of block ``blk`` (each LANES bytes) loaded as vectors ``vt``.
    In a C-contiguous ``codes`` (LANES codes a row) row ``j`` is ``j * LANES`` codes after
    row 0: one pointer a block and constant offsets, not a pointer a row (which the
    compiler hoisted out of the loop, one register each, and spilled)."""
    out = []
    zero = ir.Constant(_i64, 0)
    base = _item_ptr(context, builder, cty, carr, [blk, zero, zero])
    for j in rows:
        ptr = (builder.gep(base, [ir.Constant(_i64, j * LANES)]) if cty.layout == "C" else
               _item_ptr(context, builder, cty, carr, [blk, ir.Constant(_i64, j), zero]))
        out.append(builder.load(builder.bitcast(ptr, vt.as_pointer()), align=1))
    return out


def _pair(context, builder, xty, xarr, row, p0, p):  # type: ignore[no-untyped-def]
    """Activation codes ``2 (p0 + p)`` and the next of row ``row`` (int8 or int16) as one
    int16 or int32."""
    ptr = _item_ptr(context, builder, xty, xarr,
                    [row, builder.shl(builder.add(p0, ir.Constant(_i64, p)), ir.Constant(_i64, 1))])
    pair = ir.IntType(2 * xty.dtype.bitwidth)
    return builder.load(builder.bitcast(ptr, pair.as_pointer()), align=1)


def _runs(builder: ir.IRBuilder, parts: list[ir.Value], lanes_of: Sequence[Sequence[int]]
          ) -> list[tuple[int, ir.Value]]:
    """int32 vectors ``parts`` (part i holds lanes ``lanes_of[i]``, in runs of 8
    consecutive lanes) as (first lane, 8 lanes' sums) pairs."""
    out = []
    for vec, lanes in zip(parts, lanes_of, strict=True):
        for start in range(0, len(lanes), 8):
            out.append((lanes[start], builder.shuffle_vector(
                vec, ir.Constant(vec.type, None),
                ir.Constant(ir.VectorType(_i32, 8), list(range(start, start + 8))))))
    return out


# -- the float tail, as LLVM IR ----------------------------------------------------------
# Each dot intrinsic ends with its rows' float tail: the block's integer sums, still in
# registers, times the scales, added into ``accs[r, lane]`` (a float32 array, row r of the
# group). Written out in numba it was a loop per row with a runtime trip count and runtime
# alias checks between ``accs``, the sums and the scales, each row reloading the scales
# and the sums from memory: 27-36% of the 8-row kernel's time (docs/cpu-backend.md). Here
# the scales are read once per block for all rows and nothing is checked. The ops are
# IEEE ``fmul`` / ``fadd`` / ``fsub`` without fast-math flags (so no FMA contraction and
# no reassociation), one fixed expression for every row: a row's bits do not depend on
# the group it runs in, nor on the kernel's own fast-math flags.


class _Tail:
    """The tail's arguments ``(blocks, kind, zero, dx, xs, accs)`` of an intrinsic and its
    block ``blk`` and group ``g``; ``c`` the block's row of scales (``layout``
    docstring), ``codes`` the intrinsic's code bytes (Q6_K's sub-scales, rows 32-33)."""

    def __init__(self, context, builder, tys, vals, blk, g, c, codes):  # type: ignore
        self.context, self.builder = context, builder
        self.tys, self.blk, self.g, self.c, self.codes = tys, blk, g, c, codes
        (self.blocks, self.kind, self.zero, self.dx, self.xs, self.accs) = vals

    def _ptr(self, aty, arr, idx):  # type: ignore[no-untyped-def]
        return _item_ptr(self.context, self.builder, aty, arr,
                         [i if isinstance(i, ir.Value) else ir.Constant(_i64, i) for i in idx])

    def _vec(self, ptr: ir.Value, n: int, elem: ir.Type, offset: int = 0) -> ir.Value:
        b = self.builder
        ptr = b.bitcast(ptr, elem.as_pointer())
        if offset:
            ptr = b.gep(ptr, [ir.Constant(_i64, offset)])
        return b.load(b.bitcast(ptr, ir.VectorType(elem, n).as_pointer()), align=1)

    def _scales(self, row: int, lane: int, n: int) -> ir.Value:
        """Lanes ``lane:lane+n`` of the block's float32 row ``row``."""
        ptr = self._ptr(self.tys[0], self.blocks, [self.blk, row, lane])
        return self._vec(ptr, n, ir.FloatType())

    def _halves(self, lane: int, n: int, blk: ir.Value | None = None, row: int | None = None
                ) -> ir.Value:
        """float16 values ``lane:lane+n`` of row ``c`` of the block (or of row ``row`` of
        entry ``blk`` of ``blocks``) read as 2 * LANES halves."""
        ptr = self._ptr(self.tys[0], self.blocks, [self.blk if blk is None else blk,
                                                   self.c if row is None else row, 0])
        return half_to_float(self.builder, self._vec(ptr, n, _i16, lane))

    def _super(self, lane: int, n: int) -> ir.Value:
        """float16 values ``lane:lane+n`` of the block's super row (SUB16, SUPER6)."""
        sb = self.builder.ashr(self.blk, ir.Constant(_i64, SUPER_SHIFT))
        return self._halves(lane, n, sb, 0)

    def _subscales(self, row: int, lane: int, n: int, signed: bool = False) -> ir.Value:
        """Code bytes ``lane:lane+n`` of row ``row`` of the block as float32: ``signed``
        int8 (Q6_K's scales), else unsigned (SUPER6's 6-bit ones)."""
        cty, carr = self.codes
        ptr = self._ptr(cty, carr, [self.blk, row, lane])
        v = self._vec(ptr, n, _i8)
        v = (self.builder.sext if signed else self.builder.zext)(v, ir.VectorType(_i32, n))
        return self.builder.sitofp(v, ir.VectorType(ir.FloatType(), n))

    def emit(self, row0: ir.Value, sums: list[list[tuple[int, ir.Value, ir.Value | None]]]
             ) -> None:
        """``accs[r, lane] +=`` the tail of ``sums[r]`` for rows ``row0 + r`` of ``dx`` /
        ``xs``: per run of lanes (first lane, int32 sums of codes 0-15, of codes 16-31 or
        None where one sum covers the block). The expressions, per kind:

        - AFFINE_F16 / AFFINE: ``s * (d * f(isum)) + z * xsum``
        - SYMMETRIC: ``s * (d * f(isum) - f32(zero) * xsum)``; SYMMETRIC_F16 the same with
          ``s = f(d16)`` from the block's super row (the float32 SYMMETRIC holds)
        - SUB16 (two sums): ``(dq * d) * (f(sc0) * f(isum0) + f(sc1) * f(isum1))``
        - SUPER6: as AFFINE with ``s = f(dk) * f(sc)``, ``z = -(f(dmin) * f(m))`` (exact:
          the bits AFFINE stores)

        where ``isum`` is the sum of the two where there are two."""
        b, f32 = self.builder, ir.FloatType()
        kind = self.kind
        runs = [(lane, a.type.count) for lane, a, _ in sums[0]]
        two = sums[0][0][2] is not None

        def splat(v: ir.Value, n: int) -> ir.Value:
            return _splat(b, v, n)

        def isum(a: ir.Value, h: ir.Value | None) -> ir.Value:
            return b.sitofp(a if h is None else b.add(a, h), ir.VectorType(f32, a.type.count))

        def accumulate(terms) -> None:  # type: ignore[no-untyped-def]
            # terms(d, xsum, k, n, a, h): what run k (n lanes, sums a, h) of a row adds to
            # accs. d and xsum are loaded where a row starts, not all first: in registers
            # for 8 rows they were spilled.
            for r, row in enumerate(sums):
                at = [b.add(row0, ir.Constant(_i64, r)), self.g]
                d = b.load(self._ptr(self.tys[3], self.dx, at))
                xsum = b.load(self._ptr(self.tys[4], self.xs, at))
                for k, (lane, a, h) in enumerate(row):
                    ptr = b.bitcast(self._ptr(self.tys[5], self.accs, [r, lane]),
                                    ir.VectorType(f32, a.type.count).as_pointer())
                    b.store(b.fadd(b.load(ptr, align=4), terms(d, xsum, k, a.type.count, a, h)),
                            ptr, align=4)

        def with_scales(sz) -> None:  # type: ignore[no-untyped-def]
            # sz[k]: run k's scales and biases
            accumulate(lambda d, xsum, k, n, a, h: b.fadd(
                b.fmul(sz[k][0], b.fmul(splat(d, n), isum(a, h))),
                b.fmul(sz[k][1], splat(xsum, n))))

        def affine(half: bool) -> None:
            with_scales([((self._halves(lane, n), self._halves(LANES + lane, n)) if half else
                          (self._scales(self.c, lane, n), self._scales(self.c + 1, lane, n)))
                         for lane, n in runs])

        def super6() -> None:
            with_scales([(b.fmul(self._super(lane, n), self._subscales(4 * self.c, lane, n)),
                          b.fneg(b.fmul(self._super(LANES + lane, n),
                                        self._subscales(4 * self.c + 1, lane, n))))
                         for lane, n in runs])

        def symmetric(half: bool = False) -> None:
            sg = [self._halves(lane, n, self.blk, 0) if half else self._scales(self.c, lane, n)
                  for lane, n in runs]
            accumulate(lambda d, xsum, k, n, a, h: b.fmul(
                sg[k], b.fsub(b.fmul(splat(d, n), isum(a, h)),
                              splat(b.fmul(self.zero, xsum), n))))

        def sub16() -> None:
            dq = [self._super(lane, n) for lane, n in runs]
            sc = [(self._subscales(4 * self.c, lane, n, True),
                   self._subscales(4 * self.c + 1, lane, n, True)) for lane, n in runs]
            accumulate(lambda d, xsum, k, n, a, h: b.fmul(
                b.fmul(dq[k], splat(d, n)),
                b.fadd(b.fmul(sc[k][0], b.sitofp(a, ir.VectorType(f32, n))),
                       b.fmul(sc[k][1], b.sitofp(h, ir.VectorType(f32, n))))))

        cases = [(AFFINE_F16, partial(affine, True)), (AFFINE, partial(affine, False)),
                 (SUPER6, super6), (SYMMETRIC_F16, partial(symmetric, True))]
        if two:
            cases.append((SUB16, sub16))
        fn = b.function
        done = fn.append_basic_block("tail.done")
        other = fn.append_basic_block("tail.symmetric")
        switch = b.switch(kind, other)
        for value, body in cases:
            block = fn.append_basic_block(f"tail.{value}")
            switch.add_case(ir.Constant(kind.type, value), block)
            b.position_at_end(block)
            body()
            b.branch(done)
        b.position_at_end(other)
        symmetric()
        b.branch(done)
        b.position_at_end(done)


def _tail_args(context, builder, signature, args, first: int, blk, g, c):  # type: ignore
    """The :class:`_Tail` of an intrinsic whose first argument is ``codes`` and whose
    arguments from ``first`` on are ``(blocks, kind, zero, dx, xs, accs)``."""
    tys = signature.args[first:first + 6]
    vals = list(args[first:first + 6])
    vals[1] = context.cast(builder, vals[1], tys[1], types.int64)
    vals[2] = context.cast(builder, vals[2], tys[2], types.float32)
    return _Tail(context, builder, tys, vals, blk, g, c, (signature.args[0], args[0]))


# -- the frame of a block intrinsic ------------------------------------------------------
# Every form below writes a block's integer sums its own way; the arguments, the typing and
# the float tail are the same for all of them (:func:`_dot_intrinsic`).

Sums = list[list[tuple[int, ir.Value, ir.Value | None]]]  # per row: _Tail.emit's runs


class _Block:
    """What a block intrinsic's sums read (:func:`_dot_intrinsic`): block ``blk`` of the
    codes, the activation rows ``rows`` (``row`` and the next ``nrows - 1``) of group ``g``,
    how many planes of high bits the codes have (``planes``: 1 for 5-bit codes, ``five``;
    2 for Q6_K's 6-bit ones, ``six``), whether they are int8 (``signed``) and the
    activations int8 (``narrow``)."""

    def __init__(self, context, builder, signature, args, nrows: int,  # type: ignore
                 eight: bool) -> None:
        self.context, self.builder = context, builder
        self.cty, _, self.xty = signature.args[:3]
        self.carr, cblk, self.xarr, crow, cg = args[:5]
        self.blk, self.row, self.g = (_i64_of(builder, v) for v in (cblk, crow, cg))
        self.rows = [builder.add(self.row, ir.Constant(_i64, r)) for r in range(nrows)]
        self.p0 = builder.mul(self.g, ir.Constant(_i64, 16))  # the group's first pair
        high = signature.args[5]
        self.planes = 0 if eight or isinstance(high, types.NoneType) else high.ndim - 2
        self.five, self.six = self.planes == 1, self.planes == 2
        self.signed = self.cty.dtype == types.int8
        self.narrow = self.xty.dtype == types.int8
        self.split = self.xty.dtype == types.uint32  # :func:`split_activations`' bytes

    def code_rows(self, js: Sequence[int], vt: ir.VectorType) -> list[ir.Value]:
        """Code rows ``js`` of the block, each LANES bytes, as vectors ``vt``."""
        return _block_rows(self.context, self.builder, self.cty, self.carr, self.blk, js, vt)

    def pair(self, row: ir.Value, p: int) -> ir.Value:
        """Activation codes ``2p`` and ``2p + 1`` of the group in ``row`` as one integer."""
        return _pair(self.context, self.builder, self.xty, self.xarr, row, self.p0, p)

    def split_pair(self, row: ir.Value, p: int, high: bool) -> ir.Value:
        """Split activations (:func:`split_activations`): pair ``p`` of the group in ``row``,
        its low bytes (``high`` False) or its high ones, broadcast to 16 byte pairs."""
        builder = self.builder
        word = self._split_word(row, 2 * p + int(high))
        return builder.bitcast(_splat(builder, word, 8), ir.VectorType(_i8, 32))

    def split_shift(self, row: ir.Value, half: int) -> ir.Value:
        """Split activations: ``8192 * sum qh`` over codes ``16 half .. 16 half + 15`` of
        the group in ``row`` (int32), broadcast to 8 lanes (:func:`_split_sums6`)."""
        return _splat(self.builder, self._split_word(row, 32 + half), 8)

    def _split_word(self, row: ir.Value, k: int) -> ir.Value:
        builder = self.builder
        at = builder.add(builder.mul(self.g, ir.Constant(_i64, SPLIT_WORDS)), ir.Constant(_i64, k))
        ptr = _item_ptr(self.context, builder, self.xty, self.xarr, [row, at])
        return builder.load(builder.bitcast(ptr, _i32.as_pointer()), align=4)

    def planes_rows(self, vt: ir.VectorType) -> list[tuple[ir.Value, ...]]:
        """The planes of high bits, each its 4 rows (bit ``p`` of code 2p / 2p+1 / 2p+16
        / 2p+17), as vectors ``vt``."""
        rows = self.code_rows(range(16, 16 + 4 * self.planes), vt)
        return [tuple(rows[4 * k:4 * k + 4]) for k in range(self.planes)]


def _dot_codegen(nrows: int, sums4: Callable[[_Block], Sums], sums6: Callable[[_Block], Sums],
                 sums8: Callable[[_Block], Sums]):  # type: ignore[no-untyped-def]
    """The code of a block over ``nrows`` activation rows (:func:`dot`'s arguments): int8
    ``codes`` are 8-bit (``sums8`` writes the block's integer sums), uint8 ones 4-bit or,
    with ``high`` an array of one plane, 5-bit (``sums4``), of two planes Q6_K's 6-bit
    ``q - 32`` (``sums6``); then their float tail (:meth:`_Tail.emit`) goes into ``accs``."""

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        eight = signature.args[0].dtype == types.int8
        b = _Block(context, builder, signature, args, nrows, eight)
        c = 8 if eight else 4 + b.planes
        sums = (sums8 if eight else sums6 if b.six else sums4)(b)
        _tail_args(context, builder, signature, args, 6, b.blk, b.g, c).emit(b.row, sums)
        return context.get_dummy_value()

    return codegen


def _nibbles(builder: ir.IRBuilder, u: ir.Value,
             tops: Sequence[tuple[ir.Value, ir.Value]] = (), bit: int = 0
             ) -> tuple[ir.Value, ir.Value]:
    """Code bytes ``u`` -> their low and high nibbles, the 4-bit codes; with planes of
    high bits, bit ``bit`` of ``tops[k][0]`` / ``tops[k][1]`` (vectors like ``u`` from
    plane k) becomes bit 4 + k of the low / high code."""
    n = u.type.count
    m15, four, one = (ir.Constant(u.type, [c] * n) for c in (15, 4, 1))
    lo, hi = builder.and_(u, m15), builder.and_(builder.lshr(u, four), m15)
    at = ir.Constant(u.type, [bit] * n)
    for k, pair in enumerate(tops):
        to = ir.Constant(u.type, [4 + k] * n)
        high = [builder.shl(builder.and_(builder.lshr(top, at), one), to) for top in pair]
        lo, hi = builder.or_(lo, high[0]), builder.or_(hi, high[1])
    return lo, hi


def _six(builder: ir.IRBuilder, u: ir.Value, tops: Sequence[tuple[ir.Value, ir.Value]],
         bit: int, half: int) -> ir.Value:
    """Q6_K's signed codes ``q - 32`` (-32..31, bytes) of code bytes ``u`` with their two
    planes' ``tops`` (:func:`_nibbles`): the low nibbles' codes (``half`` 0: codes 0-15)
    or the high ones' (1: codes 16-31)."""
    code = _nibbles(builder, u, tops, bit)[half]
    return builder.sub(code, ir.Constant(u.type, [32] * u.type.count))


def _two_halves(halves: list[list[list[tuple[int, ir.Value]]]]) -> Sums:
    """Runs of codes 0-15 and of codes 16-31 (``halves[0]``, ``halves[1]``, per row) as
    :meth:`_Tail.emit`'s (lane, sums, sums of codes 16-31) runs."""
    return [[(lane, a, h) for (lane, a), (_, h) in zip(*pair, strict=True)]
            for pair in zip(*halves, strict=True)]


# -- the AVX2 form: pairs of codes -------------------------------------------------------


def _maddwd(builder: ir.IRBuilder) -> ir.Function:
    v16i16, v8i32 = ir.VectorType(_i16, 16), ir.VectorType(_i32, 8)
    return cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v8i32, [v16i16, v16i16]), "llvm.x86.avx2.pmadd.wd")


def _words(builder: ir.IRBuilder, pairs: ir.Value, signed: bool) -> list[ir.Value]:
    """32 bytes of code pairs (16 lanes) -> two vectors of 8 lanes' pairs as int16."""
    wide = (builder.sext if signed else builder.zext)(pairs, ir.VectorType(_i16, 32))
    return [builder.shuffle_vector(wide, ir.Constant(wide.type, None), ir.Constant(
        ir.VectorType(_i32, 16), list(range(h, h + 16)))) for h in (0, 16)]


# With 32 lanes of bytes in one 256-bit vector, AVX2's byte interleave works within each
# 128-bit half: pairs of lanes 0-7 and 16-23 come out of one instruction, 8-15 and 24-31
# of the other. The sums keep that order until they are stored.
_HALVES = (list(range(0, 8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)))
_EIGHTS = [list(range(0, 8)), list(range(16, 24)), list(range(8, 16)), list(range(24, 32))]



def _widen16(builder: ir.IRBuilder, wide: list[ir.Value], acc: ir.Value, times256: bool
             ) -> None:
    """Add the 16 signed 16-bit sums ``acc`` (lane order of :data:`_HALVES`) into ``wide``
    (int32: even lanes, odd lanes), times 256 if ``times256``: shifts within each 32-bit
    word, no shuffle."""
    v8i32 = ir.VectorType(_i32, 8)

    def c(v: int) -> ir.Constant:
        return ir.Constant(v8i32, [v] * 8)

    d = builder.bitcast(acc, v8i32)
    even = builder.ashr(builder.shl(d, c(16)), c(8 if times256 else 16))
    odd = builder.ashr(d, c(16))
    if times256:
        odd = builder.shl(odd, c(8))
    wide[0], wide[1] = builder.add(wide[0], even), builder.add(wide[1], odd)


def _lane_order(builder: ir.IRBuilder, parts: list[tuple[ir.Value, ir.Value]]
                ) -> list[tuple[int, ir.Value]]:
    """Per lane half of :data:`_HALVES`, its (even, odd) int32 sums from :func:`_widen16`,
    as (first lane, 8 consecutive lanes' sums) runs."""
    out = []
    for (even, odd), lanes in zip(parts, _HALVES, strict=True):
        for k, first in enumerate((lanes[0], lanes[8])):
            mask = [i for m in range(4 * k, 4 * k + 4) for i in (m, 8 + m)]
            out.append((first, builder.shuffle_vector(
                even, odd, ir.Constant(ir.VectorType(_i32, 8), mask))))
    return out


def _split_sums4(b: _Block) -> Sums:
    """4-bit codes against 16-bit activations split into bytes, ``q = 256 * qh + ql``
    (:func:`split_activations`): per lane ``sum code * q = 256 * sum code * qh + sum code *
    ql``, each sum a ``vpmaddubsw`` of the code bytes as they come out of the nibble masks
    (unsigned) against a broadcast byte pair: ``ql`` (0..255) as the unsigned operand with
    the codes as the signed one (a pair at most 2 * 255 * 15 = 7650), ``qh`` (-128..127)
    signed with the codes unsigned (at most 2 * 15 * 128 = 3840 in size). So no code is
    widened to 16 bits: the 16-bit form's per-pair ``vextracti128`` + ``vpmovzxbw`` (12
    shuffles of its 14 a pair of code rows) are gone. The 16-bit sums (two pairs of rows
    of ``ql`` products, 4 of ``qh``: at most 30600 / 30720) are widened every 2 / 4 pairs
    by shifts within 32-bit words (even lanes, odd lanes; ``qh``'s times 256 on the way),
    and put back in lane order once a block. Exact integer sums, the 16-bit form's."""
    builder = b.builder
    v32i8, v16i16, v8i32 = ir.VectorType(_i8, 32), ir.VectorType(_i16, 16), ir.VectorType(_i32, 8)
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16i16, [v32i8, v32i8]), "llvm.x86.avx2.pmadd.ub.sw")
    z16, z32 = ir.Constant(v16i16, [0] * 16), ir.Constant(v8i32, [0] * 8)
    low = [[z16, z16] for _ in b.rows]  # per row and lane half (_HALVES): ql's sums
    high = [[z16, z16] for _ in b.rows]  # qh's
    wide = [[[z32, z32], [z32, z32]] for _ in b.rows]  # per half: even, odd lanes

    for p in range(8):
        r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
        # per row: (ql, qh) of pair p (codes 2p, 2p+1) and of pair p + 8 (2p+16, 2p+17)
        xs = [[(b.split_pair(rw, p + o, False), b.split_pair(rw, p + o, True)) for o in (0, 8)]
              for rw in b.rows]
        for h, lanes in enumerate(_HALVES):
            codes = _nibbles(builder, _interleave(builder, r0, r1, lanes))
            for r, x in enumerate(xs):
                for c, code in enumerate(codes):
                    ql, qh = x[c]
                    low[r][h] = builder.add(low[r][h], builder.call(maddubs, [ql, code]))
                    high[r][h] = builder.add(high[r][h], builder.call(maddubs, [code, qh]))
        for r in range(len(b.rows)):
            for h in range(2):
                if p % 2 == 1:
                    _widen16(builder, wide[r][h], low[r][h], False)
                    low[r][h] = z16
                if p % 4 == 3:
                    _widen16(builder, wide[r][h], high[r][h], True)
                    high[r][h] = z16
    return [[(lane, v, None) for lane, v in _lane_order(builder, [tuple(h) for h in w])]
            for w in wide]


def _pair_sums4(b: _Block) -> Sums:
    builder = b.builder
    if b.split:
        return _split_sums4(b)
    v32i8, v16i16 = ir.VectorType(_i8, 32), ir.VectorType(_i16, 16)
    v8i32, v16i32 = ir.VectorType(_i32, 8), ir.VectorType(_i32, 16)
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16i16, [v32i8, v32i8]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = _maddwd(builder)
    zero = (ir.Constant(v16i16, [0] * 16) if b.narrow  # (half, codes 0-15 / 16-31)
            else ir.Constant(v8i32, [0] * 8))  # 8 lanes each, in _EIGHTS order
    acc = [[zero] * 4 for _ in b.rows]
    wide = [[ir.Constant(v16i32, [0] * 16)] * 4 for _ in b.rows]  # narrow: 32-bit sums
    # bit 4 of codes (2p, 2p+1) / (2p+16, 2p+17) as pairs, per lane half
    tops = [[(_interleave(builder, el, ol, lanes), _interleave(builder, eh, oh, lanes))
             for el, ol, eh, oh in b.planes_rows(v32i8)] for lanes in _HALVES]
    for p in range(8):
        r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
        splat = _pair_bytes if b.narrow else _pair_words
        xs = [[splat(builder, b.pair(rw, p + o)) for o in (0, 8)] for rw in b.rows]
        for h, lanes in enumerate(_HALVES):
            lo, hi = _nibbles(builder, _interleave(builder, r0, r1, lanes), tops[h], p)
            if b.narrow:
                for a, (lo_x, hi_x) in zip(acc, xs, strict=True):
                    a[2 * h] = builder.add(a[2 * h], builder.call(maddubs, [lo, lo_x]))
                    a[2 * h + 1] = builder.add(a[2 * h + 1], builder.call(maddubs, [hi, hi_x]))
                continue
            for c, codes_ in enumerate((lo, hi)):
                for e, words in enumerate(_words(builder, codes_, signed=False)):
                    for a, x in zip(acc, xs, strict=True):
                        a[2 * h + e] = builder.add(a[2 * h + e],
                                                   builder.call(maddwd, [words, x[c]]))
        # 16-bit sums of 5-bit codes (pairs up to 2 * 31 * 127 = 7874) hold 4 pairs.
        if b.narrow and (p == 7 or (b.five and p == 3)):
            for a, w in zip(acc, wide, strict=True):
                for i in range(4):
                    w[i] = builder.add(w[i], builder.sext(a[i], v16i32))
                    a[i] = zero
    sums = []
    for r, a in enumerate(acc):
        if b.narrow:
            w = wide[r]
            runs = _runs(builder, [builder.add(w[2 * h], w[2 * h + 1]) for h in range(2)],
                         _HALVES)
        else:
            runs = _runs(builder, a, _EIGHTS)
        sums.append([(lane, v, None) for lane, v in runs])
    return sums



def _pair_sums8(b: _Block) -> Sums:
    builder = b.builder
    v32i8, v8i32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 8)
    maddwd = _maddwd(builder)
    halves = []
    for half in range(2):  # codes 0-15, then 16-31
        acc = [[ir.Constant(v8i32, [0] * 8)] * 4 for _ in b.rows]  # _EIGHTS order
        for p in range(8 * half, 8 * half + 8):
            r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
            xs = [_pair_words(builder, b.pair(rw, p)) for rw in b.rows]
            for h, lanes in enumerate(_HALVES):
                pairs = _interleave(builder, r0, r1, lanes)
                for e, words in enumerate(_words(builder, pairs, b.signed)):
                    for a, x in zip(acc, xs, strict=True):
                        a[2 * h + e] = builder.add(a[2 * h + e],
                                                   builder.call(maddwd, [words, x]))
        halves.append([_runs(builder, a, _EIGHTS) for a in acc])
    return _two_halves(halves)


def _crumbs(builder: ir.IRBuilder, t4: ir.Value, t5: ir.Value, flip: bool = True
            ) -> tuple[ir.Value, ir.Value]:
    """Q6_K's planes of bit 4 (``t4``) and bit 5 (``t5``, flipped) as 2-bit crumbs (bit 4,
    not bit 5) per code: code pair ``p``'s at bits ``p, p + 1`` of the first vector for even
    ``p``, at ``p - 1, p`` of the second for odd ``p``; made once a block, so each code
    takes its two high bits with one shift and one mask (:func:`_six4`)."""
    vt = t4.type

    def c(v: int) -> ir.Constant:
        return ir.Constant(vt, [v] * vt.count)

    if flip:
        t5 = builder.xor(t5, c(0xFF))
    even = builder.or_(builder.and_(t4, c(0x55)), builder.shl(builder.and_(t5, c(0x55)), c(1)))
    odd = builder.or_(builder.and_(builder.lshr(t4, c(1)), c(0x55)), builder.and_(t5, c(0xAA)))
    return even, odd


def _six4(builder: ir.IRBuilder, u: ir.Value, crumbs: tuple[ir.Value, ir.Value], p: int,
          half: int) -> ir.Value:
    """``4 * (q - 32)`` as signed bytes for code pair ``p`` of code bytes ``u``: the nibble
    (low for ``half`` 0, high for 1) at bits 2-5, bit 4 at bit 6 and bit 5 flipped at bit 7,
    i.e. ``4 * (q ^ 32)`` read as int8, which is ``4 * (q - 32)``: no subtraction, and the
    sums are 4 times the codes' sums, exactly (divided back per block)."""
    vt = u.type

    def c(v: int) -> ir.Constant:
        return ir.Constant(vt, [v] * vt.count)

    nib = (builder.shl(u, c(2)) if half == 0 else builder.lshr(u, c(2)))
    src, at = crumbs[p & 1], p - (p & 1)  # the crumb's bits at, at + 1 -> 6, 7
    top = builder.shl(src, c(6 - at)) if at < 6 else src
    return builder.or_(builder.and_(nib, c(0x3C)), builder.and_(top, c(0xC0)))


def _q6(builder: ir.IRBuilder, u: ir.Value, crumbs: tuple[ir.Value, ir.Value], p: int,
        half: int) -> ir.Value:
    """Q6_K's unsigned codes ``q`` (0..63, bytes) for code pair ``p`` of code bytes ``u``:
    the nibble (low for ``half`` 0, high for 1) and the crumb of :func:`_crumbs` (made with
    ``flip`` False) at bits 4-5."""
    vt = u.type

    def c(v: int) -> ir.Constant:
        return ir.Constant(vt, [v] * vt.count)

    nib = builder.and_(u if half == 0 else builder.lshr(u, c(4)), c(15))
    src, at = crumbs[p & 1], p - (p & 1)  # the crumb's bits at, at + 1 -> 4, 5
    top = (builder.shl(src, c(4 - at)) if at < 4 else
           builder.lshr(src, c(at - 4)) if at > 4 else src)
    return builder.or_(nib, builder.and_(top, c(0x30)))


def _split_sums6(b: _Block) -> Sums:
    """Q6_K's codes against split activations (:func:`split_activations`, ``q = 256 * qh +
    ql``), each half block's sum ``sum (c - 32) * x`` as ``sum (c - 32) * ql + 256 * (sum c
    * qh - 32 * sum qh)``: ``vpmaddubsw`` of ``ql`` (unsigned) against the signed bytes ``c
    - 32`` (a pair at most 2 * 255 * 32 = 16320 in size) and of the unsigned codes ``c``
    (0..63) against ``qh`` (at most 2 * 63 * 128 = 16128); ``8192 * sum qh`` comes with the
    activations. One pass over the code bytes takes both halves (a byte's low nibble is
    code ``j``, its high one ``j + 16``), each lane half (:data:`_HALVES`) in turn so that
    its accumulators stay in registers. The 16-bit sums of two pairs of code rows go to 32
    bits as ``vpmaddwd`` of their words interleaved, ``(ql part, qh part)`` against ``(1,
    256)``: the shuffle ports, which bound the loop, take one interleave a widening instead
    of shifts. The exact integer sums of :func:`_pair_sums6`, with no code widened to 16
    bits."""
    builder = b.builder
    v32i8, v16i16, v8i32 = ir.VectorType(_i8, 32), ir.VectorType(_i16, 16), ir.VectorType(_i32, 8)
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16i16, [v32i8, v32i8]), "llvm.x86.avx2.pmadd.ub.sw")
    maddwd = _maddwd(builder)
    z16, z32 = ir.Constant(v16i16, [0] * 16), ir.Constant(v8i32, [0] * 8)
    thirty_two = ir.Constant(v32i8, [32] * 32)
    weights = ir.Constant(v16i16, [1, 256] * 8)  # (ql part, qh part) word pairs
    # words 0-3, 8-11 (``vpunpcklwd``) and 4-7, 12-15 (``vpunpckhwd``), each with its pair
    inter = [ir.Constant(ir.VectorType(_i32, 16), [i for w in words for i in (w, 16 + w)])
             for words in ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15))]
    (el, ol, eh, oh), (el5, ol5, eh5, oh5) = b.planes_rows(v32i8)
    crumbs = [[_crumbs(builder, _interleave(builder, a4, b4, lanes),
                       _interleave(builder, a5, b5, lanes), flip=False)
               for a4, b4, a5, b5 in ((el, ol, el5, ol5), (eh, oh, eh5, oh5))]
              for lanes in _HALVES]  # [h][half]
    # per row, lane half and code half: 16-bit sums of ql's and qh's products, 32-bit ones
    low = [[[z16, z16], [z16, z16]] for _ in b.rows]
    high = [[[z16, z16], [z16, z16]] for _ in b.rows]
    wide = [[[[z32, z32], [z32, z32]], [[z32, z32], [z32, z32]]] for _ in b.rows]
    for p in range(8):
        r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
        xs = [[(b.split_pair(rw, p + 8 * half, False), b.split_pair(rw, p + 8 * half, True))
               for half in range(2)] for rw in b.rows]
        for h, lanes in enumerate(_HALVES):
            u = _interleave(builder, r0, r1, lanes)
            for half in range(2):
                q = _q6(builder, u, crumbs[h][half], p, half)
                signed = builder.sub(q, thirty_two)
                for r in range(len(b.rows)):
                    ql, qh = xs[r][half]
                    low[r][h][half] = builder.add(low[r][h][half],
                                                  builder.call(maddubs, [ql, signed]))
                    high[r][h][half] = builder.add(high[r][h][half],
                                                   builder.call(maddubs, [q, qh]))
        if p % 2 == 1:
            for r in range(len(b.rows)):
                for h in range(2):
                    for half in range(2):
                        for k, mask in enumerate(inter):
                            words = builder.shuffle_vector(low[r][h][half], high[r][h][half],
                                                           mask)
                            wide[r][h][half][k] = builder.add(
                                wide[r][h][half][k], builder.call(maddwd, [words, weights]))
                        low[r][h][half] = high[r][h][half] = z16
    out: list[list[list[tuple[int, ir.Value]]]] = [[[], []] for _ in b.rows]  # row, half
    for r, rw in enumerate(b.rows):
        for half in range(2):
            shift = b.split_shift(rw, half)
            for h, lanes in enumerate(_HALVES):
                # wide[..][0]: lanes[0:4] and lanes[8:12]; [1]: lanes[4:8] and lanes[12:16]
                lo4, hi4 = wide[r][h][half]
                for first, mask in ((lanes[0], [0, 1, 2, 3, 8, 9, 10, 11]),
                                    (lanes[8], [4, 5, 6, 7, 12, 13, 14, 15])):
                    run = builder.shuffle_vector(lo4, hi4, ir.Constant(v8i32, mask))
                    out[r][half].append((first, builder.sub(run, shift)))
    return _two_halves([[out[r][half] for r in range(len(b.rows))] for half in range(2)])


def _pair_sums6(b: _Block) -> Sums:
    """Q6_K's codes as :func:`_pair_sums8` takes int8 ones: each half block's codes (low
    nibbles for codes 0-15, high for 16-31, with their two planes' bits) as signed bytes
    ``4 * (q - 32)`` (:func:`_six4`), widened to 16 bits, ``vpmaddwd`` (int8 activations
    too: int16 pairs), 32-bit sums, divided by 4 (exact): the integer sums of the 8-bit
    form, so its bits."""
    builder = b.builder
    if b.split:
        return _split_sums6(b)
    v32i8, v8i32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 8)
    maddwd = _maddwd(builder)
    (el, ol, eh, oh), (el5, ol5, eh5, oh5) = b.planes_rows(v32i8)
    crumbs = [[_crumbs(builder, _interleave(builder, a4, b4, lanes),
                       _interleave(builder, a5, b5, lanes)) for lanes in _HALVES]
              for a4, b4, a5, b5 in ((el, ol, el5, ol5), (eh, oh, eh5, oh5))]
    two = ir.Constant(v8i32, [2] * 8)
    halves = []
    for half in range(2):  # codes 0-15, then 16-31
        acc = [[ir.Constant(v8i32, [0] * 8)] * 4 for _ in b.rows]  # _EIGHTS order
        for p in range(8):
            r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
            xs = [_pair_words(builder, b.pair(rw, p + 8 * half)) for rw in b.rows]
            for h, lanes in enumerate(_HALVES):
                codes_ = _six4(builder, _interleave(builder, r0, r1, lanes), crumbs[half][h],
                               p, half)
                for e, words in enumerate(_words(builder, codes_, signed=True)):
                    for a, x in zip(acc, xs, strict=True):
                        a[2 * h + e] = builder.add(a[2 * h + e],
                                                   builder.call(maddwd, [words, x]))
        acc = [[builder.ashr(v, two) for v in a] for a in acc]  # 4 * the sums, exactly
        halves.append([_runs(builder, a, _EIGHTS) for a in acc])
    return _two_halves(halves)


# -- the same sums in 512-bit vectors (AVX-512BW) --------------------------------------
# One zmm holds a block's two code rows for all 32 lanes, interleaved lane by lane; the
# codes widen to two vectors of 16 lanes x 2 codes, each one ``vpmaddwd`` against the
# broadcast activation pair: half the multiply-adds of the AVX2 form, and the shuffles
# stay inside 128-bit lanes or are single ``vpermt2b`` (AVX-512 VBMI) / ``vpermt2w``.
# The integer sums are exact, so the results are bitwise those of the AVX2 intrinsics.

_PAIRS64 = [i for lane in range(LANES) for i in (lane, LANES + lane)]


def _wide_words(builder: ir.IRBuilder, codes: ir.Value, signed: bool) -> list[ir.Value]:
    """64 code bytes (32 lanes x 2) -> two vectors of 16 lanes' pairs as int16."""
    v64i16 = ir.VectorType(_i16, 64)
    wide = (builder.sext if signed else builder.zext)(codes, v64i16)
    return [builder.shuffle_vector(wide, ir.Constant(v64i16, None), ir.Constant(
        ir.VectorType(_i32, 32), list(range(h, h + 32)))) for h in (0, 32)]


# The inline asm of the VNNI kernels (_wide_madd) needs LLVM's assembly parser, which numba
# does not set up. Set up at import, not when a kernel's IR is generated: a process that
# loads a kernel from numba's cache and then compiles a caller linking it (linear_packed_int over a
# cached matvec_packed_int) finalizes that asm without generating any, and LLVM aborted there.
if _x86():
    llvm.initialize_native_asmparser()


@cache
def _vnni() -> bool:
    """Whether the target has AVX-512 VNNI (``vpdpwssd``, written as inline asm)."""
    return _x86() and target_has("avx512vnni")


@cache
def _avx_vnni() -> bool:
    """Whether the target has AVX-VNNI (``vpdpwssd`` on 256-bit vectors, VEX-encoded: Intel
    from Alder Lake, without AVX-512): then an AVX2 multiply-add and its add are one
    instruction, where ``vpmaddwd`` + ``vpaddd`` take two."""
    return _x86() and target_has("avxvnni")


def _wide_madd(builder: ir.IRBuilder, acc: ir.Value, words: ir.Value, x: ir.Value,
               nrows: int) -> ir.Value:
    """``acc + vpmaddwd(words, x)`` (16 int32 lanes) in a block of ``nrows`` rows: for 4
    and more, one ``vpdpwssd`` where the target has VNNI (:func:`madd_add`). LLVM keeps
    the two instructions to shorten each accumulator's chain, which the one- and two-row
    blocks keep (their chains are few); but with 4 rows or more the loop is bound by its
    vector ops, the split adds one per multiply-add, and 4 rows sharing the codes then ran
    no faster than two pairs."""
    return madd_add(builder, acc, words, x, fuse=nrows >= 4)


def madd_add(builder: ir.IRBuilder, acc: ir.Value, words: ir.Value, x: ir.Value,
             fuse: bool = True) -> ir.Value:
    """``acc + vpmaddwd(words, x)`` for 8 (AVX2) or 16 (AVX-512) int32 lanes; with ``fuse``,
    one ``vpdpwssd`` where the target has it for that width (AVX-512 VNNI for 16 lanes,
    AVX-VNNI for 8: VEX encoded, so ymm0-15), as inline asm, since from the intrinsic LLVM
    (22) splits it back into ``vpmaddwd`` + ``vpaddd``. Same sums either way: both add
    modulo 2**32 (and these sums never wrap)."""
    wide = acc.type.count == 16
    if fuse and (_vnni() if wide else _avx_vnni()):
        ty = ir.FunctionType(acc.type, [acc.type, words.type, x.type])
        op, reg = ("vpdpwssd", "v") if wide else ("{vex} vpdpwssd", "x")
        return builder.asm(ty, f"{op} $3, $2, $0", f"={reg},0,{reg},{reg}", [acc, words, x],
                           False)
    if not wide:
        return builder.add(acc, builder.call(_maddwd(builder), [words, x]))
    v32i16, v16i32 = ir.VectorType(_i16, 32), ir.VectorType(_i32, 16)
    madd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(v16i32, [v32i16, v32i16]), "llvm.x86.avx512.pmaddw.d.512")
    return builder.add(acc, builder.call(madd, [words, x]))



def _wide_sums4(b: _Block) -> Sums:
    builder = b.builder
    v32i8, v16i32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 16)
    pairs = ir.Constant(ir.VectorType(_i32, 64), _PAIRS64)
    acc = [[ir.Constant(v16i32, [0] * 16)] * 2 for _ in b.rows]  # lanes 0-15, 16-31
    # bit 4 of codes (2p, 2p+1) and (2p+16, 2p+17), paired as the codes
    tops = [(builder.shuffle_vector(el, ol, pairs), builder.shuffle_vector(eh, oh, pairs))
            for el, ol, eh, oh in b.planes_rows(v32i8)]
    for p in range(8):
        r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
        lo, hi = _nibbles(builder, builder.shuffle_vector(r0, r1, pairs), tops, p)
        for c, codes_ in enumerate((lo, hi)):  # codes 2p.. and 2p+16..
            words = _wide_words(builder, codes_, signed=False)
            for a, rw in zip(acc, b.rows, strict=True):
                x = _pair_words(builder, b.pair(rw, p + 8 * c), 16)
                a[0] = _wide_madd(builder, a[0], words[0], x, len(b.rows))
                a[1] = _wide_madd(builder, a[1], words[1], x, len(b.rows))
    return [[(0, a[0], None), (16, a[1], None)] for a in acc]



def _wide_sums8(b: _Block) -> Sums:
    builder = b.builder
    v32i8, v16i32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 16)
    pairs = ir.Constant(ir.VectorType(_i32, 64), _PAIRS64)
    halves = []
    for half in range(2):  # codes 0-15, then 16-31
        acc = [[ir.Constant(v16i32, [0] * 16)] * 2 for _ in b.rows]
        for p in range(8 * half, 8 * half + 8):
            r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
            words = _wide_words(builder, builder.shuffle_vector(r0, r1, pairs), b.signed)
            for a, rw in zip(acc, b.rows, strict=True):
                x = _pair_words(builder, b.pair(rw, p), 16)
                a[0] = _wide_madd(builder, a[0], words[0], x, len(b.rows))
                a[1] = _wide_madd(builder, a[1], words[1], x, len(b.rows))
        halves.append([[(0, a[0]), (16, a[1])] for a in acc])
    return _two_halves(halves)


def _wide_sums6(b: _Block) -> Sums:
    """:func:`_pair_sums6` in 512-bit vectors, as :func:`_wide_sums8`."""
    builder = b.builder
    v32i8, v16i32 = ir.VectorType(_i8, 32), ir.VectorType(_i32, 16)
    pairs = ir.Constant(ir.VectorType(_i32, 64), _PAIRS64)
    tops = [(builder.shuffle_vector(el, ol, pairs), builder.shuffle_vector(eh, oh, pairs))
            for el, ol, eh, oh in b.planes_rows(v32i8)]
    halves = []
    for half in range(2):  # codes 0-15, then 16-31
        acc = [[ir.Constant(v16i32, [0] * 16)] * 2 for _ in b.rows]
        for p in range(8):
            r0, r1 = b.code_rows((2 * p, 2 * p + 1), v32i8)
            codes_ = _six(builder, builder.shuffle_vector(r0, r1, pairs), tops, p, half)
            words = _wide_words(builder, codes_, signed=True)
            for a, rw in zip(acc, b.rows, strict=True):
                x = _pair_words(builder, b.pair(rw, p + 8 * half), 16)
                a[0] = _wide_madd(builder, a[0], words[0], x, len(b.rows))
                a[1] = _wide_madd(builder, a[1], words[1], x, len(b.rows))
        halves.append([[(0, a[0]), (16, a[1])] for a in acc])
    return _two_halves(halves)


# -- the same sums in plain vector IR, lane by lane (ARM NEON) ---------------------------
# No pair multiply-add here: a block's code row j (one code per output lane, 32 lanes)
# widened to 16 bits, times the activation code q_j broadcast, added into the lanes' 32-bit
# sums. Generic IR that any LLVM target selects; on AArch64 each 4 lanes' step is one
# ``smlal`` / ``smlal2`` by element (16 x 16 -> 32 bits, NEON's widening multiply-add; it
# has no pair form like ``vpmaddwd``), and the lanes stay in order, so nothing is
# interleaved. A row's 32 sums are 8 registers of 4 lanes: pairs of rows take 16 of NEON's
# 32, with the codes and the two rows' activations beside them. The sums are exact, so the
# results are bitwise those of the x86 intrinsics (the tail is the same IR).

_LANE_RUNS = [list(range(LANES))]  # a lane dot's sums: one vector, lanes in order


def _lane_acts(b: _Block, row: ir.Value) -> ir.Value:
    """Activation row ``row``'s 32 codes of group ``g`` (int8 or int16) as a v32i16."""
    builder = b.builder
    ptr = _item_ptr(b.context, builder, b.xty, b.xarr,
                    [row, builder.mul(b.g, ir.Constant(_i64, 32))])
    v = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(b.xty.dtype.bitwidth), 32)
                                     .as_pointer()), align=1)
    return builder.sext(v, ir.VectorType(_i16, 32)) if b.narrow else v


def _lane_madd(builder: ir.IRBuilder, acc: ir.Value, codes: ir.Value, acts: ir.Value,
               j: int) -> ir.Value:
    """``acc + codes * acts[j]`` lane by lane: ``codes`` v32i16, ``acc`` v32i32."""
    v32i32 = ir.VectorType(_i32, 32)
    qj = builder.shuffle_vector(acts, ir.Constant(acts.type, None),
                                ir.Constant(v32i32, [j] * 32))
    return builder.add(acc, builder.mul(builder.sext(codes, v32i32), builder.sext(qj, v32i32)))



def _lane_sums4(b: _Block) -> Sums:
    builder = b.builder
    v32i8, v32i16, v32i32 = (ir.VectorType(t, 32) for t in (_i8, _i16, _i32))
    acts = [_lane_acts(b, rw) for rw in b.rows]
    acc = [ir.Constant(v32i32, [0] * 32) for _ in b.rows]
    planes = b.planes_rows(v32i8)  # bit 4: codes 2p / 2p+1 / 2p+16 / 2p+17 at bit p
    for j in range(16):  # byte j: code j low, code j + 16 high
        (u,) = b.code_rows((j,), v32i8)
        tops = [(plane[j & 1], plane[2 + (j & 1)]) for plane in planes]
        lo, hi = _nibbles(builder, u, tops, j >> 1)
        for c, code in ((j, lo), (j + 16, hi)):
            wide16 = builder.zext(code, v32i16)
            acc = [_lane_madd(builder, a, wide16, x, c) for a, x in zip(acc, acts, strict=True)]
    return [[(lane, v, None) for lane, v in _runs(builder, [a], _LANE_RUNS)] for a in acc]



def _lane_sums8(b: _Block) -> Sums:
    builder = b.builder
    v32i8, v32i16, v32i32 = (ir.VectorType(t, 32) for t in (_i8, _i16, _i32))
    acts = [_lane_acts(b, rw) for rw in b.rows]
    halves = []
    for half in range(2):  # codes 0-15, then 16-31
        acc = [ir.Constant(v32i32, [0] * 32) for _ in b.rows]
        for j in range(16 * half, 16 * half + 16):
            (u,) = b.code_rows((j,), v32i8)
            wide16 = (builder.sext if b.signed else builder.zext)(u, v32i16)
            acc = [_lane_madd(builder, a, wide16, x, j) for a, x in zip(acc, acts, strict=True)]
        halves.append([_runs(builder, [a], _LANE_RUNS) for a in acc])
    return _two_halves(halves)


def _lane_sums6(b: _Block) -> Sums:
    """:func:`_pair_sums6` lane by lane, as :func:`_lane_sums8`."""
    builder = b.builder
    v32i8, v32i16, v32i32 = (ir.VectorType(t, 32) for t in (_i8, _i16, _i32))
    acts = [_lane_acts(b, rw) for rw in b.rows]
    planes = b.planes_rows(v32i8)
    halves = []
    for half in range(2):  # codes 0-15 (low nibbles), then 16-31 (high)
        acc = [ir.Constant(v32i32, [0] * 32) for _ in b.rows]
        for j in range(16):
            (u,) = b.code_rows((j,), v32i8)
            tops = [(plane[j & 1], plane[2 + (j & 1)]) for plane in planes]
            wide16 = builder.sext(_six(builder, u, tops, j >> 1, half), v32i16)
            acc = [_lane_madd(builder, a, wide16, x, j + 16 * half)
                   for a, x in zip(acc, acts, strict=True)]
        halves.append([_runs(builder, [a], _LANE_RUNS) for a in acc])
    return _two_halves(halves)


def wide() -> bool:
    """Whether the pair kernels take the 512-bit intrinsics (the target has AVX-512BW)."""
    return form() == "avx512"


# Rows go in groups that share each unpacking of the codes (load, interleave, mask,
# widen): on AVX-512 8, then 4, then 2 rows, then a single one; on AVX2 pairs, then a
# single row. AVX2's 16 registers hold two rows' 8 accumulators; 4 rows were measured
# slower (docs/cpu-backend.md). AVX-512's 32 hold 8 rows' 16 without spilling (read off
# the compiled kernels), and there the unpacking costs about what a row's multiply-adds
# do with VNNI, so pairs would unpack 4 times at 8 rows.
ROW_GROUP = 8 if wide() else 2  # the largest group


def vnni_groups() -> bool:
    """Whether rows go in groups of 8 whose multiply-adds are ``vpdpwssd`` (AVX-512 VNNI):
    where the kernels beat dequant+sgemm at prefill sizes on 4/5-bit codes (measured on
    this target only; docs/cpu-backend.md, "Prefill")."""
    return ROW_GROUP == 8 and _vnni()


# Each form's sums: (4/5-bit codes, Q6_K's 6-bit codes, 8-bit codes).
SUMS = {"avx2": (_pair_sums4, _pair_sums6, _pair_sums8),
        "avx512": (_wide_sums4, _wide_sums6, _wide_sums8),
        "lanes": (_lane_sums4, _lane_sums6, _lane_sums8)}


def make_dot(form_: str):  # type: ignore[no-untyped-def]
    """The block intrinsic of form ``form_`` (:data:`SUMS`): ``(codes, blk, xp, row, g,
    high, blocks, kind, zero, dx, xs, accs, nrows)`` adds into ``accs[r]`` the float tail
    of ``isum[r, lane] = sum_j code_j * q_j`` for activation rows ``row + r``, r <
    ``nrows``, over block ``blk``'s 32 codes of each of the LANES lanes, ``q`` the
    activation codes ``xp[row + r, 32*g:32*g+32]`` (int8 or int16), read in pairs. The
    codes are unpacked once for all ``nrows`` rows. ``nrows`` must be a constant where
    the intrinsic is typed (one body per row count); ``codes`` int8 are 8-bit codes, uint8
    4-bit ones (byte j: code j low, code j+16 high) or, with ``high`` an array (not None),
    5-bit: bit 4 from the plane of high bits, code bytes 16-19, or with ``high`` of two
    planes (4 dimensions) Q6_K's 6-bit ones, bit 5 from code bytes 20-23 (``layout``
    docstring; read through ``codes``)."""
    sums = SUMS[form_]

    @intrinsic(prefer_literal=True)
    def dot(typingctx, codes, blk, xp, row, g, high, blocks, kind, zero, dx, xs, accs, nrows
            ):  # type: ignore[no-untyped-def]
        if not isinstance(nrows, types.IntegerLiteral):
            return None
        sig = types.void(codes, blk, xp, row, g, high, blocks, kind, zero, dx, xs, accs, nrows)
        return sig, _dot_codegen(nrows.literal_value, *sums)

    return dot


_dot = make_dot(form())
# The float tail is the dot intrinsics' own (:class:`_Tail`), one expression in IEEE ops
# without fast-math flags for every group size, so a row computes the same bits alone, in
# a pair or in a group (the server's batching relies on it; tests/test_backend_cpu.py
# checks batches of 1-8). The kernels keep compiling without FMA contraction or
# reassociation (``_NO_FUSE``, which kdot's tails rely on too).
_NO_FUSE = {"nnan", "ninf", "nsz", "arcp", "afn"}


@_jit(inline="always", fastmath=_NO_FUSE)
def _tile_rows(codes: np.ndarray, blocks: np.ndarray, flat: np.ndarray,
               high: np.ndarray | None, kind: int, zero: float, xp: np.ndarray,
               dx: np.ndarray, xs: np.ndarray, out: np.ndarray, accs: np.ndarray, t: int,
               i: int, n: int) -> None:
    """Rows ``i:i+n`` of tile ``t`` of ``out``, the ``n`` rows sharing each unpacking of a
    block's codes. Inlined, with ``n`` a constant at every call: one dot body a loop."""
    groups = dx.shape[1]
    row_bytes = codes.shape[1] * LANES  # a block's bytes (codes: its byte view)
    accs[:n] = 0.0
    for g in range(groups):
        blk = t * groups + g
        if i == 0:
            _prefetch_block(flat, blk + PREFETCH, row_bytes)
        _dot(codes, blk, xp, i, g, high, blocks, kind, zero, dx, xs, accs, n)
    out[i:i + n, t * LANES:(t + 1) * LANES] = accs[:n]


SPLIT_WORDS = 34  # split activations' words a group: 16 pairs x (ql, qh), 2 Q6_K terms


def split_activations(xp, codes, high):  # type: ignore[no-untyped-def]  # numba only
    """What the AVX2 kernels multiply 4-bit and Q6_K's 6-bit codes by: int16 activations
    ``xp`` (T, K) split into bytes, ``q = 256 * qh + ql`` with ``ql = q & 255`` (unsigned)
    and ``qh = q >> 8`` (signed, -128..127 as ``|q| <= 32767``), as (T, K / 32 *
    SPLIT_WORDS) uint32, per group of 32: for each pair of codes ``2p, 2p + 1``, word ``2p``
    holds the bytes ``(ql_2p, ql_2p+1)`` twice and word ``2p + 1`` ``(qh_2p, qh_2p+1)``
    twice, each one broadcast load (:func:`_split_sums4`); words 32 and 33 hold ``8192 *
    sum qh`` over codes 0-15 and 16-31 (int32, :func:`_split_sums6`). Any other codes
    (5- and 8-bit), activations or form: ``xp`` itself."""
    raise NotImplementedError


@overload(split_activations, inline="always")
def _split_activations_ov(xp, codes, high):  # type: ignore[no-untyped-def]
    if not (form() == "avx2" and xp.dtype == types.int16 and codes.dtype == types.uint8
            and (isinstance(high, types.NoneType) or high.ndim == 4)):
        return lambda xp, codes, high: xp

    def split(xp, codes, high):  # type: ignore[no-untyped-def]
        rows, groups = xp.shape[0], xp.shape[1] // 32
        out = np.empty((rows, groups * SPLIT_WORDS), dtype=np.uint32)
        m8 = np.int32(255)
        for r in range(rows):
            for g in range(groups):
                o = g * SPLIT_WORDS
                top0 = top1 = np.int32(0)  # sum qh over codes 0-15, 16-31
                for p in range(16):
                    a, b = np.int32(xp[r, 32 * g + 2 * p]), np.int32(xp[r, 32 * g + 2 * p + 1])
                    lo = (a & m8) | ((b & m8) << np.int32(8))
                    hi = ((a >> np.int32(8)) & m8) | (((b >> np.int32(8)) & m8) << np.int32(8))
                    out[r, o + 2 * p] = np.uint32(lo * np.int32(0x10001))
                    out[r, o + 2 * p + 1] = np.uint32(hi * np.int32(0x10001))
                    if p < 8:
                        top0 += (a >> np.int32(8)) + (b >> np.int32(8))
                    else:
                        top1 += (a >> np.int32(8)) + (b >> np.int32(8))
                out[r, o + 32] = np.uint32(top0 * np.int32(8192))
                out[r, o + 33] = np.uint32(top1 * np.int32(8192))
        return out
    return split


@_jit(parallel=True, fastmath=_NO_FUSE)
def matvec_packed_int(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                      flat: np.ndarray, high: np.ndarray | None, kind: int, zero: float,
                      xp: np.ndarray, dx: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """out (T, tiles*LANES) = x @ W.T for a packed W: 8-bit (int8 ``codes``), 4-bit
    (uint8 ``codes``, ``high`` None) or 5-bit (``high`` its plane of high bits), and
    ``x`` given by :func:`quantize_rows` as (xp, dx, xs), 8- or 16-bit codes; the other
    arguments as in :func:`.matvec_float.matvec_q4_f32` (``halves`` unused: the tails read
    float16 scales through ``blocks``). One compiled kernel per code width (numba
    specialises on ``codes``' and ``high``'s types). Rows go in groups of 8 and 4
    (AVX-512), pairs, then a single row, each group in a loop of its own: pairs in the
    groups' loop ran up to 10% slower at B=2 (the loop then held three inlined dots). A
    row's result is the same bits in any group."""
    rows = dx.shape[0]
    tiles = codes.shape[0] // dx.shape[1]
    xq = split_activations(xp, codes, high)
    for t in prange(tiles):
        accs = np.empty((ROW_GROUP, LANES), dtype=np.float32)
        i = 0
        while ROW_GROUP >= 4 and rows - i >= 4:  # groups of 8, then of 4 (AVX-512)
            if rows - i >= 8:
                _tile_rows(codes, blocks, flat, high, kind, zero, xq, dx, xs, out, accs, t, i,
                           8)
                i += 8
            else:
                _tile_rows(codes, blocks, flat, high, kind, zero, xq, dx, xs, out, accs, t, i,
                           4)
                i += 4
        while rows - i >= 2:
            _tile_rows(codes, blocks, flat, high, kind, zero, xq, dx, xs, out, accs, t, i, 2)
            i += 2
        if i < rows:
            _tile_rows(codes, blocks, flat, high, kind, zero, xq, dx, xs, out, accs, t, i, 1)


@_jit()
def linear_packed_int(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                      flat: np.ndarray, high: np.ndarray | None, kind: int, zero: float,
                      x: np.ndarray, level: np.integer, out: np.ndarray) -> None:
    """:func:`quantize_rows` of the float rows ``x`` (to ``level``'s type, :func:`level`)
    and :func:`matvec_packed_int`, as one call from Python: bitwise the two calls' result."""
    xp, dx, xs = _quantized(x, level)
    matvec_packed_int(codes, blocks, halves, flat, high, kind, zero, xp, dx, xs, out)


# -- prefill: a range of rows on one thread ----------------------------------------------
# A prefill product's threads each take a range of its token rows (CpuBackend._products)
# and run the parallel kernel over all tiles for them, numba set to one thread by the
# caller (the count is per thread). A range of rows is a C-contiguous block of ``xp`` and
# ``out``, so the kernel is the very specialization a decode step compiled (a range of
# tiles, the columns of ``out`` as a strided view, was another: 9-10 s more to compile per
# code width and activation mode); the rows of 8 share an unpacking of the codes either
# way. A build of the kernels without ``parallel`` (prange as a plain loop) ran 2.2-2.4x
# slower on one thread. Called from this compiled wrapper rather than from Python, a
# 2-thread product (Q4_0 1536x576, 138 rows) took 1.05 ms instead of 1.6-1.7 (one thread:
# 1.7-1.9); the count is not set in here, as that keeps numba from caching.


@_jit()
def matvec_packed_int_range(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                            flat: np.ndarray, high: np.ndarray | None, kind: int, zero: float,
                            xp: np.ndarray, dx: np.ndarray, xs: np.ndarray, out: np.ndarray,
                            r0: int, r1: int) -> None:
    """:func:`matvec_packed_int` for rows ``r0:r1`` of ``x`` and ``out``; the caller sets
    numba to one thread."""
    matvec_packed_int(codes, blocks, halves, flat, high, kind, zero, xp[r0:r1], dx[r0:r1],
                      xs[r0:r1], out[r0:r1])
