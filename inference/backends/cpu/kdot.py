"""Decode mat-vec of Q2_K / Q3_K file bytes over integer activations (x86 with AVX2).

The weights stay as the file stores them (:mod:`.raw`, 1.0x the file); the activations
come quantized per group of 32 by :func:`.quantize.quantize_rows`, ``x ~ d_x * q``. Element
``e = half*128 + s*32 + l`` of a 256-block takes its 2 low bits from qs byte
``half*32 + l`` shifted by ``2s`` (Q3_K: its third bit from hmask byte ``l``, bit
``half*4 + s``), so the 32 elements of a chunk ``(half, s)`` are exactly one activation
group, read from 32 consecutive bytes with one shift; elements 0-15 are sub-block ``2c``,
16-31 ``2c+1``, each with one integer scale (Q2_K 0..15, Q3_K -32..31). Per chunk and
activation row, with exact integer sums and one float tail ``acc += sum * (d * d_x)``:

- int16 activations: codes (Q2_K 0..3, Q3_K -4..3) times their scale as int16
  (``vpmullw``), ``vpmaddwd`` with the 32 activation codes. Q3_K widens its code bytes in
  element order; Q2_K cuts its codes straight out of the qs bytes read as 16-bit words
  (lane i: bytes 2i and 2i+1), so its activations are reordered to match once per call
  (:func:`_even_odd`).
- int8 activations: ``vpmaddubsw`` (unsigned codes x int8 activations, element order)
  then ``vpmaddwd`` with the chunk's two scales. Q3_K's codes are taken as 0..7 here.

Offsets meet the activations only through their sums over each 16, ``x16 = d_x * sum q``
(:func:`_sums16`, once per call): Q2_K's ``-dmin * m_j`` and, with int8, Q3_K's ``-4 * d
* sc_j`` add ``-mult * sum_j o_j * x16_j`` per block. The result is ``W @ (d_x * q)`` up to
float32 rounding of the tails. A row's result does not depend on the batch or the thread
count: each activation row runs the same instructions in the same order, alone or with
others (groups of 4, 2, 1 share one decoding of a block).

Written as LLVM IR (numba ``@intrinsic``) with 256-bit vectors only, so any AVX2 CPU runs
it; a 512-bit instruction LLVM had merged into the loop slowed it on AVX-512 hosts
(:func:`_as_floats`). Measured: docs/cpu-backend.md.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from inference.backends.cpu.features import form, target_has
from inference.backends.cpu.ir import _f32, _i64_of, _item_ptr, _jit, _splat
from inference.backends.cpu.matvec_int import _NO_FUSE, _i8, _i16, _i32, _i64, _maddwd
from inference.backends.cpu.quantize import _quantized
from inference.backends.cpu.raw import Q2_K, Q3_K, ROWS_PER_TASK, _f16_at
from inference.formats.quants import BLOCK_TYPES


def available() -> bool:
    """Whether these kernels compile for numba's target: x86 intrinsics, AVX2 and up
    (elsewhere Q2_K / Q3_K keep the float file-byte kernels of :mod:`.raw`)."""
    return form() in ("avx2", "avx512")


QK = BLOCK_TYPES["Q2_K"].block_size  # elements of a block (Q3_K's too)
SIZE = {c: BLOCK_TYPES[t].type_size for t, c in (("Q2_K", Q2_K), ("Q3_K", Q3_K))}  # bytes
CODES = tuple(SIZE)  # the raw type codes these kernels take
ROWS_PER_READ = 4  # activation rows per pass over a weight row (groups of 4, 2, 1)
_v32i8, _v16i8 = ir.VectorType(_i8, 32), ir.VectorType(_i8, 16)
_v16i16 = ir.VectorType(_i16, 16)
_f = ir.FloatType()
_v8f32 = ir.VectorType(_f, 8)


def _c(ty: ir.Type, v: int) -> ir.Constant:
    return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)


def _load(builder: ir.IRBuilder, ptr: ir.Value, off: int, ty: ir.Type) -> ir.Value:
    """``ty`` at element ``off`` of ``ptr`` (unaligned)."""
    at = builder.gep(ptr, [ir.Constant(_i64, off)]) if off else ptr
    return builder.load(builder.bitcast(at, ty.as_pointer()), align=1)


def _shift_bytes(builder: ir.IRBuilder, v: ir.Value, k: int) -> ir.Value:
    """32 bytes shifted right by ``k`` (left for ``k < 0``) as 16-bit words: bits of the
    neighbouring byte enter at the top (right) or bottom (left); the callers mask them off."""
    if k == 0:
        return v
    w = builder.bitcast(v, _v16i16)
    w = builder.lshr(w, _c(_v16i16, k)) if k > 0 else builder.shl(w, _c(_v16i16, -k))
    return builder.bitcast(w, _v32i8)


def _halves16(builder: ir.IRBuilder, v: ir.Value, signed: bool) -> list[ir.Value]:
    """32 bytes -> bytes 0-15 and 16-31 as two 16-lane int16 vectors."""
    ext = builder.sext if signed else builder.zext
    return [ext(builder.shuffle_vector(v, ir.Constant(_v32i8, None), ir.Constant(
        ir.VectorType(_i32, 16), list(range(h, h + 16)))), _v16i16) for h in (0, 16)]


def _pick(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, idx: list[int]) -> ir.Value:
    """Bytes ``idx`` of the 32 bytes ``a`` then ``b`` (16 each)."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_i32, len(idx)), idx))


