"""Decode attention on the cpu backend: one query token per head against a KV cache held
in float32 or float16.

A float16 cache is stored as its uint16 bits (numba has no float16 type on the CPU):
reads widen through :func:`.ir._half` (one ``vcvtph2ps`` per 16 values with
F16C), writes round to nearest even through :func:`half_bits`, the rounding NumPy's
``astype(float16)`` does, so a row a prefill wrote (NumPy) and a row a decode step wrote
(here) hold the same bits.

A query's arithmetic depends only on its own row, keys and key count, never on the
other rows of the call or the thread count (the server's batching relies on it). Scores
and the weighted sum go four keys at a time, in LLVM IR where the head size is a multiple
of 16 (:func:`_dots4`, :func:`_axpy4`): one pass over q serves four key rows, whose sums
are reduced together, and the output row is read and written once per four value rows. A
decode step's attention (:func:`attend_rows`) goes out in spans of ``SPAN`` keys, each
span's K and V read from memory once for a kv head's whole group of query heads
(docs/cpu-backend.md, "Decode attention"; figures in docs/benchmarks.md).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from inference.backends.cpu.features import _x86, target_has
from inference.backends.cpu.ir import (
    _NO_REASSOC,
    _at,
    _bits_to_f32,
    _dot8,
    _exp,
    _f32_to_bits,
    _i64_of,
    _item_ptr,
    _jit,
    _splat,
    _sum8,
    _unit,
    _widen,
    half_to_float,
)

_f32 = np.float32
# Keys per unit of a decode step's attention (attend_rows): a span's K and V stay in the
# core's cache while its query heads read them (64 x 64 float32s: 16 KB each).
SPAN = 64


@_jit(fastmath=False)
def half_bits(x: np.float32) -> np.uint16:
    """float32 -> float16 bits, rounded to nearest even (as NumPy rounds), in integer ops
    and one float add (no F16C needed: writes are a row per step, never the hot loop).
    Overflow goes to inf, NaN stays NaN, small values become subnormals or zero."""
    u = np.int64(_f32_to_bits(_f32(x))) & 0xFFFFFFFF
    sign = (u >> 16) & 0x8000
    u &= 0x7FFFFFFF
    if u >= 0x47800000:  # rounds past float16's largest finite value; inf; NaN
        h = 0x7E00 if u > 0x7F800000 else 0x7C00
    elif u < 0x38800000:  # below float16's smallest normal: the float add rounds
        # + 0.5 puts the value's float16 subnormal step at float32's last mantissa bit.
        f = _bits_to_f32(np.int32(u)) + _f32(0.5)
        h = (np.int64(_f32_to_bits(f)) & 0xFFFFFFFF) - 0x3F000000
    else:  # rebias the exponent, round the 13 dropped bits to nearest even
        h = (u - 0x38000000 + 0xFFF + ((u >> 13) & 1)) >> 13
    return np.uint16(h | sign)


def _narrow(x, like):  # type: ignore[no-untyped-def]  # numba only: float32 to like's type
    raise NotImplementedError


@overload(_narrow, inline="always")
def _narrow_ov(x, like):  # type: ignore[no-untyped-def]
    if like == types.uint16:
        return lambda x, like: half_bits(x)
    return lambda x, like: x


@_jit(inline="always")
def _max(m: np.float32, x: np.float32) -> np.float32:
    """A running max, tracked where the scores are made: a max pass of its own over a row
    is a serial chain (LLVM does not vectorise this reduction), 1.1-1.3 ns a key."""
    return x if x > m else m


@_jit(inline="always")
def _exp_sum(ph: np.ndarray, n: int, m: np.float32) -> np.float32:
    """ph[:n] = exp(ph[:n] - m); returns their sum (:func:`_sum8`)."""
    for s in range(n):
        ph[s] = _exp(ph[s] - m)
    return _sum8(ph, n)


@_jit(inline="always")
def _exps(ph: np.ndarray, n: int, m: np.float32, width: int) -> np.float32:
    """ph[:n] = exp(ph[:n] - m), ph[n:width] = 0 (keys the row does not read); returns
    1 / the sum."""
    tot = _exp_sum(ph, n, m)
    for s in range(n, width):
        ph[s] = _f32(0.0)
    return _f32(1.0) / tot


# -- four key rows at a time, as LLVM IR -------------------------------------------------
# Written by hand because numba's loops leave most of the time outside the multiply-adds:
# each of four keys' dot products ended in a horizontal sum of its own (11 shuffles and
# adds), and the weighted sum of values, a store into the output row, was guarded by a
# runtime overlap check per four rows. Here the four sums are reduced together (6
# shuffles, 4 adds) and the output row is known not to overlap the values. Rows of a
# multiple of ``LANES`` elements (head sizes 64, 128, 256); other sizes take the loops.
LANES = 16  # float32s per vector: one AVX-512 register, two AVX2 ones (LLVM splits)
_v16f = ir.VectorType(ir.FloatType(), LANES)


def _lanes(context, builder, aty, arr, idx):  # type: ignore[no-untyped-def]
    """``LANES`` elements of ``arr`` from ``idx`` on, as float32s (uint16: float16 bits)."""
    ptr = _item_ptr(context, builder, aty, arr, idx)
    if aty.dtype == types.uint16:
        vt = ir.VectorType(ir.IntType(16), LANES)
        return half_to_float(builder, builder.load(builder.bitcast(ptr, vt.as_pointer()), align=2))
    return builder.load(builder.bitcast(ptr, _v16f.as_pointer()), align=4)


def _chunks(context, builder, aty, arr):  # type: ignore[no-untyped-def]
    """The count of LANES-element chunks in ``arr``'s last dimension."""
    shape = cgutils.unpack_tuple(builder, context.make_array(aty)(context, builder, arr).shape)
    return builder.udiv(shape[-1], ir.Constant(shape[-1].type, LANES))


