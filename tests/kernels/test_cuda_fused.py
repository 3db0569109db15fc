"""The fused kernels of a decode layer against the unfused launches they replace (and those
against NumPy elsewhere: test_kernels.py, test_mmvq.py), on the emulated device.

Each fused kernel computes the float32 values the unfused kernel would store, in the same
order, and then does what the next launch did with them (quantize to q8_1, add a bias and a
residual). So the results are compared bit for bit: a fused kernel that rounds once more,
sums in another order or drops an operand fails. Shapes are tiny (the emulator runs every
thread); each covers a block layout the planner picks (one warp per row and several rows a
block; several warps per row; batch tiles).
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.device import Device
from kernels.cuda.table import q8_1_row_bytes
from tests.kernels.quantdata import make_weight


def host(dev: Device, a: object) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else dev.to_host(a)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(36)


def _used(xq: np.ndarray, cols: int) -> np.ndarray:
    """The q8_1 blocks of each row (the padding to 16 bytes is never written)."""
    return xq[:, :cols // 32 * 36]


@pytest.mark.parametrize("rows, cols", [(5, 96), (2, 1056)])
def test_rms_norm_q8_1_is_the_quantized_norm(dev: Device, rng: np.random.Generator,
                                             rows: int, cols: int) -> None:
    # 96: one warp per row, 4 rows a block, the last block half empty; 1056: 256 threads
    # (8 warps) a row, 33 blocks shared out unevenly.
    x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(3)
    x[0, :32] = 0  # a zero block: d = 0, all codes 0
    w = rng.standard_normal(cols, dtype=np.float32)
    dx, dw = dev.to_device(x), dev.to_device(w)
    got = host(dev, ops.rms_norm_q8_1(dev, dx, dw, 1e-5))
    want = host(dev, ops.quantize_q8_1(dev, ops.rms_norm(dev, dx, dw, 1e-5)))
    assert got.shape == (rows, q8_1_row_bytes(cols))
    assert np.array_equal(_used(got, cols), _used(want, cols))


@pytest.mark.parametrize("act", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("batch", [1, 3])
def test_gated_q8_1_is_the_quantized_activation(dev: Device, rng: np.random.Generator,
                                                act: str, batch: int) -> None:
    n = 288  # 9 blocks: one block of 8 warps and one of 1
    gate_up = rng.standard_normal((batch, 2 * n), dtype=np.float32) * np.float32(4)
    d = dev.to_device(gate_up)
    got = host(dev, ops.gated_q8_1(dev, act, d))
    g, u = (dev.to_device(np.ascontiguousarray(a)) for a in (gate_up[:, :n], gate_up[:, n:]))
    want = host(dev, ops.quantize_q8_1(dev, getattr(ops, act)(dev, g, u)))
    assert np.array_equal(_used(got, n), _used(want, n))


@pytest.mark.parametrize("qtype, q8_1", [("Q4_K", True), ("Q8_0", True), ("Q4_0", False),
                                         ("F16", False), ("F32", False)])
@pytest.mark.parametrize("batch", [1, 3])
def test_mat_vec_epilogue_adds_bias_then_residual(dev: Device, rng: np.random.Generator,
                                                  qtype: str, q8_1: bool, batch: int) -> None:
    # The integer kernels (Q4_K, Q8_0), the float kernel (Q4_0 without q8_1, F32) and the
    # 16-bit one (F16); batch 3 runs a tile of 4 rows with one past the batch.
    rows, cols = 12, 256
    w = ops.upload_matrix(dev, make_weight(qtype, rows, cols, rng), qtype, (rows, cols))
    x = dev.to_device(rng.standard_normal((batch, cols), dtype=np.float32))
    bias = rng.standard_normal(rows, dtype=np.float32)
    res = rng.standard_normal((batch, rows), dtype=np.float32)
    plain = host(dev, ops.mul_mat_vec(dev, w, x, q8_1))
    got = host(dev, ops.mul_mat_vec(dev, w, x, q8_1, bias=dev.to_device(bias),
                                    residual=dev.to_device(res)))
    assert np.array_equal(got, res + (plain + bias))
    only_res = host(dev, ops.mul_mat_vec(dev, w, x, q8_1, residual=dev.to_device(res)))
    assert np.array_equal(only_res, res + plain)


def test_mat_vec_reads_fused_q8_1_rows(dev: Device, rng: np.random.Generator) -> None:
    # rms_norm_q8_1 -> the integer mat-vec equals rms_norm -> mul_mat_vec (which quantizes).
    rows, cols = 8, 512
    w = ops.upload_matrix(dev, make_weight("Q4_K", rows, cols, rng), "Q4_K", (rows, cols))
    x = dev.to_device(rng.standard_normal((2, cols), dtype=np.float32))
    nw = dev.to_device(rng.standard_normal(cols, dtype=np.float32))
    got = ops.mul_mat_vec_q8_1(dev, w, ops.rms_norm_q8_1(dev, x, nw, 1e-6), 2)
    want = ops.mul_mat_vec(dev, w, ops.rms_norm(dev, x, nw, 1e-6))
    assert np.array_equal(host(dev, got), host(dev, want))


@pytest.mark.parametrize("kv, neox, batch", [(np.float32, True, 1), (np.float16, False, 2),
                                             (ops.KV_BF16, True, 1)])
def test_rope_kv_is_two_ropes_and_two_row_writes(dev: Device, rng: np.random.Generator,
                                                 kv: object, neox: bool, batch: int) -> None:
    # GQA 2 (4 heads over 2 kv heads), head_dim 16, a cache of 6 rows written at row 3
    # while rotating at position 7 (a sliding layer's ring), scaled RoPE factors.
    heads, kvh, d, cap, position, row = 4, 2, 16, 6, 7, 3
    qkv = rng.standard_normal((batch, (heads + 2 * kvh) * d), dtype=np.float32)
    ff = rng.uniform(1.0, 4.0, d // 2).astype(np.float32)
    kc, vc = (dev.to_device(np.zeros((batch, kvh, cap, d), kv)) for _ in range(2))
    pos, at = (dev.to_device(np.array([n], np.int32)) for n in (position, row))
    dff = dev.to_device(ff)
    q = host(dev, ops.rope_kv(dev, dev.to_device(qkv), kc, vc, pos, at, 1e4, heads, kvh,
                              neox=neox, freq_factors=dff))

    def roped(cols: slice, n: int) -> np.ndarray:  # the unfused rope of a (b, 1, n, d) view
        x = np.ascontiguousarray(qkv[:, cols]).reshape(batch, 1, n, d)
        return host(dev, ops.rope(dev, dev.to_device(x), position, 1e4, neox=neox,
                                  seq_axis=1, freq_factors=dff)).reshape(batch, n, d)

    def stored(x: np.ndarray) -> np.ndarray:  # a cache row as the eager step stores it
        if kv is ops.KV_BF16:
            return ops.to_bf16_bits(np, x)
        return x.astype(kv)

    assert np.array_equal(q.reshape(batch, heads, d), roped(slice(0, heads * d), heads))
    k_want = stored(roped(slice(heads * d, (heads + kvh) * d), kvh))
    v_want = stored(qkv[:, (heads + kvh) * d:].reshape(batch, kvh, d))
    k_got, v_got = host(dev, kc), host(dev, vc)
    assert np.array_equal(k_got[:, :, row], k_want)
    assert np.array_equal(v_got[:, :, row], v_want)
    others = [r for r in range(cap) if r != row]
    assert not k_got[:, :, others].any() and not v_got[:, :, others].any()


@pytest.mark.parametrize("act, bias, kv", [("silu_mul", True, np.float16),
                                           ("gelu_tanh_mul", False, ops.KV_BF16)])
def test_decode_layer_is_the_unfused_layer(emu: Device, act: str, bias: bool, kv: object
                                           ) -> None:
    # A tiny Llama layer (Qwen2's biases; Gemma's activation), Q8_0 weights, a float16 cache
    # or a bfloat16 one (RoPE and the KV writes in the q/k/v mat-vec either way), 2
    # sequences of one token at position 5: the fused step launches exactly
    # plan.decode_layer_kernels' kernels and its output equals the unfused step's bit for
    # bit (every fused kernel stores what the launches it replaces stored).
    from kernels.cuda import plan
    from tests.kernels.test_mmv_tiles import recording

    dev, rng = emu, np.random.default_rng(5)
    hidden, heads, kvh, d, ffn, b, position, cap = 128, 4, 2, 32, 256, 2, 5, 8
    qkv_rows = (heads + 2 * kvh) * d

    def weight(rows: int, cols: int) -> ops.QuantMatrix:
        return ops.upload_matrix(dev, make_weight("Q8_0", rows, cols, rng), "Q8_0", (rows, cols))

    def vec(n: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(n) * s).astype(np.float32)

    lw = ops.DecoderLayer(
        attn_norm=dev.to_device(vec(hidden)), qkv=weight(qkv_rows, hidden),
        o=weight(hidden, heads * d), mlp_norm=dev.to_device(vec(hidden)),
        gate_up=weight(2 * ffn, hidden), down=weight(hidden, ffn), heads=heads, kv_heads=kvh,
        eps=1e-6, theta=1e4, scale=d ** -0.5, act=act,
        qkv_bias=dev.to_device(vec(qkv_rows)) if bias else None)
    x = rng.standard_normal((b, hidden), dtype=np.float32)
    stored = (lambda a: ops.to_bf16_bits(np, a)) if kv is ops.KV_BF16 else (
        lambda a: a.astype(kv))
    past = stored(rng.standard_normal((2, b, kvh, cap, d)).astype(np.float32))
    past[:, :, :, position:] = 0
    kc, vc = dev.to_device(past[0].copy()), dev.to_device(past[1].copy())
    pos = dev.to_device(np.array([position], np.int32))
    names = recording(dev)
    got = host(dev, ops.decode_layer(dev, lw, dev.to_device(x), kc, vc, pos, position))
    splits = 2 if "attn_combine_f32" in names else 1
    stems = plan.decode_layer_kernels(plan.LayerShape(
        gelu=act != "silu_mul", attention_splits=splits))
    assert len(names) == len(stems) == 8 + (splits > 1)
    assert all(n.startswith(s) for n, s in zip(names, stems, strict=True)), names

    # The unfused step: norm, mat-vec (+ bias), two ropes, the K/V rows written, attention,
    # mat-vec + residual, norm, mat-vec, activation, mat-vec + residual.
    dx = dev.to_device(x)
    qkv = host(dev, ops.mul_mat_vec(dev, lw.qkv, ops.rms_norm(dev, dx, lw.attn_norm, 1e-6)))
    if bias:
        qkv = qkv + host(dev, lw.qkv_bias)
    split = np.split(qkv, [heads * d, (heads + kvh) * d], axis=1)
    q, k = (host(dev, ops.rope(dev, dev.to_device(a.reshape(b, 1, -1, d)), position, 1e4,
                               seq_axis=1)).reshape(b, -1, d) for a in split[:2])
    cache = past.copy()
    cache[0, :, :, position] = stored(k)
    cache[1, :, :, position] = stored(split[2].reshape(b, kvh, d))
    assert np.array_equal(host(dev, kc), cache[0]) and np.array_equal(host(dev, vc), cache[1])
    keys = [dev.to_device(np.ascontiguousarray(c[:, :, :position + 1])) for c in cache]
    a = host(dev, ops.attention(dev, dev.to_device(q.reshape(b, heads, 1, d)), *keys, d ** -0.5,
                                causal_offset=position))
    h = x + host(dev, ops.mul_mat_vec(dev, lw.o, dev.to_device(a.reshape(b, -1))))
    gu = host(dev, ops.mul_mat_vec(dev, lw.gate_up, ops.rms_norm(dev, dev.to_device(h),
                                                                lw.mlp_norm, 1e-6)))
    m = getattr(ops, act)(dev, *(dev.to_device(np.ascontiguousarray(g))
                                 for g in np.split(gu, 2, axis=1)))
    want = h + host(dev, ops.mul_mat_vec(dev, lw.down, m))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("kv, n_kv, sm", [(np.float16, 40, 80), (np.float32, 100, 80),
                                          (ops.KV_BF16, 200, 80)])
def test_attention_q8_1_is_the_quantized_output(dev: Device, rng: np.random.Generator,
                                                kv: object, n_kv: int, sm: int) -> None:
    # Decode (one query, GQA 2, softcap): 40 keys are one split (the attention kernel
    # writes the q8_1 rows), 100 and 200 keys 2 and 4 (the combine writes them); head_dim
    # 64 takes the vector kernel, 96 (no vector width) the tiled one.
    from kernels.cuda.plan import DeviceLimits

    for d in (64, 96):
        b, heads, kvh = 2, 4, 2
        q = dev.to_device(rng.standard_normal((b, heads, 1, d), dtype=np.float32))
        k, v = (dev.to_device(ops.to_bf16_bits(np, a) if kv is ops.KV_BF16 else a.astype(kv))
                for a in rng.standard_normal((2, b, kvh, n_kv, d)).astype(np.float32))
        limits, dev.limits = dev.limits, DeviceLimits(sm_count=sm)
        try:
            got = host(dev, ops.attention(dev, q, k, v, 0.125, causal_offset=n_kv - 1,
                                          softcap=30.0, q8_1=True))
            out = ops.attention(dev, q, k, v, 0.125, causal_offset=n_kv - 1, softcap=30.0)
        finally:
            dev.limits = limits
        want = host(dev, ops.quantize_q8_1(dev, out.reshape(b, heads * d)))
        assert np.array_equal(_used(got, heads * d), _used(want, heads * d)), d


@pytest.mark.parametrize("kv, neox", [(np.float32, False), (np.float16, True),
                                      (ops.KV_BF16, True)])
def test_qkv_rope_kv_is_the_mat_vec_then_rope_kv(dev: Device, rng: np.random.Generator,
                                                 kv: object, neox: bool) -> None:
    # Q4_K q/k/v (2 heads over 1 kv head of 48: 192 rows, 48 blocks of 4 warps = 24
    # pairs each, so pairs of a head span blocks) with a bias and RoPE factors, batch 2.
    heads, kvh, d, cols, b, cap = 2, 1, 48, 256, 2, 4
    rows = (heads + 2 * kvh) * d
    w = ops.upload_matrix(dev, make_weight("Q4_K", rows, cols, rng), "Q4_K", (rows, cols))
    xq = ops.quantize_q8_1(dev, dev.to_device(rng.standard_normal((b, cols), dtype=np.float32)))
    bias, ff = dev.to_device(rng.standard_normal(rows, dtype=np.float32)), dev.to_device(
        rng.uniform(1, 3, d // 2).astype(np.float32))
    pos, row = (dev.to_device(np.array([n], np.int32)) for n in (9, 2))
    caches = [[dev.to_device(np.zeros((b, kvh, cap, d), kv)) for _ in range(2)] for _ in "ab"]
    kw = dict(neox=neox, freq_factors=ff)
    got = ops.qkv_rope_kv(dev, w, xq, *caches[0], pos, row, 5e5, heads, kvh, bias=bias, **kw)
    qkv = ops.mul_mat_vec_q8_1(dev, w, xq, b, bias=bias)
    want = ops.rope_kv(dev, qkv, *caches[1], pos, row, 5e5, heads, kvh, **kw)
    assert np.array_equal(host(dev, got), host(dev, want))
    for a, c in zip(*caches, strict=True):
        assert np.array_equal(host(dev, a), host(dev, c))
    assert host(dev, caches[0][0])[:, :, 2].any()


def _head_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """NumPy RMSNorm over the last axis, float64 sums (the reference of the per-head norm)."""
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(np.float32)


@pytest.mark.parametrize("kv, neox, d, heads, kvh", [(np.float16, True, 32, 4, 2),
                                                     (np.float32, False, 256, 2, 1),
                                                     (ops.KV_BF16, True, 64, 4, 2)])
def test_qkv_rope_kv_norms_each_q_and_k_head(dev: Device, rng: np.random.Generator,
                                             kv: object, neox: bool, d: int, heads: int,
                                             kvh: int) -> None:
    # Qwen3/Gemma 3: each q and k head RMS-normed before RoPE, in the heads' last blocks.
    # head_dim 32 over 4-warp blocks: 8 blocks a head, one head's blocks finish in any
    # order (the race check shuffles them); head_dim 256 (Gemma): 64 blocks a head, and
    # its 128 pairs take every thread of the last block. Against mul_mat_vec, a NumPy norm
    # per head and rope_kv: equal within float32 rounding (the sum of squares in another
    # order: 2e-6 relative), the caches as well; a launch twice over the same counters
    # (left zeroed) gives the same bits.
    cols, b, cap = 256, 2, 4
    rows = (heads + 2 * kvh) * d
    w = ops.upload_matrix(dev, make_weight("Q8_0", rows, cols, rng), "Q8_0", (rows, cols))
    xq = ops.quantize_q8_1(dev, dev.to_device(rng.standard_normal((b, cols), dtype=np.float32)))
    qn, kn = (rng.uniform(0.5, 2.0, d).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(rows, dtype=np.float32)
    pos, row = (dev.to_device(np.array([n], np.int32)) for n in (9, 2))
    caches = [[dev.to_device(np.zeros((b, kvh, cap, d), kv)) for _ in range(2)] for _ in "abc"]
    done = ops.tail_counters(dev, b * (heads + kvh))
    got = [host(dev, ops.qkv_rope_kv(dev, w, xq, *caches[j], pos, row, 1e4, heads, kvh,
                                     bias=dev.to_device(bias), neox=neox, eps=1e-6,
                                     qk_norms=(dev.to_device(qn), dev.to_device(kn)),
                                     done=done)) for j in (0, 1)]
    assert np.array_equal(got[0], got[1]) and not host(dev, done).any()
    qkv = host(dev, ops.mul_mat_vec_q8_1(dev, w, xq, b, bias=dev.to_device(bias)))
    q, k, v = np.split(qkv, [heads * d, (heads + kvh) * d], axis=1)
    normed = np.concatenate([_head_norm(q.reshape(b, heads, d), qn, 1e-6).reshape(b, -1),
                             _head_norm(k.reshape(b, kvh, d), kn, 1e-6).reshape(b, -1), v],
                            axis=1)
    want = host(dev, ops.rope_kv(dev, dev.to_device(normed), *caches[2], pos, row, 1e4, heads,
                                 kvh, neox=neox))
    np.testing.assert_allclose(got[0], want, rtol=2e-6, atol=2e-6)
    # A half cache: one rounding to 11 bits apart; bfloat16: to 8 bits.
    tol = {np.float16: 1e-3, ops.KV_BF16: 8e-3}.get(kv, 2e-6)
    for a, c in zip(caches[0], caches[2], strict=True):
        np.testing.assert_allclose(ops.kv_as_f32(np, host(dev, a)), ops.kv_as_f32(np, host(dev, c)),
                                   rtol=tol, atol=tol)
    assert host(dev, caches[0][0])[:, :, 2].any()


@pytest.mark.parametrize("qtype, batch", [("Q4_K", 1), ("Q8_0", 3)])
def test_mat_vec_norm_add_is_the_norm_then_the_residual(dev: Device, rng: np.random.Generator,
                                                        qtype: str, batch: int) -> None:
    # Gemma 2/3's post-norms: residual + rms_norm(W x) in the grid's last block, against
    # the three launches it replaces (mat-vec, rms_norm, add): float32 rounding apart (the
    # sum of squares in another order; 2e-6 relative). 40 rows: 10 blocks per batch row.
    rows, cols = 40, 256
    w = ops.upload_matrix(dev, make_weight(qtype, rows, cols, rng), qtype, (rows, cols))
    xq = ops.quantize_q8_1(dev, dev.to_device(rng.standard_normal((batch, cols),
                                                                  dtype=np.float32)))
    nw = dev.to_device(rng.uniform(0.5, 2.0, rows).astype(np.float32))
    res = rng.standard_normal((batch, rows), dtype=np.float32)
    done = ops.tail_counters(dev, batch)
    got = host(dev, ops.mul_mat_vec_q8_1_norm_add(dev, w, xq, batch, nw, 1e-6,
                                                  dev.to_device(res), done))
    plain = ops.mul_mat_vec_q8_1(dev, w, xq, batch)
    want = res + host(dev, ops.rms_norm(dev, plain, nw, 1e-6))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert not host(dev, done).any()  # left zeroed for the next launch
    assert not np.allclose(got, res + host(dev, plain), atol=1e-2)  # the norm is applied


@pytest.mark.parametrize("rows, cols", [(5, 96), (2, 1056)])
def test_post_norm_add_pre_norm_is_the_three_launches(dev: Device, rng: np.random.Generator,
                                                       rows: int, cols: int) -> None:
    # Gemma 2/3 after attention: rms_norm(y, w_post), + the residual, rms_norm_q8_1 with
    # w_pre, in one launch: h and the q8_1 rows bit for bit (the block layouts of
    # test_rms_norm_q8_1_is_the_quantized_norm).
    y, res = (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(3)
              for _ in range(2))
    w_post, w_pre = (rng.uniform(0.5, 2.0, cols).astype(np.float32) for _ in range(2))
    dy, dres, dpost, dpre = (dev.to_device(a) for a in (y, res, w_post, w_pre))
    h, xq = ops.rms_norm_add_rms_norm_q8_1(dev, dy, dres, dpost, dpre, 1e-6)
    want_h = res + host(dev, ops.rms_norm(dev, dy, dpost, 1e-6))
    want_q = host(dev, ops.rms_norm_q8_1(dev, dev.to_device(want_h), dpre, 1e-6))
    assert np.array_equal(host(dev, h), want_h)
    assert np.array_equal(_used(host(dev, xq), cols), _used(want_q, cols))