def _q3_scales(builder: ir.IRBuilder, b: ir.Value) -> ir.Value:
    """Q3_K's 16 signed 6-bit scales as int8 (raw._q3_k_scale): scale i takes its low
    4 bits from byte 96 + i%8 (low nibble for i < 8), its high 2 from byte 104 + i%4 (bits
    2*(i//4)). Read as the 16 bytes 94-109, so no byte past the block is touched."""
    v = _load(builder, b, 94, _v16i8)
    lo = _pick(builder, v, builder.lshr(v, _c(_v16i8, 4)),
               [2 + i for i in range(8)] + [16 + 2 + i for i in range(8)])
    sh = [builder.lshr(v, _c(_v16i8, 2 * k)) if k else v for k in range(4)]
    hi01 = _pick(builder, sh[0], sh[1], [10 + i % 4 + 16 * (i // 4) for i in range(8)] * 2)
    hi23 = _pick(builder, sh[2], sh[3], [10 + i % 4 + 16 * (i // 4) for i in range(8)] * 2)
    hi = _pick(builder, hi01, hi23, list(range(8)) + list(range(16, 24)))
    six = builder.or_(builder.and_(lo, _c(_v16i8, 15)),
                      builder.shl(builder.and_(hi, _c(_v16i8, 3)), _c(_v16i8, 4)))
    return builder.sub(six, _c(_v16i8, 32))


def _splats(builder: ir.IRBuilder, sc: ir.Value, signed: bool) -> list[ir.Value]:
    """16 byte scales -> each one broadcast to 16 int16 lanes."""
    w = (builder.sext if signed else builder.zext)(sc, _v16i16)
    return [builder.shuffle_vector(w, ir.Constant(_v16i16, None),
                                   ir.Constant(ir.VectorType(_i32, 16), [j] * 16))
            for j in range(16)]


def _chunk_scales(builder: ir.IRBuilder, sc: ir.Value, signed: bool) -> list[ir.Value]:
    """16 byte scales -> for each chunk c, scale 2c in int16 lanes 0-7 and 2c+1 in 8-15."""
    w = (builder.sext if signed else builder.zext)(sc, _v16i16)
    return [builder.shuffle_vector(w, ir.Constant(_v16i16, None), ir.Constant(
        ir.VectorType(_i32, 16), [2 * c] * 8 + [2 * c + 1] * 8)) for c in range(8)]


def _as_floats(builder: ir.IRBuilder, v: ir.Value, signed: bool) -> list[ir.Value]:
    """16 bytes -> 16 float32, as two vectors of 8 (bytes 0-7, 8-15), each widened from its
    own 8 bytes: as one 16-lane widening LLVM emitted a 512-bit instruction on AVX-512
    hosts, which halves the vector ports' throughput for the whole loop (Q3_K int8, 4 rows:
    17 -> 29 Gweights/s without it)."""
    out = []
    for h in (0, 8):
        part = builder.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(
            ir.VectorType(_i32, 8), list(range(h, h + 8))))
        wide = (builder.sext if signed else builder.zext)(part, ir.VectorType(_i32, 8))
        out.append((builder.sitofp if signed else builder.uitofp)(wide, _v8f32))
    return out


def _muladd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """``a * b + c`` (8 float32): one fused multiply-add where the target has FMA (every
    AVX2 CPU but a few), else a multiply and an add. Either way the same for every row."""
    if not target_has("fma"):
        return builder.fadd(builder.fmul(a, b), c)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_v8f32, [_v8f32] * 3), "llvm.fma.v8f32")
    return builder.call(fma, [a, b, c])


def _make_block(nrows: int):  # type: ignore[no-untyped-def]
    """An intrinsic ``(raw, r, blk, d, dmin, xp, dx, x16, i0, acc)``: for activation rows
    ``i0 + k``, k < ``nrows``, ``acc[8k:8k+8] += `` the 8 lane partial sums of block
    ``blk`` of weight row ``raw[r]`` dotted with the activation codes ``xp`` (int8 or
    int16), their group scales ``dx`` and per-16 sums ``x16``; the block's scales ``d``
    and ``dmin`` as float32 for Q2_K, ``dmin`` None for Q3_K (``x16`` then read only with
    int8 activations). ``xp`` of int16 Q2_K in :func:`_even_odd`'s order."""

    @intrinsic
    def block(typingctx, raw, r, blk, d, dmin, xp, dx, x16, i0, acc):  # type: ignore
        sig = types.void(raw, r, blk, d, dmin, xp, dx, x16, i0, acc)
        narrow = xp.dtype == types.int8
        q2 = not isinstance(dmin, types.NoneType)
        code = Q2_K if q2 else Q3_K

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            rty, _, _, _, _, xty, dty, sty, _, aty = signature.args
            rarr, cr, cblk, fd, fdmin, xarr, darr, sarr, ci0, aarr = args
            maddwd = _maddwd(builder)
            maddubs = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_v16i16, [_v32i8, _v32i8]),
                "llvm.x86.avx2.pmadd.ub.sw")
            r, blk, i0 = (_i64_of(builder, v) for v in (cr, cblk, ci0))
            b = _item_ptr(context, builder, rty, rarr,
                          [r, builder.mul(blk, ir.Constant(_i64, SIZE[code]))])
            rows = [builder.add(i0, ir.Constant(_i64, k)) for k in range(nrows)]
            xs = [_item_ptr(context, builder, xty, xarr,
                            [i, builder.mul(blk, ir.Constant(_i64, QK))]) for i in rows]
            ds = [_item_ptr(context, builder, dty, darr,
                            [i, builder.mul(blk, ir.Constant(_i64, QK // 32))]) for i in rows]
            accp = [_item_ptr(context, builder, aty, aarr, [ir.Constant(_i64, 8 * k)])
                    for k in range(nrows)]
            accs = [_load(builder, p, 0, _v8f32) for p in accp]
            # Offsets that meet the activations only through their per-16 sums x16_j:
            # Q2_K's -dmin * m_j; with 8-bit activations Q3_K's codes are taken as 0..7
            # (vpmaddubsw's operand is unsigned), so its -4 * d * sc_j.
            if q2:
                sc = _load(builder, b, 0, _v16i8)  # scale j: low nibble; min: high nibble
                sc, offs, mult = (builder.and_(sc, _c(_v16i8, 15)), _as_floats(
                    builder, builder.lshr(sc, _c(_v16i8, 4)), False), fdmin)
            else:
                sc = _q3_scales(builder, b)
                offs, mult = _as_floats(builder, sc, True), builder.fmul(fd, ir.Constant(_f, 4.0))
                hm = _load(builder, b, 0, _v32i8)
            if q2 or narrow:
                neg = _splat(builder, builder.fneg(mult), 8)
                for k, i in enumerate(rows):
                    s16 = _item_ptr(context, builder, sty, sarr,
                                    [i, builder.mul(blk, ir.Constant(_i64, QK // 16))])
                    ox = _muladd(builder, offs[1], _load(builder, s16, 8, _v8f32),
                                 builder.fmul(offs[0], _load(builder, s16, 0, _v8f32)))
                    accs[k] = _muladd(builder, ox, neg, accs[k])
            # Per chunk c: scale 2c in int16 lanes 0-7, 2c+1 in 8-15 (q2 or narrow), else
            # each scale broadcast alone.
            scales = (_chunk_scales(builder, sc, signed=not q2) if q2 or narrow
                      else _splats(builder, sc, True))
            qs0 = 16 if q2 else 32
            three = _c(_v16i16, 3)
            for half in range(2):
                qs = _load(builder, b, qs0 + 32 * half, _v32i8)
                for s in range(4):
                    e0, g = half * 128 + s * 32, half * 4 + s
                    if narrow:
                        # Unsigned byte codes x int8 activations, in element order: lane i
                        # of vpmaddubsw's sum holds elements 2i, 2i+1 (sub-block 2c for
                        # i < 8), then vpmaddwd with the chunk's scales.
                        codes = builder.and_(_shift_bytes(builder, qs, 2 * s), _c(_v32i8, 3))
                        if not q2:
                            codes = builder.or_(codes, builder.and_(
                                _shift_bytes(builder, hm, half * 4 + s - 2), _c(_v32i8, 4)))
                        for k in range(nrows):
                            p16 = builder.call(maddubs, [codes, _load(builder, xs[k], e0,
                                                                      _v32i8)])
                            pairs = builder.call(maddwd, [p16, scales[g]])
                            scale = builder.fmul(fd, _load(builder, ds[k], g, _f))
                            accs[k] = _muladd(builder, builder.sitofp(pairs, _v8f32),
                                              _splat(builder, scale, 8), accs[k])
                        continue
                    if q2:
                        # The 2-bit codes straight out of the words: lane i holds bytes 2i
                        # (even) and 2i+1 (odd), sub-block 2c for i < 8, 2c+1 above; the
                        # activations come in that order (_even_odd).
                        w = builder.bitcast(qs, _v16i16)
                        words = [builder.mul(builder.and_(builder.lshr(w, _c(_v16i16, sh)),
                                                          three) if sh else
                                             builder.and_(w, three), scales[g])
                                 for sh in (2 * s, 2 * s + 8)]
                    else:
                        # Bit half*4+s of hmask as 4 over the 2 low bits, minus 4; bytes
                        # 0-15 are sub-block j, 16-31 j+1, widened in element order.
                        codes = builder.sub(builder.or_(
                            builder.and_(_shift_bytes(builder, qs, 2 * s), _c(_v32i8, 3)),
                            builder.and_(_shift_bytes(builder, hm, half * 4 + s - 2),
                                         _c(_v32i8, 4))), _c(_v32i8, 4))
                        j = half * 8 + 2 * s
                        words = [builder.mul(w, scales[j + h]) for h, w in
                                 enumerate(_halves16(builder, codes, signed=True))]
                    for k in range(nrows):
                        xv = [_load(builder, xs[k], e0 + 16 * h, _v16i16) for h in (0, 1)]
                        pairs = builder.add(builder.call(maddwd, [words[0], xv[0]]),
                                            builder.call(maddwd, [words[1], xv[1]]))
                        scale = builder.fmul(fd, _load(builder, ds[k], g, _f))
                        accs[k] = _muladd(builder, builder.sitofp(pairs, _v8f32),
                                          _splat(builder, scale, 8), accs[k])
            for p, a in zip(accp, accs, strict=True):
                builder.store(a, builder.bitcast(p, _v8f32.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return block


_block4, _block2, _block1 = (_make_block(n) for n in (4, 2, 1))


@_jit(fastmath=False)
def _even_odd(xp: np.ndarray) -> np.ndarray:
    """Each group of 32 activation codes reordered as its even-indexed codes, then its odd
    ones: the order of the kernel's code words (lane i holds codes 2i and 2i+1)."""
    out = np.empty_like(xp)
    for i in range(xp.shape[0]):
        for g0 in range(0, xp.shape[1], 32):
            for j in range(16):
                out[i, g0 + j] = xp[i, g0 + 2 * j]
                out[i, g0 + 16 + j] = xp[i, g0 + 2 * j + 1]
    return out


@_jit(fastmath=False)
def _sums16(xp: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """``d_x * sum q`` over each 16 activations (T, K/16) float32: Q2_K's offset term."""
    out = np.empty((xp.shape[0], xp.shape[1] // 16), dtype=np.float32)
    for i in range(xp.shape[0]):
        for j in range(out.shape[1]):
            total = np.int32(0)
            for e in range(16 * j, 16 * j + 16):
                total += np.int32(xp[i, e])
            out[i, j] = dx[i, j // 2] * _f32(total)
    return out


@_jit(inline="always")
def _row(raw: np.ndarray, r: int, ts: int, d_at: int, dmin_at: int | None, xp: np.ndarray,
         dx: np.ndarray, x16: np.ndarray, out: np.ndarray, acc: np.ndarray) -> None:
    """out[:, r] for one weight row: blocks of ``ts`` bytes, ``d`` at byte ``d_at`` of each,
    ``dmin`` at ``dmin_at`` (Q2_K) or None (Q3_K); activation rows in groups of 4, 2, 1."""
    row = raw[r]
    t = xp.shape[0]
    i0 = 0
    while i0 < t:
        n = 4 if t - i0 >= 4 else (2 if t - i0 >= 2 else 1)
        acc[:] = 0.0
        for blk in range(raw.shape[1] // ts):
            d = _f16_at(row, blk * ts + d_at)
            dmin = None if dmin_at is None else _f16_at(row, blk * ts + dmin_at)
            if n == 4:
                _block4(raw, r, blk, d, dmin, xp, dx, x16, i0, acc)
            elif n == 2:
                _block2(raw, r, blk, d, dmin, xp, dx, x16, i0, acc)
            else:
                _block1(raw, r, blk, d, dmin, xp, dx, x16, i0, acc)
        for k in range(n):  # lanes summed in one fixed order
            s = _f32(0.0)
            for lane in range(8):
                s += acc[8 * k + lane]
            out[i0 + k, r] = s
        i0 += n


# Not cached on its own: with both this kernel and :func:`linear` (which compiles it in)
# in numba's cache, a process that loaded both crashed (segfault, seen twice; the parallel
# region's code is in both cache entries). The app calls only :func:`linear`.
@_jit(parallel=True, fastmath=_NO_FUSE, cache=False)
def matvec(raw: np.ndarray, code: int, xp: np.ndarray, dx: np.ndarray, x16: np.ndarray,
           out: np.ndarray) -> None:
    """out (T, rows) = x @ W.T for W as Q2_K/Q3_K file bytes (``raw`` (rows, row_bytes)
    uint8, ``code`` of :mod:`.raw`) and ``x`` given by :func:`.quantize.quantize_rows`
    as (xp, dx) and :func:`_sums16` (``x16``). Parallel over tasks of ROWS_PER_TASK rows."""
    rows = raw.shape[0]
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        acc = np.empty(8 * ROWS_PER_READ, dtype=np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            # Literals (SIZE's values): numba prunes _row's dmin branch only for literals.
            if code == Q2_K:
                _row(raw, r, 84, 80, 82, xp, dx, x16, out, acc)
            else:
                _row(raw, r, 110, 108, None, xp, dx, x16, out, acc)


@_jit()
def linear(raw: np.ndarray, code: int, x: np.ndarray, level: np.integer,
           out: np.ndarray) -> None:
    """The float rows ``x`` quantized (to ``level``'s type, :func:`.quantize.level`) and
    :func:`matvec`, as one call from Python writing ``out`` (a captured step replays it)."""
    xp, dx, _ = _quantized(x, level)
    x16 = _sums16(xp, dx)
    wide = code == Q2_K and xp.itemsize == 2  # int16 Q2_K: even/odd order (_block)
    matvec(raw, code, _even_odd(xp) if wide else xp, dx, x16, out)