def _fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c, rounded the same way in every compiled specialisation: fused where the
    target has FMA (``llvm.fmuladd`` would leave the choice to each compilation, so a
    batch's strided inputs and a lone row's contiguous ones could round differently),
    else a multiply and an add."""
    if _x86() and not target_has("fma"):
        return builder.fadd(builder.fmul(a, b), c)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v16f, [_v16f] * 3),
                                        "llvm.fma.v16f32")
    return builder.call(fn, [a, b, c])


def _four_rows(builder: ir.IRBuilder, s: ir.Value) -> list[ir.Value]:
    """Row indices s, s + 1, s + 2, s + 3 as 64-bit IR values."""
    s = _i64_of(builder, s)
    return [builder.add(s, ir.Constant(ir.IntType(64), r)) for r in range(4)]


def _shuffle(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, lanes: list[int]) -> ir.Value:
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)),
                                                    lanes))


@intrinsic
def _dots4(typingctx, q, k, s):  # type: ignore[no-untyped-def]
    """(q . k[s], q . k[s+1], q . k[s+2], q . k[s+3]): q (d,) float32, k (S, d) float32 or
    float16 bits, C-contiguous, d a multiple of LANES."""
    if q.layout != "C" or k.layout != "C":
        return None
    sig = types.UniTuple(types.float32, 4)(q, k, s)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        qty, kty, _ = signature.args
        qarr, karr, s0 = args
        rows = _four_rows(builder, s0)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_v16f, [0.0] * LANES))
                for _ in range(4)]
        with cgutils.for_range(builder, _chunks(context, builder, qty, qarr)) as loop:
            col = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            qv = _lanes(context, builder, qty, qarr, [col])
            for row, acc in zip(rows, accs, strict=True):
                kv = _lanes(context, builder, kty, karr, [row, col])
                builder.store(_fma(builder, qv, kv, builder.load(acc)), acc)
        a = [builder.load(acc) for acc in accs]
        # Four vectors of 16 partial sums -> one of four groups of 4 -> the four sums.
        half = list(range(8))
        t01 = builder.fadd(_shuffle(builder, a[0], a[1], half + [16 + i for i in half]),
                           _shuffle(builder, a[0], a[1], [8 + i for i in half]
                                    + [24 + i for i in half]))
        t23 = builder.fadd(_shuffle(builder, a[2], a[3], half + [16 + i for i in half]),
                           _shuffle(builder, a[2], a[3], [8 + i for i in half]
                                    + [24 + i for i in half]))
        lo = [g + i for g in (0, 8, 16, 24) for i in range(4)]
        u = builder.fadd(_shuffle(builder, t01, t23, lo), _shuffle(builder, t01, t23,
                                                                    [i + 4 for i in lo]))
        swap2 = [g + i for g in (0, 4, 8, 12) for i in (2, 3, 0, 1)]
        x = builder.fadd(u, _shuffle(builder, u, u, swap2))
        swap1 = [g + i for g in (0, 4, 8, 12) for i in (1, 0, 3, 2)]
        y = builder.fadd(x, _shuffle(builder, x, x, swap1))
        sums = [builder.extract_element(y, ir.Constant(ir.IntType(32), 4 * r))
                for r in range(4)]
        return context.make_tuple(builder, signature.return_type, sums)

    return sig, codegen


@intrinsic
def _axpy4(typingctx, o, v, s, w0, w1, w2, w3):  # type: ignore[no-untyped-def]
    """o += (w0 v[s] + w1 v[s+1]) + (w2 v[s+2] + w3 v[s+3]): o (d,) float32, v (S, d)
    float32 or float16 bits, C-contiguous, d a multiple of LANES; o overlaps no row of v."""
    if o.layout != "C" or v.layout != "C":
        return None
    sig = types.void(o, v, s, w0, w1, w2, w3)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        oty, vty = signature.args[:2]
        oarr, varr, s0 = args[:3]
        rows = _four_rows(builder, s0)
        ws = [_splat(builder, context.cast(builder, w, wty, types.float32), LANES)
              for w, wty in zip(args[3:], signature.args[3:], strict=True)]
        with cgutils.for_range(builder, _chunks(context, builder, oty, oarr)) as loop:
            col = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            vs = [_lanes(context, builder, vty, varr, [r, col]) for r in rows]
            t0 = _fma(builder, ws[1], vs[1], builder.fmul(ws[0], vs[0]))
            t1 = _fma(builder, ws[3], vs[3], builder.fmul(ws[2], vs[2]))
            ptr = builder.bitcast(_item_ptr(context, builder, oty, oarr, [col]),
                                  _v16f.as_pointer())
            builder.store(builder.fadd(builder.load(ptr, align=4), builder.fadd(t0, t1)), ptr,
                          align=4)
        return context.get_dummy_value()

    return sig, codegen


@_jit(inline="always")
def _score4(qrow: np.ndarray, k0: np.ndarray, k: np.ndarray, n0: int, s0: int, s1: int,
            scale: np.float32, ph: np.ndarray, base: int, m: np.float32) -> np.float32:
    """ph[s - base] = scale * key s . qrow for s in [s0, s1), four keys at a time (s0 and
    s1 - s0 multiples of 4), key s read from ``k0`` below ``n0`` (a multiple of 4) and from
    ``k`` from there on. Returns the running max."""
    d = qrow.shape[0]
    wide = d % LANES == 0
    for s in range(s0, s1, 4):
        kk = k0 if s < n0 else k
        if wide:
            a0, a1, a2, a3 = _dots4(qrow, kk, s)
        else:
            r0, r1, r2, r3 = kk[s], kk[s + 1], kk[s + 2], kk[s + 3]
            a0 = a1 = a2 = a3 = _f32(0.0)
            for c in range(d):
                qc = qrow[c]
                a0 += qc * _widen(r0[c])
                a1 += qc * _widen(r1[c])
                a2 += qc * _widen(r2[c])
                a3 += qc * _widen(r3[c])
        a0, a1, a2, a3 = a0 * scale, a1 * scale, a2 * scale, a3 * scale
        j = s - base
        ph[j], ph[j + 1], ph[j + 2], ph[j + 3] = a0, a1, a2, a3
        m = _max(_max(m, a0), _max(_max(a1, a2), a3))
    return m


@_jit(inline="always")
def _sum4(ph: np.ndarray, base: int, inv: np.float32, v0: np.ndarray, v: np.ndarray, n0: int,
          s0: int, s1: int, o: np.ndarray) -> None:
    """o += sum of (ph[s - base] * inv) * value s for s in [s0, s1), four value rows at a
    time (s0 and s1 - s0 multiples of 4; value s from ``v0`` below ``n0``, else ``v``): the
    output row is read and written once per four rows."""
    d = o.shape[0]
    wide = d % LANES == 0
    for s in range(s0, s1, 4):
        vv = v0 if s < n0 else v
        j = s - base
        w0, w1, w2, w3 = ph[j] * inv, ph[j + 1] * inv, ph[j + 2] * inv, ph[j + 3] * inv
        if wide:
            _axpy4(o, vv, s, w0, w1, w2, w3)
            continue
        r0, r1, r2, r3 = vv[s], vv[s + 1], vv[s + 2], vv[s + 3]
        for c in range(d):
            o[c] += ((w0 * _widen(r0[c]) + w1 * _widen(r1[c]))
                     + (w2 * _widen(r2[c]) + w3 * _widen(r3[c])))


@_jit(inline="always")
def _attend_span(qrow: np.ndarray, k0: np.ndarray, v0: np.ndarray, n0: int, k: np.ndarray,
                 v: np.ndarray, a: int, e: int, scale: np.float32, ph: np.ndarray,
                 inv_out: bool, o: np.ndarray) -> tuple[np.float32, np.float32]:
    """One query row against keys/values ``[a, e)`` (a a multiple of 4), those below ``n0``
    (a multiple of 4) read from ``k0``/``v0`` (rows another sequence's buffers hold with
    the same bits: a copied prompt prefix), the rest from ``k``/``v``; ``ph`` (>= e - a)
    holds the scores. o = the exp-weighted sum of the values, normalised when
    ``inv_out``; returns (max score, sum of exps). Keys go in groups of four from ``a``
    and a tail, so the arithmetic does not depend on where ``n0`` falls."""
    d = qrow.shape[0]
    e4 = a + (e - a) // 4 * 4
    m = _score4(qrow, k0, k, n0, a, e4, scale, ph, a, _f32(-3.0e38))
    for s in range(e4, e):
        ph[s - a] = _dot8(qrow, k[s]) * scale
        m = _max(m, ph[s - a])
    tot = _exp_sum(ph, e - a, m)
    inv = _f32(1.0) / tot if inv_out else _f32(1.0)
    o[:] = 0.0
    _sum4(ph, a, inv, v0, v, n0, a, e4, o)
    for s in range(e4, e):
        w = ph[s - a] * inv
        vrow = v[s]
        for c in range(d):
            o[c] += w * _widen(vrow[c])
    return m, tot


@_jit(inline="always")
def _attend_one(qrow: np.ndarray, k: np.ndarray, v: np.ndarray, n: int, scale: np.float32,
                ph: np.ndarray, o: np.ndarray) -> None:
    """o = softmax(scale * k[:n] @ qrow) @ v[:n] for one query row against one kv head's
    rows (k, v (S, d), float32 or float16 bits); ``ph`` (>= n) holds the scores."""
    _attend_span(qrow, k, v, 0, k, v, 0, n, scale, ph, True, o)


@_jit(parallel=True)
def attend_decode(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_keys: int, scale: float,
                  out: np.ndarray) -> None:
    """One query token per head, seeing the first n_keys keys: q (hq, d), k/v (hk, S, d)
    C-contiguous (the whole cache buffer; only the first n_keys rows are read).
    Grouped-query: head h reads kv head h // (hq/hk). Parallel over heads (decode has no
    BLAS call around it, so the numba pool has the cores to itself)."""
    hq, d = q.shape
    group = hq // k.shape[0]
    scale = _f32(scale)
    p = np.empty((hq, n_keys), dtype=np.float32)  # one allocation, outside the threads
    for h in prange(hq):
        _attend_one(q[h], k[h // group], v[h // group], n_keys, scale, p[h], out[h])


@_jit(parallel=True)
def attend_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int, scale: float,
                   out: np.ndarray, parts: int) -> None:
    """Causal attention of ``t`` new tokens at positions ``offset`` .. ``offset + t - 1``:
    q (hq, t, d) float32, k/v (hk, S, d) the cache buffers (float32 or float16 bits,
    C-contiguous; rows up to offset + t are read), out (t, hq, d). Grouped-query as
    :func:`attend_decode`.

    A unit of work is four query rows of one head; their scores go four rows to one key
    (each key row loaded once for the four), and p.v four rows by four keys. Each row sees
    only its own keys: no masked half of a square of scores. A row's arithmetic depends
    only on its place in its block of four, counted from the first new token, never on
    the split between threads. The tail of fewer than four rows goes row by row
    (:func:`_attend_one`). The units go out in ``parts`` contiguous runs (one per numba
    thread: the count is an argument, as reading it in here keeps numba from caching),
    blocks from the two ends of each head in turn, so every run holds about its share of
    the work."""
    hq, t, d = q.shape
    blocks = (t + 3) // 4
    units = hq * blocks
    parts = min(parts, units)
    for p in prange(parts):
        _prefill_units(q, k, v, offset, _f32(scale), out, units * p // parts,
                       units * (p + 1) // parts)


@_jit()
def _prefill_units(q: np.ndarray, k: np.ndarray, v: np.ndarray, offset: int,
                   scale: np.float32, out: np.ndarray, u0: int, u1: int) -> None:
    """Units ``[u0, u1)`` of :func:`attend_prefill`. A function of its own, not inlined
    into the ``prange`` body: inlined, the kernel took twice as long to compile cold (15.4
    against 7.8 s for float32 caches) and ran no faster."""
    hq, t, d = q.shape
    group = hq // k.shape[0]
    blocks = (t + 3) // 4
    ph = np.empty((4, offset + t), dtype=np.float32)
    for u in range(u0, u1):
        h, i = u // blocks, u % blocks
        # Blocks from the two ends of the head in turn: about even work per run of units.
        r = 4 * (i // 2 if i % 2 == 0 else blocks - 1 - i // 2)
        kk, vv = k[h // group], v[h // group]
        if r + 4 > t:
            for j in range(r, t):
                _attend_one(q[h, j], kk, vv, offset + j + 1, scale, ph[0], out[j, h])
            continue
        q0, q1, q2, q3 = q[h, r], q[h, r + 1], q[h, r + 2], q[h, r + 3]
        p0, p1, p2, p3 = ph[0], ph[1], ph[2], ph[3]
        m0 = m1 = m2 = m3 = _f32(-3.0e38)
        last = offset + r  # row j reads keys 0 .. last + j
        for s in range(last + 4):
            krow = kk[s]
            a0 = a1 = a2 = a3 = _f32(0.0)
            for c in range(d):
                kc = _widen(krow[c])
                a0 += q0[c] * kc
                a1 += q1[c] * kc
                a2 += q2[c] * kc
                a3 += q3[c] * kc
            a0, a1, a2, a3 = a0 * scale, a1 * scale, a2 * scale, a3 * scale
            p0[s], p1[s], p2[s], p3[s] = a0, a1, a2, a3
            # Selects, not branches: a row's max takes only the keys it reads.
            m0 = _max(m0, a0) if s <= last else m0
            m1 = _max(m1, a1) if s <= last + 1 else m1
            m2 = _max(m2, a2) if s <= last + 2 else m2
            m3 = _max(m3, a3)
        n = last + 4
        i0 = _exps(p0, last + 1, m0, n)
        i1 = _exps(p1, last + 2, m1, n)
        i2 = _exps(p2, last + 3, m2, n)
        i3 = _exps(p3, n, m3, n)
        o0, o1, o2, o3 = out[r, h], out[r + 1, h], out[r + 2, h], out[r + 3, h]
        o0[:] = 0.0
        o1[:] = 0.0
        o2[:] = 0.0
        o3[:] = 0.0
        # p.v four rows by four keys: each value row loaded once for the four rows, each
        # output row read and written once per four keys.
        n4 = n - n % 4
        for s in range(0, n4, 4):
            v0, v1, v2, v3 = vv[s], vv[s + 1], vv[s + 2], vv[s + 3]
            w00, w01, w02, w03 = p0[s] * i0, p0[s + 1] * i0, p0[s + 2] * i0, p0[s + 3] * i0
            w10, w11, w12, w13 = p1[s] * i1, p1[s + 1] * i1, p1[s + 2] * i1, p1[s + 3] * i1
            w20, w21, w22, w23 = p2[s] * i2, p2[s + 1] * i2, p2[s + 2] * i2, p2[s + 3] * i2
            w30, w31, w32, w33 = p3[s] * i3, p3[s + 1] * i3, p3[s + 2] * i3, p3[s + 3] * i3
            for c in range(d):
                x0, x1 = _widen(v0[c]), _widen(v1[c])
                x2, x3 = _widen(v2[c]), _widen(v3[c])
                o0[c] += (w00 * x0 + w01 * x1) + (w02 * x2 + w03 * x3)
                o1[c] += (w10 * x0 + w11 * x1) + (w12 * x2 + w13 * x3)
                o2[c] += (w20 * x0 + w21 * x1) + (w22 * x2 + w23 * x3)
                o3[c] += (w30 * x0 + w31 * x1) + (w32 * x2 + w33 * x3)
        for s in range(n4, n):
            vr = vv[s]
            w0, w1, w2, w3 = p0[s] * i0, p1[s] * i1, p2[s] * i2, p3[s] * i3
            for c in range(d):
                x = _widen(vr[c])
                o0[c] += w0 * x
                o1[c] += w1 * x
                o2[c] += w2 * x
                o3[c] += w3 * x


# No reassociation: a specialisation compiled in this process and one loaded from numba's
# cache must give the same bits (a lone row and a batch may each take either); with it
# they did not (docs/cpu-backend.md). Sums go in a fixed order instead (_sum8, _dot8).
@_jit(parallel=True, fastmath=_NO_REASSOC)
def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                offsets: np.ndarray, kaddr: np.ndarray, vaddr: np.ndarray, caps: np.ndarray,
                src: np.ndarray, shared: np.ndarray, scale: float, out: np.ndarray,
                like: np.ndarray) -> None:
    """One decode step of ``b`` sequences, each with its own cache: row i of q (b, hq, d) and
    k/v (b, hk, d) is sequence i's token at position ``offsets[i]`` (rows of d of unit
    stride, strided or not: views of one stacked q/k/v product). NeoX RoPE (tables
    (P, d/2)) on q and k, k/v written to row ``offsets[i]`` of sequence i's cache buffers
    ((hk, caps[i], d) of ``like``'s type — float32, or uint16 for float16 bits —
    C-contiguous, at addresses kaddr[i] / vaddr[i]), then each query attends to its
    sequence's first offsets[i] + 1 keys. Sequence i reads its first ``shared[i]``
    keys/values (a multiple of 4, at most offsets[i]) from sequence ``src[i]``'s buffers,
    which hold them with the same bits (a prompt prefix copied from one source; ``src[i]
    = i``, ``shared[i] = 0`` for none): the sequences after the first then find those rows
    in the core's cache instead of reading copies from memory. A row's arithmetic does
    not depend on the other rows, nor on the thread count.

    Work goes out by (sequence, kv head, span of ``SPAN`` keys): a unit scores the span
    for its kv head's group of query heads one after another (the span's K and V rows,
    16 KB each at 64 keys of 64 float32s, come from memory once and from the core's cache
    for the other heads of the group), keeping each head's max, sum of exps and weighted
    sum of values; the unit of a row's last span first writes the new K/V row (no other
    unit reads it). A second pass merges a row's spans (:func:`_merge_spans`). Going out
    by (sequence, query head) instead, each head read all of its sequence's keys: at 2,048
    keys a kv head's K and V (1 MB) no longer stayed cached between the heads of its
    group (docs/cpu-backend.md, "Decode attention")."""
    b, hq, d = q.shape
    hk = k.shape[1]
    half = d // 2
    group = hq // hk
    scale = _f32(scale)
    # Units (row, kv head, span), rows in order; first[i]: row i's first unit.
    spans = (offsets + SPAN) // SPAN  # keys 0 .. offsets[i]: offsets[i] + 1 of them
    first = np.zeros(b + 1, dtype=np.int64)
    for i in range(b):
        first[i + 1] = first[i] + hk * spans[i]
    most = spans.max()
    pm = np.empty((b * hq, most), dtype=np.float32)  # each span's max score,
    pl = np.empty((b * hq, most), dtype=np.float32)  # sum of exps,
    po = np.empty((b * hq, most, d), dtype=np.float32)  # and weighted sum of values
    ph = np.empty((first[b], SPAN), dtype=np.float32)  # a unit's scores
    qs = np.empty((first[b], d), dtype=np.float32)  # and rotated query
    for u in prange(first[b]):
        i = np.searchsorted(first, u, side="right") - 1
        kv, c = (u - first[i]) // spans[i], (u - first[i]) % spans[i]
        pos = offsets[i]
        kc = numba.carray(_at(kaddr[i], like), (hk, caps[i], d))
        vc = numba.carray(_at(vaddr[i], like), (hk, caps[i], d))
        if c == spans[i] - 1:  # RoPE on k; k and v into the caches
            krow, vrow = _unit(k[i, kv], qs), _unit(v[i, kv], qs)
            for x in range(half):
                a, b2 = krow[x], krow[x + half]
                kc[kv, pos, x] = _narrow(a * cos[pos, x] - b2 * sin[pos, x], like[0])
                kc[kv, pos, x + half] = _narrow(b2 * cos[pos, x] + a * sin[pos, x], like[0])
            for x in range(d):
                vc[kv, pos, x] = _narrow(vrow[x], like[0])
        o = src[i]
        k0 = numba.carray(_at(kaddr[o], like), (hk, caps[o], d))
        v0 = numba.carray(_at(vaddr[o], like), (hk, caps[o], d))
        start, end = c * SPAN, min((c + 1) * SPAN, pos + 1)
        qrow = qs[u]
        for h in range(kv * group, (kv + 1) * group):
            qin = _unit(q[i, h], qs)
            for x in range(half):
                a, b2 = qin[x], qin[x + half]
                qrow[x] = a * cos[pos, x] - b2 * sin[pos, x]
                qrow[x + half] = b2 * cos[pos, x] + a * sin[pos, x]
            j = i * hq + h
            pm[j, c], pl[j, c] = _attend_span(qrow, k0[kv], v0[kv], shared[i], kc[kv], vc[kv],
                                              start, end, scale, ph[u], False, po[j, c])
    for j in prange(b * hq):
        _merge_spans(pm[j], pl[j], po[j], spans[j // hq], out[j // hq, j % hq])


@_jit(fastmath=False)
def _merge_spans(pm: np.ndarray, pl: np.ndarray, po: np.ndarray, n: int,
                 o: np.ndarray) -> None:
    """o = the softmax-weighted sum over ``n`` spans from each span's max score ``pm``, sum
    of exps ``pl`` and exp-weighted sum of values ``po`` (rescaled to the largest max).
    Strict float arithmetic, compiled on its own: inlined into the fast-math kernel, its
    multiply-adds were fused or not as each compiled specialisation chose, and a row of a
    batch (strided q/k/v) differed by one ulp from the row alone (contiguous) in some
    compilations."""
    m = pm[0]
    for c in range(1, n):
        m = _max(m, pm[c])
    tot = _f32(0.0)
    for c in range(n):
        w = _exp(pm[c] - m)
        pm[c] = w
        tot += w * pl[c]
    inv = _f32(1.0) / tot
    o[:] = 0.0
    for c in range(n):
        w = pm[c] * inv
        span = po[c]
        for x in range(o.shape[0]):
            o[x] += w * span[x]
