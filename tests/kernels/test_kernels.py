"""Every kernel against a NumPy / gguf-py reference on awkward shapes.

Runs on the emulated device always and on a real GPU when present (``-m gpu``). Tolerances
are stated per test; references are computed in float64 unless the kernel's contract is
exactness (dequantization).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.device import Device
from kernels.cuda.table import TYPES
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.quantdata import make_weight, reference

COLS = [1, 31, 32, 33, 255, 1023, 1024, 1025, 4096]
ROWS = [1, 3, 37]


def host(dev: Device, a: object) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else dev.to_host(a)


def _cols_for(qtype: str) -> list[int]:
    qk = TYPES[qtype].qk
    if qk == 1:
        return COLS
    return [qk, 3 * qk, 1056, 4096] if qk == 32 else [256, 768, 4096]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# --- quantized matrices --------------------------------------------------------------------

@pytest.mark.parametrize("qtype", list(TYPES))
def test_mul_mat_vec(dev: Device, qtype: str, rng: np.random.Generator) -> None:
    # The float kernels (q8_1=False; the integer ones: test_mmvq.py).
    # |y - ref| <= 2e-5 * sum_c |w_rc x_c| + 1e-6: float32 accumulation in another order.
    for cols in _cols_for(qtype):
        for rows, batch in [(1, 1), (37, 1), (5, 3)] + ([(300, 1)] if cols <= 1024 else []):
            raw = make_weight(qtype, rows, cols, rng)
            w_ref = reference(qtype, raw, cols).astype(np.float64)
            w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
            x = rng.standard_normal((batch, cols), dtype=np.float32)
            y = host(dev, ops.mul_mat_vec(dev, w, dev.to_device(x), q8_1=False))
            ref = x.astype(np.float64) @ w_ref.T
            bound = 2e-5 * (np.abs(x) @ np.abs(w_ref).T) + 1e-6
            assert y.shape == (batch, rows)
            assert (np.abs(y - ref) <= bound).all(), (qtype, rows, cols, batch)


@pytest.mark.parametrize("qtype", list(TYPES))
def test_dequantize(dev: Device, qtype: str, rng: np.random.Generator) -> None:
    # f32: equal to gguf-py's dequantization up to one float32 rounding (rtol 2e-7);
    # f16: that value rounded to half (within one half ulp of gguf's value cast to half).
    for cols in _cols_for(qtype)[:3]:
        rows = 7
        raw = make_weight(qtype, rows, cols, rng)
        ref = reference(qtype, raw, cols)
        w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
        got = host(dev, ops.dequantize(dev, w))
        np.testing.assert_allclose(got, ref, rtol=2e-7, atol=1e-30)
        got16 = host(dev, ops.dequantize(dev, w, np.float16)).astype(np.float32)
        np.testing.assert_allclose(got16, ref.astype(np.float16).astype(np.float32),
                                   rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "Q6_K"])
def test_embedding_gather(dev: Device, qtype: str, rng: np.random.Generator) -> None:
    cols = 256 if TYPES[qtype].qk == 256 else 96
    vocab = 50
    raw = make_weight(qtype, vocab, cols, rng)
    ref = reference(qtype, raw, cols)
    table = ops.upload_matrix(dev, raw, qtype, (vocab, cols))
    ids = np.array([3, 0, 49, 3, 17, 17, 1], np.int32)
    got = host(dev, ops.get_rows(dev, table, dev.to_device(ids)))
    np.testing.assert_allclose(got, ref[ids], rtol=2e-7, atol=1e-30)
    # an id outside the table gives a NaN row, never a read out of bounds
    bad = host(dev, ops.get_rows(dev, table, dev.to_device(np.array([2, 50, -1], np.int32))))
    assert np.isfinite(bad[0]).all() and np.isnan(bad[1:]).all()


# --- norms ---------------------------------------------------------------------------------

def _rms_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _ln_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w
    return y if b is None else y + b


def test_rms_norm(dev: Device, rng: np.random.Generator) -> None:
    # rtol 1e-5, atol 1e-5 against float64
    for cols in COLS:
        for rows in ROWS:
            x = rng.standard_normal((rows, cols), dtype=np.float32) * 3
            w = rng.standard_normal(cols, dtype=np.float32)
            y = host(dev, ops.rms_norm(dev, dev.to_device(x), dev.to_device(w), 1e-6))
            np.testing.assert_allclose(y, _rms_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{rows}x{cols}")


def test_layer_norm(dev: Device, rng: np.random.Generator) -> None:
    # rtol 1e-5, atol 2e-5 against float64, rows offset by a large mean (two-pass variance)
    for cols in COLS:
        for rows in ROWS:
            x = rng.standard_normal((rows, cols), dtype=np.float32) + 50
            w = rng.standard_normal(cols, dtype=np.float32)
            b = rng.standard_normal(cols, dtype=np.float32) if cols % 2 else None
            y = host(dev, ops.layer_norm(dev, dev.to_device(x), dev.to_device(w),
                                         None if b is None else dev.to_device(b), 1e-12))
            np.testing.assert_allclose(y, _ln_ref(x, w, b, 1e-12), rtol=1e-5, atol=2e-5,
                                       err_msg=f"{rows}x{cols}")


@pytest.mark.parametrize("rows", [1, 2, 17, 64, 131, 200])
def test_layer_norm_seed_shapes(dev: Device, rows: int, rng: np.random.Generator) -> None:
    # The seed's LayerNorm cases, rows 1..200 x hidden 128..1024 (a sample of the grid).
    for hidden in (128, 384, 768, 1024) if rows in (1, 200) else (128 * (rows % 8 + 1),):
        x = rng.standard_normal((1, rows, hidden), dtype=np.float32)
        w = rng.standard_normal(hidden, dtype=np.float32)
        b = rng.standard_normal(hidden, dtype=np.float32)
        y = host(dev, ops.layer_norm(dev, dev.to_device(x), dev.to_device(w), dev.to_device(b),
                                     1e-12))
        np.testing.assert_allclose(y, _ln_ref(x, w, b, 1e-12), rtol=1e-5, atol=2e-5)


# --- attention pieces --------------------------------------------------------------------

def _softmax_ref(s: np.ndarray, visible: np.ndarray) -> np.ndarray:
    s = np.where(visible, s.astype(np.float64), -np.inf)
    m = s.max(-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    tot = e.sum(-1, keepdims=True)
    return np.divide(e, tot, out=np.zeros_like(e), where=tot > 0)


def test_softmax_causal_and_padding(dev: Device, rng: np.random.Generator) -> None:
    # rtol 1e-5, atol 1e-7 against float64; masks built only in the reference
    for keys in COLS:
        for nq, offset in [(1, keys - 1), (min(keys, 5), max(0, keys - 5)), (3, None)]:
            b, h = 2, 3
            s = rng.standard_normal((b, h, nq, keys), dtype=np.float32) * 4
            mask = (rng.random((b, keys)) > 0.3).astype(np.float32)
            mask[1] = 0  # batch 1: every key padded -> rows of zeros
            scale = 0.125
            got = host(dev, ops.softmax(dev, dev.to_device(s), scale, causal_offset=offset,
                                        key_mask=dev.to_device(mask)))
            j = np.arange(keys)
            causal = (np.ones((nq, keys), bool) if offset is None
                      else j[None, :] <= offset + np.arange(nq)[:, None])
            visible = causal[None, None] & (mask[:, None, None, :] != 0)
            np.testing.assert_allclose(got, _softmax_ref(s * scale, visible), rtol=1e-5,
                                       atol=1e-7, err_msg=f"keys={keys} nq={nq}")
            if offset is None:
                continue
            for window in (1, 3, keys):  # sliding window: the last `window` keys only
                got = host(dev, ops.softmax(dev, dev.to_device(s), scale, causal_offset=offset,
                                            key_mask=dev.to_device(mask), window=window))
                recent = j[None, :] > offset + np.arange(nq)[:, None] - window
                vis = (causal & recent)[None, None] & (mask[:, None, None, :] != 0)
                np.testing.assert_allclose(got, _softmax_ref(s * scale, vis), rtol=1e-5,
                                           atol=1e-7, err_msg=f"keys={keys} window={window}")


@pytest.mark.parametrize("neox", [True, False])
def test_rope(dev: Device, neox: bool, rng: np.random.Generator) -> None:
    # atol 1e-5 + 2e-7 * position * |x|max: float32 angles drift with the position.
    # Scaled RoPE: per-pair frequency divisors (Llama 3's rope_freqs) on some cases.
    for d, s, offset, scaled in [(2, 1, 0, False), (32, 5, 7, True), (64, 3, 1000, False),
                                 (128, 33, 0, False), (80, 2, 4096, True)]:
        ff = rng.uniform(1.0, 32.0, d // 2).astype(np.float32) if scaled else None
        for layout in ("bhsd", "bshd"):
            shape = (2, 3, s, d) if layout == "bhsd" else (2, s, 3, d)
            x = rng.standard_normal(shape, dtype=np.float32)
            theta = 10000.0
            got = host(dev, ops.rope(dev, dev.to_device(x), offset, theta, neox=neox,
                                     seq_axis=2 if layout == "bhsd" else 1,
                                     freq_factors=None if ff is None else dev.to_device(ff)))
            pos = offset + np.arange(s, dtype=np.float64)
            ang = pos[:, None] * theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
            if ff is not None:
                ang = ang / ff.astype(np.float64)
            c, sn = np.cos(ang), np.sin(ang)
            if layout == "bshd":
                c, sn = c[:, None, :], sn[:, None, :]
            xd = x.astype(np.float64)
            a, b = (xd[..., : d // 2], xd[..., d // 2:]) if neox else (xd[..., 0::2], xd[..., 1::2])
            ra, rb = a * c - b * sn, a * sn + b * c
            ref = np.concatenate([ra, rb], -1) if neox else np.stack([ra, rb], -1).reshape(shape)
            tol = 1e-5 + 2e-7 * (offset + s) * np.abs(x).max()
            np.testing.assert_allclose(got, ref, rtol=0, atol=tol, err_msg=f"{d} {s} {layout}")


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                  offset: int | None = None, mask: np.ndarray | None = None,
                  window: int | None = None, softcap: float | None = None) -> np.ndarray:
    """float64 masked attention with the visibility rule of attention.cu, masks built here."""
    hq, hkv, t, n_kv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    kh = np.repeat(k.astype(np.float64), hq // hkv, axis=1)
    vh = np.repeat(v.astype(np.float64), hq // hkv, axis=1)
    s = (q.astype(np.float64) @ kh.transpose(0, 1, 3, 2)) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    i, j = np.arange(t)[:, None], np.arange(n_kv)[None, :]
    vis = np.ones((t, n_kv), bool)
    if offset is not None:
        vis &= j <= offset + i
        if window is not None:
            vis &= j > offset + i - window
    vis = vis[None, None] & (np.ones((q.shape[0], n_kv), bool) if mask is None else mask != 0
                             )[:, None, None, :]
    return _softmax_ref(s, vis) @ vh


# (head_dim, t, n_kv, heads, kv_heads, causal offset, window, softcap, key mask)
ATTN_CASES = [
    (32, 1, 1, 2, 2, 0, None, None, False),  # the first decode step
    (64, 1, 17, 9, 3, 12, None, None, True),  # decode behind the cache's end, GQA 3
    (80, 1, 300, 4, 1, 299, None, None, True),  # split-K: 300 keys in 3 splits
    (256, 1, 40, 2, 1, 39, 7, 30.0, False),  # widest head, sliding window, soft-capping
    (64, 37, 37, 6, 2, 0, None, None, False),  # prefill: t not a multiple of tile or rows
    (32, 45, 100, 4, 2, 55, None, None, True),  # prefill after a cached 55-token prefix
    (48, 70, 70, 2, 1, 0, 16, None, False),  # sliding-window prefill
    (128, 33, 33, 8, 8, None, None, None, True),  # encoder: no causality, padding only
    (16, 9, 9, 3, 3, 0, None, 50.0, False),  # head_dim below a warp, soft-capping
    (96, 3, 20, 2, 1, 17, None, None, True),  # 6 rows of 3 positions: the decode kernel
    (40, 4, 30, 2, 2, 26, 5, 20.0, False),  # the decode kernel with a window, 4 positions
]


def _ids(c: tuple) -> str:
    return "d{}-t{}-kv{}-h{}/{}".format(*c)


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids)
def test_attention(dev: Device, case: tuple, rng: np.random.Generator) -> None:
    check_attention(dev, case, rng)


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids)
def test_attention_is_free_of_races(case: tuple, rng: np.random.Generator) -> None:
    # Every case again with threads in both orders and the blocks shuffled (bitwise equal).
    check_attention(EmulatedDevice(check_races=True), case, rng)


def check_attention(dev: Device, case: tuple, rng: np.random.Generator,
                    kv_dtype: type = np.float32) -> None:
    # rtol 1e-5, atol 1e-6 against float64. K/V are narrowed views of a larger cache; batch
    # 1 of the mask hides every key (its rows must come out as zeros). A float16 cache is
    # checked against float64 attention over the same half values (widening half is exact,
    # so the kernel's only error is its float32 arithmetic: the same tolerance); so is a
    # bfloat16 one (ops.KV_BF16: uint16 bit patterns, widened exactly by ops.kv_as_f32).
    d, t, n_kv, hq, hkv, offset, window, softcap, masked = case
    b, cap = 2, n_kv + 7
    q = rng.standard_normal((b, hq, t, d), dtype=np.float32)

    def cache() -> np.ndarray:
        x = rng.standard_normal((b, hkv, cap, d)).astype(np.float32)
        return ops.to_bf16_bits(np, x) if np.dtype(kv_dtype) == ops.KV_BF16 else \
            x.astype(kv_dtype)

    kc, vc = dev.to_device(cache()), dev.to_device(cache())
    k, v = kc[:, :, :n_kv], vc[:, :, :n_kv]
    mask = None
    if masked:
        mask = (rng.random((b, n_kv)) > 0.3).astype(np.float32)
        mask[1] = 0
    scale = 1 / math.sqrt(d)
    got = host(dev, ops.attention(dev, dev.to_device(q), k, v, scale, causal_offset=offset,
                                  key_mask=None if mask is None else dev.to_device(mask),
                                  window=window, softcap=softcap))
    ref = attention_ref(q, ops.kv_as_f32(np, host(dev, k)), ops.kv_as_f32(np, host(dev, v)),
                        scale, offset, mask, window, softcap)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


# --- elementwise and sampling ------------------------------------------------------------

def test_silu_mul_and_gelu(dev: Device, rng: np.random.Generator) -> None:
    # rtol 1e-6, atol 1e-6 against float64 (erf from math.erf)
    erf = np.vectorize(math.erf)
    for n in [1, 31, 32, 33, 255, 1025, 3 * 4096 + 1]:
        g, u = (rng.standard_normal(n, dtype=np.float32) * 4 for _ in range(2))
        got = host(dev, ops.silu_mul(dev, dev.to_device(g), dev.to_device(u)))
        gd = g.astype(np.float64)
        np.testing.assert_allclose(got, gd / (1 + np.exp(-gd)) * u, rtol=1e-6, atol=1e-6)
        got = host(dev, ops.gelu(dev, dev.to_device(g)))
        np.testing.assert_allclose(got, 0.5 * gd * (1 + erf(gd / math.sqrt(2))), rtol=1e-6,
                                   atol=1e-6)
        got = host(dev, ops.gelu_tanh_mul(dev, dev.to_device(g), dev.to_device(u)))
        inner = math.sqrt(2 / math.pi) * (gd + 0.044715 * gd ** 3)
        np.testing.assert_allclose(got, 0.5 * gd * (1 + np.tanh(inner)) * u, rtol=1e-5,
                                   atol=1e-5)


def test_argmax(dev: Device, rng: np.random.Generator) -> None:
    # exact, first index on ties (NumPy's rule), NaN ignored
    for cols in COLS + [49152]:
        x = rng.standard_normal((3, cols), dtype=np.float32)
        x[1] = 1.0  # all tied -> 0
        if cols > 5:
            x[2, [cols // 2, cols - 1]] = 100.0  # tie between two maxima -> the first
            x[0, 0] = np.nan
        got = host(dev, ops.argmax(dev, dev.to_device(x)))
        ref = np.nanargmax(x, axis=-1)
        assert got.tolist() == ref.tolist(), cols


# --- every kernel is free of order-dependent results -------------------------------------

def test_no_kernel_depends_on_thread_order(rng: np.random.Generator) -> None:
    """Each kernel once on a race-checking emulator (both schedules must agree bitwise)."""
    dev = EmulatedDevice(check_races=True)
    x = dev.to_device(rng.standard_normal((3, 1025), dtype=np.float32))
    w = dev.to_device(rng.standard_normal(1025, dtype=np.float32))
    ops.rms_norm(dev, x, w, 1e-6)
    ops.layer_norm(dev, x, w, w, 1e-6)
    ops.softmax(dev, dev.to_device(rng.standard_normal((1, 2, 3, 300), dtype=np.float32)),
                causal_offset=297)
    ops.argmax(dev, x)
    for qtype in ("Q4_0", "Q6_K", "F16"):
        cols = 512
        m = ops.upload_matrix(dev, make_weight(qtype, 9, cols, rng), qtype, (9, cols))
        x2 = dev.to_device(rng.standard_normal((2, cols), dtype=np.float32))
        ops.mul_mat_vec(dev, m, x2)  # the integer kernel where the type has one
        ops.mul_mat_vec(dev, m, x2, q8_1=False)
        ops.dequantize(dev, m, np.float16)
    q = dev.to_device(rng.standard_normal((1, 4, 1, 64), dtype=np.float32))
    kv = dev.to_device(rng.standard_normal((1, 2, 300, 64), dtype=np.float32))
    ops.attention(dev, q, kv, kv, 0.125)  # decode, split-K and the combine
    qp = dev.to_device(rng.standard_normal((1, 4, 21, 64), dtype=np.float32))
    ops.attention(dev, qp, kv[:, :, :21], kv[:, :, :21], 0.125, causal_offset=0, window=9)
    ops.rope(dev, q, 3, 10000.0)
    ops.silu_mul(dev, x, x)
    ops.gelu(dev, x)
