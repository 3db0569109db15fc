"""CPU backend (numba kernels over quantized weights) against the NumPy reference.

Tolerances (float32): packing is exact (0 ulp) for Q4_0/Q4_1/Q4_K/Q8_0; matmuls rtol 1e-5
of the output scale (summation order differs); fused ops atol 1e-5 (exp/erf are
polynomial approximations with relative error < 4e-7). Real models: the parity bars.
"""

from __future__ import annotations

import platform
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.backends.cpu import MATVEC_ROWS, CpuBackend, probe  # noqa: E402
from inference.backends.cpu.pack import PackedWeight, RawWeight, pack, packed_bits, unpack  # noqa: E402
from inference.backends.numpy_backend import NumpyBackend  # noqa: E402
from inference.formats.quants import dequantize, dequantize_raw  # noqa: E402
from inference.formats.tensor import TensorData  # noqa: E402
from tests import early  # noqa: E402
from tests import goldens_io as g  # noqa: E402
from tests.bundled import INSTALL_HINT, load_bundled, random_tensor  # noqa: E402

# The float kernels; tests/test_cpu_idot.py tests the integer ones.
C, N = CpuBackend("float"), NumpyBackend()
PACKED = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K")
RAW = ("Q3_K", "Q2_K")


def randn(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def assert_matmul_close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()), rtol=0)


def test_probe_and_registry():
    from inference.backends import probe as registry_probe

    ok, reason = probe()
    assert ok and "numba" in reason
    assert registry_probe("cpu").available


# --- packing -------------------------------------------------------------------------------

@pytest.mark.parametrize("rows", [1, 32])
@pytest.mark.parametrize("qtype", PACKED)
def test_pack_of_one_tile_is_exact(qtype, rows):
    # One tile of rows: the per-group scales are then a strided view, not a copy.
    t = random_tensor(qtype, rows, 256, seed=rows)
    np.testing.assert_array_equal(unpack(pack(t)), dequantize_raw(t.data, qtype))


@pytest.mark.parametrize("qtype", PACKED)
def test_pack_is_exact_and_within_memory_rule(qtype):
    t = random_tensor(qtype, 70, 512, seed=len(qtype))  # 70 rows: the last tile is padded
    w = pack(t)
    assert isinstance(w, PackedWeight)
    np.testing.assert_array_equal(unpack(w), dequantize_raw(t.data, qtype))
    # bytes held per byte of file, padding to 96 rows aside: Q4_1 keeps its float16 scale
    # and bias in one row (as large as the file); Q4_0, Q5_0, Q8_0 their float16 d after
    # the blocks (as the file); Q4_K keeps its 6-bit scales and mins as
    # two rows of bytes and float16 d, dmin once a super-block (a 128-byte super row for
    # 8 blocks); Q6_K its int8 scales per 16 weights as two rows of bytes and float16 d
    # once a super-block (64 bytes), as the file; 5-bit codes take one row more than 4-bit
    # ones (the plane of high bits), so Q5_1 is as large as the file too
    growth = {"Q4_0": 1.0, "Q4_1": 1.0, "Q4_K": 592 / 576, "Q5_0": 1.0,
              "Q5_1": 1.0, "Q5_K": 720 / 704, "Q8_0": 1.0, "Q6_K": 1.0}
    assert w.nbytes == pytest.approx(growth[qtype] * t.data.nbytes * 96 / 70)


def test_float16_scales_decode_every_finite_value():
    from numba import njit

    from inference.backends.cpu.ir import _half

    @njit
    def widen(bits, out):
        for i in range(bits.shape[0]):
            out[i] = _half(bits[i])

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[np.isfinite(bits.view(np.float16))]  # subnormals and both zeros included
    got = np.empty(len(bits), dtype=np.float32)
    widen(bits, got)
    np.testing.assert_array_equal(got.view(np.uint32), bits.view(np.float16).astype(
        np.float32).view(np.uint32))


@pytest.mark.parametrize("qtype", RAW)
def test_types_over_the_memory_rule_stay_raw(qtype):
    t = random_tensor(qtype, 8, 256)
    assert packed_bits(t) is None
    w = pack(t)
    assert isinstance(w, RawWeight) and w.nbytes == t.data.nbytes


@pytest.mark.parametrize("place", ["memory", "mapped"])
def test_file_bytes_are_read_into_memory_or_left_mapped(place, tmp_path, monkeypatch):
    """A weight kept in its file layout is the process's own copy of the bytes with
    INFERDESK_CPU_WEIGHTS=memory (the default where it fits), the file's map with
    "mapped"; the same bytes, the same rows."""
    import mmap

    from tests.test_gguf_weight_store import _resident_kb

    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", place)
    t = random_tensor("Q3_K", 128, 4096)  # 220 KiB, whole pages: all of them to drop
    path = tmp_path / "q3k.bin"
    path.write_bytes(np.ascontiguousarray(t.data).tobytes())
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    file_view = np.frombuffer(m, dtype=t.data.dtype).reshape(t.data.shape)
    assert file_view.sum() == t.data.sum()  # every page of the file mapped in
    w = pack(TensorData(t.name, t.shape, "Q3_K", file_view))
    assert isinstance(w, RawWeight)
    assert np.shares_memory(w.raw, file_view) == (place == "mapped")
    np.testing.assert_array_equal(w.raw, t.data)
    np.testing.assert_array_equal(w.rows(0, 8), pack(t).rows(0, 8))
    if Path("/proc/self/smaps").exists():  # copied: the file's pages left resident memory
        resident = _resident_kb(path.resolve())
        assert resident == 0 if place == "memory" else resident >= t.data.nbytes >> 10


