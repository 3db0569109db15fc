"""Decode attention on the cpu backend: one query token per head against a KV cache held
in float32 or float16.

A float16 cache is stored as its uint16 bits (numba has no float16 type on the CPU):
reads widen through :func:`cpu_kernels._half` (one ``vcvtph2ps`` per 16 values with
F16C), writes round to nearest even through :func:`half_bits`, the rounding NumPy's
``astype(float16)`` does, so a row a prefill wrote (NumPy) and a row a decode step wrote
(here) hold the same bits.

Each query's scores, softmax and weighted sum are :func:`_attend_one`'s arithmetic
whatever else runs in the call (the server's batching relies on a row not depending on
the other rows). Scores and the weighted sum go four keys at a time: one pass over q
serves four key rows, and the output row is read and written once per four value rows
(one key at a time, each key ended in a horizontal add and a store of ``o``). From memory,
decode attention reads a float32 cache at about the machine's bandwidth; a float16 cache
reads half the bytes (docs/cpu-backend.md, "Decode attention";
``scripts/bench_decode_attention.py``).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from inference.backends.cpu_kernels import _at, _bits_to_f32, _exp, _f32_to_bits, _half, _jit, _unit

_f32 = np.float32


def _widen(x):  # type: ignore[no-untyped-def]  # numba only: a cache element as float32
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_ov(x):  # type: ignore[no-untyped-def]
    if x == types.uint16:
        return lambda x: _half(x)
    return lambda x: x


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
def _exps(ph: np.ndarray, n: int, m: np.float32, width: int) -> np.float32:
    """ph[:n] = exp(ph[:n] - m), ph[n:width] = 0 (keys the row does not read); returns
    1 / the sum."""
    tot = _f32(0.0)
    for s in range(n):
        e = _exp(ph[s] - m)
        ph[s] = e
        tot += e
    for s in range(n, width):
        ph[s] = _f32(0.0)
    return _f32(1.0) / tot


@_jit(inline="always")
def _score4(qrow: np.ndarray, k: np.ndarray, s0: int, s1: int, scale: np.float32,
            ph: np.ndarray, m: np.float32) -> np.float32:
    """ph[s] = scale * k[s] . qrow for s in [s0, s1), four keys at a time (s1 - s0 a
    multiple of 4): one pass over q serves four key rows. Returns the running max."""
    d = qrow.shape[0]
    for s in range(s0, s1, 4):
        k0, k1, k2, k3 = k[s], k[s + 1], k[s + 2], k[s + 3]
        a0 = a1 = a2 = a3 = _f32(0.0)
        for c in range(d):
            qc = qrow[c]
            a0 += qc * _widen(k0[c])
            a1 += qc * _widen(k1[c])
            a2 += qc * _widen(k2[c])
            a3 += qc * _widen(k3[c])
        a0, a1, a2, a3 = a0 * scale, a1 * scale, a2 * scale, a3 * scale
        ph[s], ph[s + 1], ph[s + 2], ph[s + 3] = a0, a1, a2, a3
        m = _max(_max(m, a0), _max(_max(a1, a2), a3))
    return m


@_jit(inline="always")
def _sum4(ph: np.ndarray, inv: np.float32, v: np.ndarray, s0: int, s1: int,
          o: np.ndarray) -> None:
    """o += sum of (ph[s] * inv) * v[s] for s in [s0, s1), four value rows at a time (s1 - s0
    a multiple of 4): the output row is read and written once per four value rows."""
    d = o.shape[0]
    for s in range(s0, s1, 4):
        w0, w1, w2, w3 = ph[s] * inv, ph[s + 1] * inv, ph[s + 2] * inv, ph[s + 3] * inv
        v0, v1, v2, v3 = v[s], v[s + 1], v[s + 2], v[s + 3]
        for c in range(d):
            o[c] += ((w0 * _widen(v0[c]) + w1 * _widen(v1[c]))
                     + (w2 * _widen(v2[c]) + w3 * _widen(v3[c])))


@_jit(inline="always")
def _attend_two(qrow: np.ndarray, k0: np.ndarray, v0: np.ndarray, n0: int, k: np.ndarray,
                v: np.ndarray, n: int, scale: np.float32, ph: np.ndarray,
                o: np.ndarray) -> None:
    """:func:`_attend_one` with keys/values ``[0, n0)`` read from ``k0``/``v0`` and the rest
    from ``k``/``v`` (n0 a multiple of 4, at most n rounded down to one): rows another
    sequence's buffers hold with the same bits (a copied prompt prefix), read once for
    every sequence of a batched step. The four-key groups, the running max and every sum
    go in the same order as over one buffer, so the result is the same bits."""
    d = qrow.shape[0]
    n4 = n - n % 4
    m = _score4(qrow, k0, 0, n0, scale, ph, _f32(-3.0e38))
    m = _score4(qrow, k, n0, n4, scale, ph, m)
    for s in range(n4, n):
        krow = k[s]
        acc = _f32(0.0)
        for c in range(d):
            acc += qrow[c] * _widen(krow[c])
        ph[s] = acc * scale
        m = _max(m, ph[s])
    inv = _exps(ph, n, m, n)
    o[:] = 0.0
    _sum4(ph, inv, v0, 0, n0, o)
    _sum4(ph, inv, v, n0, n4, o)
    for s in range(n4, n):
        w = ph[s] * inv
        vrow = v[s]
        for c in range(d):
            o[c] += w * _widen(vrow[c])


@_jit(inline="always")
def _attend_one(qrow: np.ndarray, k: np.ndarray, v: np.ndarray, n: int, scale: np.float32,
                ph: np.ndarray, o: np.ndarray) -> None:
    """o = softmax(scale * k[:n] @ qrow) @ v[:n] for one query row against one kv head's
    rows (k, v (S, d), float32 or float16 bits); ``ph`` (>= n) holds the scores."""
    _attend_two(qrow, k, v, 0, k, v, n, scale, ph, o)


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


@_jit(parallel=True)
def attend_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, cos: np.ndarray, sin: np.ndarray,
                offsets: np.ndarray, kaddr: np.ndarray, vaddr: np.ndarray, caps: np.ndarray,
                src: np.ndarray, shared: np.ndarray, scale: float, qr: np.ndarray,
                out: np.ndarray, like: np.ndarray) -> None:
    """One decode step of ``b`` sequences, each with its own cache: row i of q (b, hq, d) and
    k/v (b, hk, d) is sequence i's token at position ``offsets[i]`` (rows of d of unit
    stride, strided or not: views of one stacked q/k/v product). NeoX RoPE (tables
    (P, d/2)) on q and k, k/v written to row ``offsets[i]`` of sequence i's cache buffers
    ((hk, caps[i], d) of ``like``'s type — float32, or uint16 for float16 bits —
    C-contiguous, at addresses kaddr[i] / vaddr[i]), then each query attends to its
    sequence's first offsets[i] + 1 keys; ``qr`` (b * hq, d) holds the rotated queries.
    Sequence i reads its first ``shared[i]`` keys/values (a multiple of 4, at most
    offsets[i]) from sequence ``src[i]``'s buffers, which hold them with the same bits (a
    prompt prefix copied from one source; ``src[i] = i``, ``shared[i] = 0`` for none): the
    sequences after the first then find those rows in the core's cache instead of reading
    copies from memory (:func:`_attend_two`). A row's arithmetic is that of
    :func:`attend_decode` after RoPE and does not depend on the other rows.

    Work goes out by (sequence, query head). Measured against going out by (sequence, kv
    head, part of 256 keys) with each key row loaded once for its group of query heads
    (SmolLM2's 9/3 heads, 30 layers, 230-1000 keys, 2 threads): no faster at any batch
    (float32 reads its cache at ~13 GB/s either way, this VM's memory bandwidth), so the
    simpler split stays."""
    b, hq, d = q.shape
    hk = k.shape[1]
    half = d // 2
    group = hq // hk
    scale = _f32(scale)
    for j in prange(b * hk):  # RoPE on k; k and v into the caches
        i, kv = j // hk, j % hk
        pos = offsets[i]
        kc = numba.carray(_at(kaddr[i], like), (hk, caps[i], d))
        vc = numba.carray(_at(vaddr[i], like), (hk, caps[i], d))
        krow, vrow = _unit(k[i, kv], qr), _unit(v[i, kv], qr)
        for c in range(half):
            a, b2 = krow[c], krow[c + half]
            kc[kv, pos, c] = _narrow(a * cos[pos, c] - b2 * sin[pos, c], like[0])
            kc[kv, pos, c + half] = _narrow(b2 * cos[pos, c] + a * sin[pos, c], like[0])
        for c in range(d):
            vc[kv, pos, c] = _narrow(vrow[c], like[0])
    p = np.empty((b * hq, offsets.max() + 1), dtype=np.float32)
    for j in prange(b * hq):
        i, h = j // hq, j % hq
        kv, pos = h // group, offsets[i]
        kc = numba.carray(_at(kaddr[i], like), (hk, caps[i], d))
        vc = numba.carray(_at(vaddr[i], like), (hk, caps[i], d))
        o = src[i]
        k0 = numba.carray(_at(kaddr[o], like), (hk, caps[o], d))
        v0 = numba.carray(_at(vaddr[o], like), (hk, caps[o], d))
        qrow, qin = qr[j], _unit(q[i, h], qr)
        for c in range(half):
            a, b2 = qin[c], qin[c + half]
            qrow[c] = a * cos[pos, c] - b2 * sin[pos, c]
            qrow[c + half] = b2 * cos[pos, c] + a * sin[pos, c]
        _attend_two(qrow, k0[kv], v0[kv], shared[i], kc[kv], vc[kv], pos + 1, scale, p[j],
                    out[i, h])
