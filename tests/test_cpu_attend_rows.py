"""The cpu backend's fused decode attention (``CpuBackend.attend_rows``: RoPE, the KV
write and attention for every row of a decode step in one kernel call) against the
composite of ops every backend runs (``Backend.attend_rows``), and each row alone."""

from __future__ import annotations

import numpy as np
import pytest

from inference.backends.base import Backend
from inference.backends.cpu import CpuBackend
from inference.kv_cache import KVCache
from tests import early

B = CpuBackend()
HQ, HK, D, LAYERS = 6, 2, 16, 2  # grouped-query: 3 query heads per kv head
KW = {"theta": 10000.0, "freq_factors": None, "scale": D ** -0.5, "window": None,
      "softcap": None}


def _caches(lengths: list[int], seed: int, max_len: int | None = None,
            backend: CpuBackend = B, heads: int = HK, dim: int = D) -> list[KVCache]:
    """One cache per sequence, ``lengths[i]`` tokens already in it (random K/V rows)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        c = KVCache(backend, LAYERS, max_len=max_len)
        for layer in range(LAYERS if n else 0):  # an empty cache has no buffers yet
            k, v = (rng.standard_normal((1, heads, n, dim)).astype(np.float32) for _ in "kv")
            c.update(layer, k, v)
        c.advance(n)
        out.append(c)
    return out


def _step(rows: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((rows, h, 1, D)).astype(np.float32)
                 for h in (HQ, HK, HK))


@pytest.mark.parametrize("lengths", [[5], [1, 7, 300], [0, 3, 256, 255]])
def test_fused_equals_the_composite(lengths):
    q, k, v = _step(len(lengths), 1)
    fused_caches, plain_caches = _caches(lengths, 2), _caches(lengths, 2)
    for layer in range(LAYERS):
        got = B.attend_rows(q, k, v, fused_caches, layer, **KW)
        want = Backend.attend_rows(B, q, k, v, plain_caches, layer, **KW)
        # Same formulas; the composite's kernels may sum in another order: float32 rounding.
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
        for f, p in zip(fused_caches, plain_caches, strict=True):
            n = p.layer_offset(layer) + 1
            np.testing.assert_allclose(f.keys[layer][:, :, :n], p.keys[layer][:, :, :n],
                                       rtol=0, atol=1e-6)
            np.testing.assert_array_equal(f.values[layer][:, :, :n], p.values[layer][:, :, :n])


def test_a_row_alone_is_bitwise_the_row_in_a_batch():
    lengths = [4, 130, 9]
    q, k, v = _step(3, 3)
    batch = B.attend_rows(q, k, v, _caches(lengths, 4), 0, **KW)
    for i, n in enumerate(lengths):
        alone = B.attend_rows(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                              [_caches(lengths, 4)[i]], 0, **KW)
        np.testing.assert_array_equal(alone[0], batch[i])  # the server's exactness
        assert n  # (lengths differ: each row reads its own cache and position)


def test_cache_growth_then_fused():
    c = _caches([256], 5)[0]  # a full 256-row chunk: the write needs a bigger buffer
    assert c.keys[0].shape[2] == 256
    q, k, v = _step(1, 6)
    got = B.attend_rows(q, k, v, [c], 0, **KW)
    assert c.keys[0].shape[2] == 512 and np.isfinite(got).all()


def test_windows_and_softcaps_take_the_composite(monkeypatch):
    called = []
    monkeypatch.setattr(Backend, "attend_rows",
                        lambda self, *a, **kw: called.append(kw) or np.zeros(1))
    q, k, v = _step(1, 7)
    B.attend_rows(q, k, v, _caches([3], 8), 0, **{**KW, "softcap": 50.0})
    B.attend_rows(q, k, v, _caches([4], 8), 0, **{**KW, "window": 4})  # hides key 0
    assert len(called) == 2
    # a window that hides no key from the new token: a full layer's fused call
    B.attend_rows(q, k, v, _caches([3], 8), 0, **{**KW, "window": 4})
    assert len(called) == 2


def test_views_of_one_stacked_product_are_read_in_place():
    """q/k/v as the server's batched step makes them (column views of one q|k|v product,
    rows strided): the bits of contiguous copies, and no copy on the tape."""
    from inference.backends.cpu.replay import Tape

    lengths = [4, 130, 9]
    q, k, v = _step(3, 9)
    qkv = np.concatenate([a.reshape(3, -1) for a in (q, k, v)], axis=1)
    views = []
    at = 0
    for a in (q, k, v):
        n = a.shape[1] * D
        views.append(qkv[:, at:at + n].reshape(a.shape))
        at += n
    assert not views[0].flags.c_contiguous
    want = B.attend_rows(q, k, v, _caches(lengths, 10), 0, **KW)
    caches = _caches(lengths, 10)
    tape = B._tape = Tape(0)
    try:
        got = B.attend_rows(*views, caches, 0, **KW)
    finally:
        B._tape = None
    np.testing.assert_array_equal(got, want)
    assert len(tape.calls) == 1  # the kernel only: no copy of q, k or v


def _copies_of(source: KVCache, rows: list[int], extra: list[int], seed: int) -> list[KVCache]:
    """Caches that copied ``rows[i]`` leading rows of ``source`` and then wrote ``extra[i]``
    rows of their own (random K/V)."""
    rng = np.random.default_rng(seed)
    out = []
    for n, more in zip(rows, extra, strict=True):
        c = KVCache(B, LAYERS)
        assert c.copy_prefix(source, n)
        for layer in range(LAYERS if more else 0):
            k, v = (rng.standard_normal((1, HK, more, D)).astype(np.float32) for _ in "kv")
            c.update(layer, k, v)
        c.advance(more)
        out.append(c)
    return out


def test_a_copied_prefix_is_read_once_and_changes_no_bit(monkeypatch):
    """Sequences that copied a prompt prefix from one source read those rows from the
    first such sequence's buffers (the batch reads the prefix once), with the bits each
    gets alone from its own copy. Rows 0-43 of the source are common to all; the second
    and third copied 64; the fourth copied 43 (read to 40, the key groups' multiple of 4);
    the last copied nothing."""
    from inference.backends.cpu import backend as cpu_backend

    source = _caches([70], 11)[0]
    caches = [*_copies_of(source, [64, 64, 43], [9, 30, 5], 12), _caches([50], 13)[0]]
    chosen = []
    real = cpu_backend._prefix_sources
    monkeypatch.setattr(cpu_backend, "_prefix_sources",
                        lambda cs: chosen.append(real(cs)) or chosen[-1])
    q, k, v = _step(len(caches), 14)
    batch = B.attend_rows(q, k, v, caches, 0, **KW)
    assert chosen == [([0, 0, 0, 3], [0, 64, 40, 0])]
    for i, c in enumerate(_copies_of(source, [64, 64, 43], [9, 30, 5], 12)
                          + _caches([50], 13)):
        alone = B.attend_rows(q[i:i + 1], k[i:i + 1], v[i:i + 1], [c], 0, **KW)
        np.testing.assert_array_equal(alone[0], batch[i])


def test_rows_written_again_are_no_longer_shared():
    """A cache cut back (``trim``) and written again, or made a copy of something else,
    no longer shares the rows it overwrote; copies of copies still do."""
    from inference.kv_cache import shared_rows

    source = _caches([70], 15)[0]
    a, b = _copies_of(source, [64, 48], [6, 0], 16)
    (c,) = _copies_of(b, [40], [3], 17)
    assert shared_rows(a, b) == 48 and shared_rows(a, c) == shared_rows(b, c) == 40
    assert shared_rows(source, a) == 64 and shared_rows(a, a) == 70
    source.trim(20)
    assert shared_rows(source, a) == 20 and shared_rows(a, b) == 48
    (d,) = _copies_of(source, [20], [0], 18)
    assert shared_rows(d, a) == 20
    a.trim(0)
    assert a.copy_prefix(_caches([30], 19)[0], 30)
    assert shared_rows(a, b) == 0 and shared_rows(a, d) == 0


def test_other_head_sizes_and_thread_counts():
    """Head sizes off the 16-lane vectors take the loops; a row's bits do not depend on
    the thread count (the server changes it between steps under load, and a sequence's
    tokens must not)."""
    import numba

    rng = np.random.default_rng(20)
    lengths = [5, 70, 200]  # one, two and four spans of 64 keys
    for d in (24, 64):
        q, k, v = (rng.standard_normal((3, h, 1, d)).astype(np.float32) for h in (HQ, HK, HK))
        kw = {**KW, "scale": d ** -0.5}

        def caches(seed: int, d: int = d) -> list[KVCache]:
            r = np.random.default_rng(seed)
            out = []
            for n in lengths:
                c = KVCache(B, 1)
                c.update(0, *(r.standard_normal((1, HK, n, d)).astype(np.float32)
                              for _ in "kv"))
                c.advance(n)
                out.append(c)
            return out

        want = Backend.attend_rows(B, q, k, v, caches(21), 0, **kw)
        before = numba.get_num_threads()
        try:
            numba.set_num_threads(1)
            one = B.attend_rows(q, k, v, caches(21), 0, **kw)
            numba.set_num_threads(before)
            many = B.attend_rows(q, k, v, caches(21), 0, **kw)
        finally:
            numba.set_num_threads(before)
        np.testing.assert_allclose(one, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
        np.testing.assert_array_equal(one, many)


def test_random_batches_are_bitwise_their_rows_and_views():
    """The server's exactness over random shapes: batches of 1-8 rows with 0-400 cached
    keys (spans of 64 and tails of 1-3 keys), head sizes on and off the vector width,
    grouped heads. Each row alone is the bits of the row in the batch, and strided q/k/v
    (column views of one q|k|v product) the bits of contiguous copies."""
    rng = np.random.default_rng(17)
    for _ in range(12):
        d = int(rng.choice([16, 48, 64, 80]))
        hk = int(rng.integers(1, 3))
        hq = hk * int(rng.integers(1, 4))
        rows = int(rng.integers(1, 9))
        lengths = [int(n) for n in rng.integers(0, 400, rows)]
        kw = {**KW, "scale": d ** -0.5}
        qkv = rng.standard_normal((rows, (hq + 2 * hk) * d)).astype(np.float32)
        cuts = np.cumsum([0, hq * d, hk * d, hk * d])
        views = [qkv[:, a:b].reshape(rows, -1, 1, d) for a, b in zip(cuts, cuts[1:],
                                                                   strict=False)]
        q, k, v = (np.ascontiguousarray(a) for a in views)
        seed = int(rng.integers(1 << 30))
        batch = B.attend_rows(q, k, v, _caches(lengths, seed, heads=hk, dim=d), 0, **kw)
        np.testing.assert_array_equal(
            B.attend_rows(*views, _caches(lengths, seed, heads=hk, dim=d), 0, **kw), batch)
        for i in range(rows):
            alone = B.attend_rows(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                                  [_caches(lengths, seed, heads=hk, dim=d)[i]], 0, **kw)
            np.testing.assert_array_equal(alone[0], batch[i], err_msg=f"{d} {lengths} {i}")


CACHED_AND_FRESH = """
import sys
import numpy as np
from tests.test_cpu_attend_rows import B, KW, _caches
lengths, hq, hk, d = [300, 415, 129, 64], 9, 3, 64
kw = {**KW, "scale": d ** -0.5}
qkv = np.random.default_rng(5).standard_normal((4, (hq + 2 * hk) * d)).astype(np.float32)
cuts = np.cumsum([0, hq * d, hk * d, hk * d])
views = [qkv[:, a:b].reshape(4, -1, 1, d) for a, b in zip(cuts, cuts[1:])]
whole = B.attend_rows(*(np.ascontiguousarray(a) for a in views),
                      _caches(lengths, 10, heads=hk, dim=d), 0, **kw)
if sys.argv[1] == "views":
    got = B.attend_rows(*views, _caches(lengths, 10, heads=hk, dim=d), 0, **kw)
    assert (got.view(np.uint32) == whole.view(np.uint32)).all(), np.abs(got - whole).max()
print("ok")
"""
CACHED_AND_FRESH_RUNS = ("contiguous", "views")


@pytest.mark.early(steps=early.over_one_cache(CACHED_AND_FRESH, *CACHED_AND_FRESH_RUNS))
def test_a_cached_specialisation_and_a_fresh_one_agree(request):
    """Over one fresh numba cache: a first process compiles (and caches) the kernel for
    contiguous q/k/v; a second loads that from the cache and compiles the strided
    specialisation itself. The two must give the same bits, as the server's batched step
    (views) and a lone row may each come from either. Compiled with reassociation they
    did not (2e-8 apart on these shapes): the kernel is compiled without it.
    (Started early in the run: tests/early.py.)"""
    early.assert_ok(early.result(request.node), CACHED_AND_FRESH_RUNS)