def test_mlx_affine_groups_of_64():
    from inference.formats.affine import pack_codes

    r = np.random.default_rng(5)
    codes = r.integers(0, 16, size=(40, 256), dtype=np.uint8)
    scales = (r.random((40, 4)) * 0.1).astype(np.float16)
    biases = (r.standard_normal((40, 4)) * 0.1).astype(np.float16)
    t = TensorData("w", (40, 256), "MLX", pack_codes(codes, 4),
                   {"scales": scales, "biases": biases, "group_size": 64, "bits": 4})
    w = pack(t)
    assert isinstance(w, PackedWeight) and w.bits == 4
    np.testing.assert_allclose(unpack(w), dequantize(t), atol=1e-6)


def test_mlx_8_bit_codes_are_stored_signed_with_the_bias_moved():
    """One 8-bit kernel for every type (pack.py): MLX's codes 0..255 become -128..127 and
    the bias takes 128 scales; the weights stay those of the file (float32 rounding of
    the moved bias: 2^-24 of it, hence the tolerance)."""
    t = _mlx_tensor(8, 40, 256, seed=9)
    t.data[:, :2] = np.array([0, 0xFFFFFFFF], dtype=np.uint32)  # codes 0 x4, 255 x4
    w = pack(t)
    assert isinstance(w, PackedWeight) and w.codes.dtype == np.int8
    want = dequantize(t)
    np.testing.assert_allclose(unpack(w), want, rtol=0, atol=2e-7 * np.abs(want).max())


# --- linear / embedding ------------------------------------------------------------------------

def _float_tensor(qtype: str, rows: int, n: int, seed: int) -> TensorData:
    v = randn(rows, n, seed=seed)
    if qtype == "F16":
        return TensorData("w", (rows, n), "F16", v.astype(np.float16))
    return TensorData("w", (rows, n), "BF16", (v.view(np.uint32) >> 16).astype(np.uint16))


def _tensor(qtype: str, rows: int, n: int, seed: int) -> TensorData:
    if qtype in ("F16", "BF16"):
        return _float_tensor(qtype, rows, n, seed)
    return random_tensor(qtype, rows, n, seed=seed)


@pytest.mark.parametrize("qtype", PACKED + RAW + ("F16", "BF16"))
@pytest.mark.parametrize("rows", [1, 3, 20])  # mat-vec kernels, and dequant + BLAS
def test_linear_matches_reference(qtype, rows):
    t = _tensor(qtype, 70, 512, seed=3)
    x = randn(1, rows, 512, seed=4)
    bias = randn(70, seed=5)
    want = N.linear(x, N.weight(t), bias)
    got = C.linear(x, C.weight(t), bias)
    assert got.shape == (1, rows, 70)
    assert_matmul_close(got, want)


def _mlx_tensor(bits: int, rows: int, n: int, seed: int) -> TensorData:
    from inference.formats.affine import pack_codes

    r = np.random.default_rng(seed)
    codes = r.integers(0, 1 << bits, size=(rows, n), dtype=np.uint8)
    scales = (r.random((rows, n // 64)) * 0.1).astype(np.float16)
    biases = (r.standard_normal((rows, n // 64)) * 0.1).astype(np.float16)
    return TensorData("w", (rows, n), "MLX", pack_codes(codes, bits),
                      {"scales": scales, "biases": biases, "group_size": 64, "bits": bits})


@pytest.mark.parametrize("mode", ["float", "int16", "int8"])
@pytest.mark.parametrize("qtype", PACKED + RAW + ("MLX4", "MLX5", "MLX8"))
def test_decode_rows_are_each_bitwise_the_row_alone(qtype, mode):
    """The server's continuous batching feeds several sequences' tokens through one mat-vec
    call; each row must come out exactly as it does alone (scheduler.py), for every layout
    and activation mode: the one-row kernels, the shared-conversion kernel for pairs of
    rows, the odd row, the integer kernels (groups of 8, 4, 2, 1 on AVX-512, of 2, 1 on
    AVX2; kdot.py's 4, 2, 1 for RAW). Every batch size up to MATVEC_ROWS, so every mix
    of groups is taken (7 = 4 + 2 + 1)."""
    b = C if mode == "float" else CpuBackend(mode)
    if b.activations != mode:
        pytest.skip(f"{mode} activations need x86 AVX2")
    t = (_mlx_tensor(int(qtype[3]), 70, 512, seed=7) if qtype.startswith("MLX")
         else _tensor(qtype, 70, 512, seed=7))
    w = b.weight(t)
    x = randn(MATVEC_ROWS, 512, seed=8) * 3
    alone = [b.linear(x[i:i + 1], w)[0] for i in range(MATVEC_ROWS)]
    for rows in range(2, MATVEC_ROWS + 1):
        got = b.linear(x[:rows], w)
        for i in range(rows):
            np.testing.assert_array_equal(got[i], alone[i], err_msg=f"row {i} of {rows}")


@pytest.mark.parametrize("qtype", RAW + ("F16", "BF16"))
def test_file_byte_kernels_decode_exactly(qtype):
    """raw.py's block decoders repeat quants.py's float32 arithmetic: equal bit for bit."""
    t = _tensor(qtype, 5, 512, seed=11)
    w = C.weight(t)
    assert isinstance(w, RawWeight) and w.code is not None
    np.testing.assert_array_equal(w.rows(1, 4), dequantize(t)[1:4])


def test_float_rows_off_the_kernel_run_take_the_numpy_path():
    t = _float_tensor("F16", 6, 100, seed=12)  # 100 values: no whole number of 64-runs
    w = C.weight(t)
    assert isinstance(w, RawWeight) and w.code is None
    x = randn(1, 1, 100, seed=13)
    assert_matmul_close(C.linear(x, w), N.linear(x, N.weight(t)))


@pytest.mark.parametrize("qtype", PACKED + RAW)
def test_embedding_rows(qtype):
    t = random_tensor(qtype, 70, 256, seed=6)
    ids = np.array([[0, 69, 31, 32]])
    np.testing.assert_array_equal(C.embedding(C.weight(t), ids), N.embedding(N.weight(t), ids))


def test_dense_weights_are_copies_not_file_views():
    backing = randn(4, 8)
    w = C.dense(TensorData("n", (4, 8), "F32", backing))
    assert not np.shares_memory(w, backing)


# --- fused ops -------------------------------------------------------------------------------

def test_norms_and_activations():
    x = randn(2, 5, 64, seed=7) * 3
    w, b = randn(64, seed=8), randn(64, seed=9)
    np.testing.assert_allclose(C.rms_norm(x, w, 1e-5), N.rms_norm(x, w, 1e-5), atol=1e-5)
    np.testing.assert_allclose(C.layer_norm(x, w, b, 1e-12), N.layer_norm(x, w, b, 1e-12),
                               atol=1e-5)
    np.testing.assert_allclose(C.gelu(x), N.gelu(x), atol=1e-5)
    g2 = randn(2, 5, 64, seed=10) * 20  # large |gate|: exp clamps must not overflow
    np.testing.assert_allclose(C.silu_mul(g2, x), N.silu_mul(g2, x), atol=1e-4)


@pytest.mark.parametrize("offset", [0, 37, 3000])
def test_rope(offset):
    x = randn(1, 3, 4, 64, seed=11)
    np.testing.assert_allclose(C.rope(x, offset, 1e5), N.rope(x, offset, 1e5), atol=1e-5)


@pytest.mark.parametrize("t,s,offset", [(1, 9, 8), (6, 6, 0), (4, 10, 6)])
def test_attention_causal_gqa(t, s, offset):
    q = randn(1, 9, t, 64, seed=12)
    cache = np.zeros((1, 3, 16, 64), dtype=np.float32)  # like the KV cache: a narrowed buffer
    cache[:, :, :s] = randn(1, 3, s, 64, seed=13)
    k = cache[:, :, :s]
    v = randn(1, 3, s, 64, seed=14)
    want = N.attention(q, k, v, 0.125, causal_offset=offset)
    np.testing.assert_allclose(C.attention(q, k, v, 0.125, causal_offset=offset), want,
                               atol=1e-5)


@pytest.mark.parametrize("t,offset,heads,kv_dtype", [
    (13, 0, (9, 3), np.float32),  # a tail of one row past the blocks of four
    (16, 5, (4, 4), np.float32),  # keys before the new rows (a prefill chunk after others)
    (30, 17, (9, 3), np.float16),  # a float16 cache: bits widened by the kernel
])
def test_prefill_attention_on_two_threads(t, offset, heads, kv_dtype):
    """A prefill's attention on two threads, after products on numba's threads, is the
    numba kernel (each row against its own keys, read from the cache buffer); after
    products shared out to the workers (a float32 weight) it keeps BLAS on the workers, so
    one prefill keeps to one pool. Within float32 rounding of NumPy's masked softmax;
    a row's bits do not depend on how its rows are split between threads (a row's sums
    run in an order fixed by its place in its block of four, whatever the split: parts 1,
    2 and 3 give the same bits). One thread keeps the grouped BLAS GEMMs."""
    from inference.backends.cpu import attention as cpu_attend
    from inference.backends.cpu import backend as cpu_mod

    hq, hk = heads
    s = offset + t
    q = randn(1, hq, t, 64, seed=40)
    cache = np.zeros((2, 1, hk, s + 7, 64), dtype=kv_dtype)  # a buffer with spare rows
    cache[:, :, :, :s] = randn(2, 1, hk, s, 64, seed=41)
    k, v = cache[0, :, :, :s], cache[1, :, :, :s]
    want = N.attention(q, k.astype(np.float32), v.astype(np.float32), 0.125,
                       causal_offset=offset)
    b = _two_threads()
    if not b._numba_prefill():
        pytest.skip("prefill runs on numba's threads on AVX-512 VNNI only")
    calls = []
    kernel = cpu_attend.attend_prefill

    def spy(*args):
        calls.append(args[-1])
        kernel(*args)

    x = randn(1, 16, 256, seed=42)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.attn, "attend_prefill", spy)
        b.linear(x, b.weight(random_tensor("Q4_0", 512, 256, seed=43)))  # numba's threads
        got = b.attention(q, k, v, 0.125, causal_offset=offset)
        b.linear(x, randn(512, 256, seed=44))  # float32: the workers' sgemm
        blas = b.attention(q, k, v, 0.125, causal_offset=offset)
        b.linear(x, b.weight(random_tensor("Q4_0", 512, 256, seed=43)))
        b.set_threads(1)
        one = b.attention(q, k, v, 0.125, causal_offset=offset)
    assert calls == [2]  # not after the float32 product, nor on one thread
    np.testing.assert_allclose(blas, want, atol=2e-6)
    # Sums of 64 products and softmax over <= 47 keys, float32: NumPy's differ in order.
    np.testing.assert_allclose(got, want, atol=2e-6)
    np.testing.assert_allclose(one, want, atol=2e-6)
    qh = np.ascontiguousarray(q[0])
    kb, vb = (a[0].view(np.uint16) if kv_dtype == np.float16 else a[0]
              for a in (cache[0], cache[1]))
    outs = []
    for parts in (1, 2, 3):
        out = np.empty((t, hq, 64), dtype=np.float32)
        kernel(qh, kb, vb, offset, 0.125, out, parts)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[0], got[0].transpose(1, 0, 2))


@pytest.mark.parametrize("op", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("rows", [1, 3, 8, 200])  # decode rows, and a prefill's (shared out)
def test_act_mul_reads_the_stacked_gate_up_in_place(rows, op):
    """gate and up as column views of one stacked product (rows strided): the bits of
    contiguous copies, the NumPy backend's values (float32 rounding of a different formula:
    the fused GELU is g * sigmoid(2 * inner), NumPy's 0.5 * g * (1 + tanh(inner))), a
    prefill's row the bits of that row alone, and one call on a captured step's tape."""
    from inference.backends.cpu.replay import Tape

    b = CpuBackend()  # the machine's threads: a prefill's is shared out where there are 2+
    y = randn(1, rows, 2 * 1536, seed=48) * np.float32(3)  # GELU's tails as well
    gate, up = y[..., :1536], y[..., 1536:]
    act = getattr(b, op)
    want = act(np.ascontiguousarray(gate), np.ascontiguousarray(up))
    np.testing.assert_array_equal(act(gate, up), want)
    np.testing.assert_allclose(want, getattr(N, op)(gate, up), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(act(gate[:, -1:], up[:, -1:]), want[:, -1:])
    if rows <= MATVEC_ROWS:
        tape = b._tape = Tape(0)
        try:
            act(gate, up)
        finally:
            b._tape = None
        assert len(tape.calls) == 1


def test_prefill_silu_follows_the_products_pool():
    """A prefill's SiLU x up runs on numba's threads after products that ran there, and is
    shared out to the workers after products that were (a float32 weight): one pool per
    prefill. Either way the values of the one-thread kernel."""
    from inference.backends.cpu import backend as cpu_mod

    b = _two_threads()
    if not b._numba_prefill():
        pytest.skip("prefill runs on numba's threads on AVX-512 VNNI only")
    x = randn(1, 16, 256, seed=45)
    gate, up = randn(1, 200, 1536, seed=46), randn(1, 200, 1536, seed=47)  # past SHARE_MIN
    want = N.silu_mul(gate, up)
    seen = []
    chunks, share = cpu_mod.fused.silu_mul_chunks, b._share

    def spy_chunks(*args):
        seen.append("numba")
        chunks(*args)

    def spy_share(*args, **kw):
        seen.append("workers")
        share(*args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.fused, "silu_mul_chunks", spy_chunks)
        b.linear(x, b.weight(random_tensor("Q4_0", 512, 256, seed=43)))
        mp.setattr(b, "_share", spy_share)
        on_numba = b.silu_mul(gate, up)
        assert seen == ["numba"]
        b.linear(x, randn(512, 256, seed=44))  # its own share-out to the workers
        seen.clear()
        on_helpers = b.silu_mul(gate, up)
    assert seen == ["workers"]
    np.testing.assert_allclose(on_numba, want, atol=1e-5)
    np.testing.assert_array_equal(on_numba, on_helpers)


def test_attention_key_mask():
    q, k, v = (randn(3, 4, 7, 32, seed=s) for s in (15, 16, 17))
    mask = (np.arange(7)[None, :] < np.array([[7], [3], [1]])).astype(np.float32)
    want = N.attention(q, k, v, 0.2, key_mask=mask)
    np.testing.assert_allclose(C.attention(q, k, v, 0.2, key_mask=mask), want, atol=1e-5)


def _packed_inputs(lens: list[int], heads: int, d: int, seed: int):
    """q, k, v (1, N, heads * d) of inputs of ``lens`` tokens back to back, as column
    ranges of one fused product (as bert's q/k/v), and their row offsets."""
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    y = randn(1, int(starts[-1]), 3 * heads * d, seed=seed)
    hd = heads * d
    return y[..., :hd], y[..., hd:2 * hd], y[..., 2 * hd:], starts


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("lens", [[7, 3, 1, 5], [1], [12, 12]])
def test_attention_packed_matches_each_input_alone(lens, tiled, monkeypatch):
    if tiled:  # scores over the query-tile budget: the padded batch through attention()
        monkeypatch.setattr("inference.backends.cpu.backend.query_tiles",
                            lambda *a: [(0, 1), (1, 2)])
    q, k, v, starts = _packed_inputs(lens, 4, 32, seed=18)
    want = np.zeros(q.shape, dtype=np.float32)
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        q1, k1, v1 = (x[:, a:b].reshape(1, b - a, 4, 32).transpose(0, 2, 1, 3)
                      for x in (q, k, v))
        o = N.attention(q1, k1, v1, 0.2)
        want[:, a:b] = o.transpose(0, 2, 1, 3).reshape(1, b - a, 128)
    # the cpu backend's own kernel, not the base class's composite it would inherit
    assert type(C).attention_packed is not type(N).attention_packed
    np.testing.assert_allclose(C.attention_packed(q, k, v, 4, 0.2, starts), want, atol=1e-5)
    # the base class's composite (every backend without a fused one) computes the same
    np.testing.assert_allclose(N.attention_packed(q, k, v, 4, 0.2, starts), want, atol=1e-6)


def test_fused_linear_gelu_and_add_norm():
    x, res = randn(2, 5, 64, seed=19), randn(2, 5, 48, seed=20)
    w1, b1 = randn(96, 64, seed=21) * 0.2, randn(96, seed=22)
    w2, b2 = randn(48, 64, seed=23) * 0.2, randn(48, seed=24)
    nw, nb = randn(48, seed=25), randn(48, seed=26)
    np.testing.assert_allclose(C.linear_gelu(x, w1, b1), N.gelu(N.linear(x, w1, b1)),
                               atol=1e-5)
    want = N.layer_norm(N.add(N.linear(x, w2, b2), res), nw, nb, 1e-12)
    np.testing.assert_allclose(C.linear_add_norm(x, w2, b2, res, nw, nb, 1e-12), want,
                               atol=1e-5)
    want = N.layer_norm(N.add(N.linear(x, w2), res), nw, nb, 1e-12)  # no bias (nomic)
    np.testing.assert_allclose(C.linear_add_norm(x, w2, None, res, nw, nb, 1e-12), want,
                               atol=1e-5)


# --- real models: the parity bars, against the goldens and the NumPy backend --------

def _load(name: str):
    return load_bundled(name, backend="cpu")


@pytest.fixture(scope="module")
def smollm2_cpu():
    return _load("SmolLM2-135M-Instruct.Q4_1")


@pytest.fixture(scope="module")
def prose_cpu_logits(smollm2_cpu):
    """The cpu backend's logits over the prose golden: scored against transformers and
    against NumPy below, computed once."""
    logits = smollm2_cpu.logits([int(i) for i in g.load_smollm2()["texts"]["prose"]["ids"]])
    logits.setflags(write=False)  # shared: no test may change it
    return logits


@pytest.mark.parametrize("name", ["chat", "code", "prose"])
def test_smollm2_matches_transformers(smollm2_cpu, name, request):
    text = g.load_smollm2()["texts"][name]
    logits = (request.getfixturevalue("prose_cpu_logits") if name == "prose"
              else smollm2_cpu.logits(list(text["ids"])))
    agree, dlogp = g.smollm2_agreement(text, logits)
    assert agree >= g.SMOLLM2_MIN_TOP1_AGREEMENT, (name, agree)
    assert dlogp <= g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1, (name, dlogp)


def test_smollm2_logits_match_numpy(prose_cpu_logits, smollm2_prose_logits):
    got, want = prose_cpu_logits, smollm2_prose_logits
    assert float((got.argmax(-1) == want.argmax(-1)).mean()) >= g.SMOLLM2_MIN_TOP1_AGREEMENT
    # The prefill's 4-bit products take int16 activations (each group of 32 rounded to
    # 1/32767 of its largest |x|, quantize.py), as decode does: measured 6.0e-3 on logits of
    # up to ~20 (below 5e-3 with float32 activations, dequant+sgemm).
    assert np.abs(got - want).max() < 1e-2


def test_smollm2_decode_steps_match_numpy(smollm2_cpu, smollm2):
    from inference.generate import generate_step
    from inference.sampling import SamplingParams

    ids = smollm2.tokenize("The three primary colours are")
    steps = [generate_step(m.model, ids, SamplingParams(temperature=0.0),
                           np.random.default_rng(0), max_len=64) for m in (smollm2_cpu, smollm2)]
    got = [next(steps[0]) for _ in range(24)]  # mat-vec kernels, one-token attention
    want = [next(steps[1]) for _ in range(24)]
    assert float(np.mean(np.array(got) == np.array(want))) >= 0.99


def test_smollm2_weights_stay_quantized(smollm2_cpu):
    held = sum(w.nbytes for layer in smollm2_cpu.model.layers
               for w in ([part[0] for part in layer.attn.qkv.parts + layer.mlp.gate_up.parts]
                         + [layer.attn.o_proj, layer.mlp.down]))
    held += smollm2_cpu.model.embed_tokens.nbytes
    assert held <= 1.25 * smollm2_cpu.spec.file_size  # measured 1.17x


def test_minilm_matches_sentence_transformers():
    model = _load("all-MiniLM-L6-v2")
    gold = g.load_minilm()
    vecs = model.embed(gold["sentences"], batch_size=16)
    assert g.cosine_rows(vecs, gold["embeddings"]).min() >= g.MINILM_MIN_COSINE


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
def test_minilm_packed_rows_match_padded_batches(pooling):
    """The cpu backend packs a batch's tokens without padding (Model.packed); the same
    batches padded with a key mask give the same vectors (summation order differs)."""
    import dataclasses

    model = _load("all-MiniLM-L6-v2")
    assert model.model.packs
    sentences = g.load_minilm_sentences()[:40]
    model.pipeline = dataclasses.replace(model.pipeline, pooling=pooling)
    try:
        packed = model.embed(sentences, batch_size=16, batching="fixed")
        model.backend.packs_rows = False  # on the instance: this model only
        padded = model.embed(sentences, batch_size=16, batching="fixed")
    finally:
        model.backend.__dict__.pop("packs_rows", None)
        model.pipeline = dataclasses.replace(model.pipeline, pooling="mean")
    np.testing.assert_allclose(packed, padded, atol=1e-5)


# --- independent calls side by side (map_calls) ---------------------------------------------

def _blas_threads(_: object = None) -> int:
    from threadpoolctl import threadpool_info

    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


def _two_threads(activations: str | None = None) -> CpuBackend:
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: map_calls runs calls one after another")
    b = CpuBackend(activations)
    b.set_threads(2)
    return b


def test_map_calls_side_by_side_in_order_with_single_threaded_blas():
    import threading
    import time

    b = _two_threads()
    seen: list[tuple[int, int]] = []

    def call(i: int) -> int:
        time.sleep(0.02 * (4 - i))  # early items finish last
        seen.append((threading.get_ident(), _blas_threads()))
        return i * i

    before = _blas_threads()
    assert list(b.map_calls(call, range(4))) == [0, 1, 4, 9]
    assert len({t for t, _ in seen}) == 2 and {n for _, n in seen} == {1}
    assert _blas_threads() == before


def test_map_calls_share_the_cores_out_among_fewer_calls():
    """Each call's own share-outs (prefill products, attention heads) may use its part of
    the cores: 2 calls on 4 cores, 2 each; 5 calls, 1 each (BLAS itself stays on the
    calling thread: OPENBLAS_NUM_THREADS=1, inference/__init__)."""
    b = _two_threads()
    b._threads = 4  # as on a 4-core machine (set_threads caps at the host's cores)

    def parts(_: object) -> int:
        return min(b._local.cores, 8)

    assert list(b.map_calls(parts, range(2))) == [2, 2]
    assert list(b.map_calls(parts, range(5))) == [1] * 5  # 4 calls in flight


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_K"])  # dequant scratch: packed and raw
def test_concurrent_prefill_linears_match_serial(qtype):
    b = _two_threads()
    w = b.weight(random_tensor(qtype, 96, 256, seed=3))
    xs = [randn(40, 256, seed=s) for s in range(6)]
    want = [b.linear(x, w) for x in xs]
    # Serial calls run sgemm on 2 BLAS threads, concurrent ones on 1 each: OpenBLAS may pick
    # another kernel or K-split per thread count, so sums differ in rounding (~1e-4 relative
    # on a few elements on an AMD EPYC). A race would give unrelated values, far outside a
    # float32 rounding bound for K=256 scaled to the output's magnitude.
    for got, ref in zip(b.map_calls(lambda x: b.linear(x, w), xs), want, strict=True):
        assert_matmul_close(got, ref)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q6_K"])  # packed 4-, 5-, 8-bit
def test_prefill_integer_products_run_the_decode_kernel_on_numbas_threads(qtype):
    """4/5/8-bit prefill products go by the integer decode kernel over all the token rows
    in one call from the caller's thread, numba at the backend's 2 threads (the weight's
    tiles split between them: 1000 output rows are 31.25 tiles; K=768; 24 token rows in
    groups of 8), and not to the worker threads. Every row is the bits the decode mat-vec
    gives it alone: the same kernel, integer sums exact in any order, a row the same bits
    in any group. Against NumPy over the quantized activations, with the tolerance of every
    product (summation order)."""
    import numba

    from inference.backends.cpu import backend as cpu_mod
    from inference.backends.cpu import matvec_int as cpu_int
    from tests.test_cpu_idot import _dequantized

    b = _two_threads()
    t = random_tensor(qtype, 1000, 768, seed=7)
    x = randn(1, 24, 768, seed=8)
    w = b.weight(t)
    if b._prefill_route(w) != "integer":
        assert (not cpu_int.vnni_groups() or b.activations == "float"
                or not cpu_mod._concurrent_kernels())
        pytest.skip("prefill takes the integer kernels on AVX-512 VNNI only (and a "
                    "numba threading layer that runs kernels on two threads at once)")
    seen = []
    name = "matvec_packed_int"
    kernel = getattr(cpu_int, name)

    def spy(*args):
        seen.append((threading.get_ident(), numba.get_num_threads(), args[-1].shape[0]))
        kernel(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.matvec_int, name, spy)
        mp.setattr(b, "_share", lambda *a, **k: pytest.fail("a share-out to the workers"))
        got = b.linear(x, w)
    assert seen == [(threading.get_ident(), 2, 24)]
    alone = np.concatenate([b.linear(x[:, i:i + 1], w) for i in range(24)], axis=1)
    np.testing.assert_array_equal(got, alone)
    assert_matmul_close(got, N.linear(_dequantized(x[0], b.activations)[None], N.weight(t)))
    assert numba.get_num_threads() == 2  # the caller's count back after the products


def test_integer_products_of_one_input_quantize_it_once_per_storage():
    """q/k/v of 4-, 5- and 8-bit types in one ``linears``: the input is quantized once per
    activation storage (the 4- and 5-bit kernels may share one), each kernel then reads
    those rows; each output is the bits of its linear alone."""
    from inference.backends.cpu import backend as cpu_mod
    from inference.backends.cpu import quantize as cpu_quantize

    b = _two_threads()
    ws = [b.weight(random_tensor(q, 1000, 768, seed=s))
          for s, q in enumerate(("Q4_1", "Q5_0", "Q6_K"))]
    if any(b._prefill_route(w) != "integer" for w in ws):
        pytest.skip("prefill takes the integer kernels on AVX-512 VNNI only")
    x = randn(24, 768, seed=8)
    seen = []
    inner = cpu_quantize.quantize_rows

    def spy(x_, width, narrow=True):
        seen.append((x_.shape, narrow))
        return inner(x_, width, narrow)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.quantize, "quantize_rows", spy)
        got = b.linears(x, [(w, None) for w in ws])
    storages = {cpu_quantize.narrow(b.activations, w.bits) for w in ws}
    assert sorted(seen) == sorted(((24, 768), n) for n in storages)
    for y, w in zip(got, ws, strict=True):
        np.testing.assert_array_equal(y, b.linear(x, w))


@pytest.mark.parametrize("qtype", ["Q6_K", "Q3_K"])  # packed 8-bit, raw bytes
def test_prefill_products_shared_between_threads(qtype):
    """Each thread dequantizes and multiplies its own part of W's rows (BLAS at one thread
    meanwhile): an uneven split (1000 rows: 31.25 tiles of 32; K=768) against the NumPy
    backend. Tolerance as every prefill product: sgemm's rounding depends on its blocking.
    Packed weights take this route with float activations (or without AVX-512 VNNI)."""
    from inference.backends.cpu import backend as cpu_mod

    b = _two_threads("float" if qtype == "Q6_K" else None)
    t = random_tensor(qtype, 1000, 768, seed=7)
    assert 1000 * 768 >= cpu_mod.SHARE_MIN  # shared, not one chunk on the caller
    x = randn(1, 24, 768, seed=8)
    want = N.linear(x, N.weight(t))
    seen = []
    w = b.weight(t)
    inner = cpu_mod.CpuBackend._buffer

    def buffer(self, n):  # which threads dequantized, and BLAS's threads while they did
        seen.append((threading.get_ident(), _blas_threads()))
        return inner(self, n)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.CpuBackend, "_buffer", buffer)
        got = b.linear(x, w)
    assert_matmul_close(got, want)
    assert len({t for t, _ in seen}) == 2 and {n for _, n in seen} == {1}
    b.set_threads(1)
    assert_matmul_close(b.linear(x, w), want)


def test_resident_memory_after_loading_smollm2_within_the_rule():
    """The memory rule, in a fresh process: what a load adds to RSS <= 1.5x the file (no KV
    cache is allocated at load). Backend libraries are imported first, as in `inferdesk
    bench`. Shared libraries' pages are left out: the code a load first runs (numba's LLVM
    alone is ~68 MiB) is a cost of the process, not of the model, and is shared with other
    processes. The packed store is resident after load (read into memory, or mapped and
    populated)."""
    import json
    import subprocess
    import sys

    script = (
        "import gc, json\n"
        "from inference.backends.base import host_rss\n"
        "from inference.bench import _import_backends\n"
        "from inference.store import resolve\n"
        "from inference import load_model\n"
        "_import_backends('cpu')\n"
        "spec = resolve('SmolLM2-135M-Instruct.Q4_1')\n"
        "import psutil\n"
        "def own():\n"
        "    libs = sum(m.rss for m in psutil.Process().memory_maps() if '.so' in m.path)\n"
        "    return host_rss() - libs\n"
        "gc.collect(); r0 = own()\n"
        "m = load_model(spec, backend='cpu')\n"
        "gc.collect()\n"
        "print(json.dumps({'delta': own() - r0, 'file': spec.file_size}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    if "ModelNotFoundError" in out.stderr:
        pytest.fail(f"SmolLM2 is not installed; {INSTALL_HINT}", pytrace=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["delta"] <= 1.5 * got["file"], got["delta"] / got["file"]


@pytest.mark.parametrize("user_features", [None, "+sse2"])
def test_wide_vectors_on_avx512_unless_the_user_chose(user_features):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME")}
    if user_features:
        env["NUMBA_CPU_FEATURES"] = user_features
    code = ("import numba, llvmlite.binding as ll\n"
            "import inference.backends.cpu.features as cpu_features\n"
            "print('+avx512f' in ll.get_host_cpu_features().flatten().split(','))\n"
            "print(cpu_features.arm_cpu_has_dotprod())\n"
            "print(numba.config.CPU_FEATURES)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    avx512, dotprod, features = out.stdout.strip().splitlines()
    if user_features:
        assert features == user_features
    elif avx512 == "True":
        assert features.endswith(",-prefer-256-bit")
    elif dotprod == "True":  # an ARM host (the emulated one in scripts/arm64_emulated.sh)
        assert features.endswith("+dotprod")
    else:
        assert features == "None"


@pytest.mark.parametrize(("host", "dotprod", "user", "want"), [
    ("-aes,-rand,-sha2,-sve", True, None, "-aes,-rand,-sha2,-sve,+dotprod"),  # qemu's
    ("", True, None, "+dotprod"),
    ("+neon,+dotprod", True, None, None),  # LLVM listed it: nothing to add
    ("+neon,+sha2", False, None, None),  # an ARMv8.0 core (Cortex-A72, say)
    ("+neon,+sha2", True, "+neon", "+neon"),  # the user's NUMBA_CPU_FEATURES wins
])
def test_arm_dot_product_detected_at_run_time(monkeypatch, host, dotprod, user, want):
    """On ARM the OS's report of the dot-product extension (LLVM's host features omit it)
    becomes +dotprod in the target numba compiles for, and backend_reason says so. The
    architecture, the host string and the OS's answer are forced: this runs on x86 too."""
    import numba

    from inference.backends.cpu import features as cpu_features

    monkeypatch.setattr(cpu_features, "_arch", lambda: "arm")
    monkeypatch.setattr(cpu_features, "host_cpu_features", lambda: host)
    monkeypatch.setattr(cpu_features, "arm_cpu_has_dotprod", lambda: dotprod)
    monkeypatch.setattr(numba.config, "CPU_FEATURES", user)
    monkeypatch.setattr(numba.config, "CPU_NAME", None)
    cpu_features._tune_target()
    assert numba.config.CPU_FEATURES == want
    assert cpu_features.target_isa() == ("ARM NEON with dot product" if "+dotprod" in (want or host)
                              else "ARM NEON")


@pytest.mark.parametrize(("features", "isa"), [
    ("+avx2,+fma,-avx512f", "AVX2"),
    ("+avx2,+avxvnni,-avx512f", "AVX2 with AVX-VNNI"),
    ("+avx2,+avx512f,+avx512vl,-avx512vnni", "AVX-512"),
    ("+avx2,+avx512f,+avx512vl,+avx512vnni,-prefer-256-bit", "AVX-512 with VNNI (512-bit vectors)"),
    ("+sse2,-avx2", "no AVX2"),
])
def test_backend_reason_names_the_target_isa(monkeypatch, features, isa):
    import numba

    from inference.backends.cpu import features as cpu_features

    monkeypatch.setattr(cpu_features, "_arch", lambda: "x86")  # x86 feature strings, on any host
    monkeypatch.setattr(numba.config, "CPU_FEATURES", features)
    assert cpu_features.target_isa() == isa
    monkeypatch.undo()
    assert cpu_features.target_isa() in probe()[1]


@pytest.mark.parametrize(("features", "isa"), [
    ("+neon,+fp-armv8,+dotprod", "ARM NEON with dot product"),
    ("+neon,+fp-armv8,-dotprod", "ARM NEON"),
    ("+avx2,+f16c,+fma", "ARM NEON"),  # x86 names in an ARM string enable nothing x86
])
def test_backend_reason_on_arm_names_neon_and_the_lane_kernels(monkeypatch, features, isa):
    """An aarch64 target (forced here, so this runs on x86 too): backend_reason says ARM
    NEON, whether LLVM reports the dot-product extension, that float16 converts natively,
    and that the integer dots run lane by lane (the pair forms are x86 code; the
    Q2_K/Q3_K file-byte ones too)."""
    import numba

    from inference.backends.cpu import features as cpu_features
    from inference.backends.cpu import kdot as cpu_kdot
    from inference.backends.cpu import matvec_int as cpu_int

    monkeypatch.setattr(cpu_features, "_arch", lambda: "arm")
    monkeypatch.setattr(numba.config, "CPU_FEATURES", features)
    assert cpu_features.target_isa() == isa
    assert cpu_features.form() == "lanes" and not cpu_int.wide() and not cpu_kdot.available()
    assert CpuBackend("int16").activations == "int16"
    reason = probe()[1]
    assert (f"{isa}, native float16 converts, integer dot products over int16 activations "
            "(lane by lane)") in reason


GENERIC_CHECK = """
import hashlib
import numpy as np
from tests.test_backend_cpu import LANE_TYPES, lane_rows_alone
from numba import njit
from inference.backends.cpu import CpuBackend, probe
from inference.backends.cpu.features import target_has_f16c
from inference.backends.cpu.ir import _half
from inference.backends.numpy_backend import NumpyBackend
from tests.bundled import random_tensor

assert not target_has_f16c()
assert "integer float16 converts" in probe()[1]

@njit
def widen(bits, out):
    for i in range(bits.shape[0]):
        out[i] = _half(bits[i])

bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
got = np.empty(len(bits), dtype=np.float32)
widen(bits, got)
want = bits.view(np.float16).astype(np.float32)
nan = np.isnan(want)
assert (np.isnan(got) == nan).all()
assert (got[~nan].view(np.uint32) == want[~nan].view(np.uint32)).all()

x = np.random.default_rng(0).standard_normal((1, 3, 256)).astype(np.float32)
N = NumpyBackend()
for C in (CpuBackend("float"), CpuBackend("int16")):
    for qtype in ("Q4_1", "Q6_K", "Q5_K"):  # float16 scales: packed 4-bit, packed 8-bit, raw
        t = random_tensor(qtype, 64, 256, seed=1)
        want = N.linear(x, N.weight(t))
        for rows in (x, x[:, :1]):  # prefill (dequant + BLAS) and decode (mat-vec)
            got = C.linear(rows, C.weight(t))
            ref = want[:, : rows.shape[1]]
            # int16: activations rounded to 16 bits a group (exact checks: test_cpu_idot.py)
            tol = 1e-5 if C.activations == "float" else 1e-3
            np.testing.assert_allclose(got, ref, rtol=0, atol=tol * float(np.abs(ref).max()))

# No AVX2: the lane kernels (cpu_features.form()). Each row alone and in batches of 2-8; the
# bits of the rows alone go to the host, to compare with its own kernels'.
from inference.backends.cpu import features as cpu_features
assert cpu_features.form() == "lanes" and "integer dot products over int16" in probe()[1]
for mode in ("int16", "int8"):
    C = CpuBackend(mode)
    for qtype in LANE_TYPES:
        xs, w, alone = lane_rows_alone(C, qtype)
        for rows in range(2, 9):
            assert (C.linear(xs[:rows], w).view(np.uint32)
                    == alone[:rows].view(np.uint32)).all(), (mode, qtype, rows)
        print("bits", mode, qtype, hashlib.sha256(alone.tobytes()).hexdigest())
print("generic ok")
"""
LANE_TYPES = ("Q4_1", "Q5_K", "Q8_0", "Q6_K")  # 4- and 5-bit, 8-bit signed, Q6_K's sub-scales


def lane_rows_alone(b: CpuBackend, qtype: str) -> tuple[np.ndarray, Any, np.ndarray]:
    """The generic-x86 check's input rows, weight and each row's linear computed alone."""
    x = np.random.default_rng(8).standard_normal((8, 512)).astype(np.float32) * 3
    w = b.weight(random_tensor(qtype, 70, 512, seed=7))
    return x, w, np.concatenate([b.linear(x[i:i + 1], w) for i in range(8)])


def _generic_steps(tmp: Path) -> list[early.Step] | str:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "the generic-x86 target is for x86"
    # a cache of its own: this target's entries beside the host's would race on their index
    return [early.python(GENERIC_CHECK, NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES=None,
                         NUMBA_CACHE_DIR=str(tmp))]


@pytest.mark.early(steps=_generic_steps)
def test_kernels_compile_and_match_for_a_generic_x86_cpu(request):
    """NUMBA_CPU_NAME=generic (an old laptop's baseline x86-64, no F16C): the float16
    widening falls back to integer ops, exact for all 65,536 inputs, and the mat-vecs still
    match NumPy. Before, LLVM emitted a call to a runtime routine the JIT could not link: a crash.
    There the mat-vecs take the lane kernels (no AVX2): each row alone is the same bits as
    in a batch, and as this host's own integer kernels give it (exact integer sums, the
    same float tail without FMA: matvec_int.py), for both activation widths.
    (A subprocess started early in the run: tests/early.py.)"""
    import hashlib

    (out,) = early.result(request.node)
    assert out.returncode == 0 and "generic ok" in out.stdout, out.stderr[-3000:]
    theirs = {tuple(line.split()[1:3]): line.split()[3] for line in out.stdout.splitlines()
              if line.startswith("bits ")}
    assert len(theirs) == 2 * len(LANE_TYPES), out.stdout
    for (mode, qtype), digest in theirs.items():
        ours = lane_rows_alone(CpuBackend(mode), qtype)[2]
        assert hashlib.sha256(ours.tobytes()).hexdigest() == digest, (mode, qtype)
