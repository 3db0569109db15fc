"""F16 and BF16 checkpoint weights stay 16-bit on the device (mmv.cu mul_mat_vec_h_*).

Kernel parity: against float64 on the exact widened weights, |y - ref| <= 1e-5 sum|w||x|
+ 1e-6 (widening F16/BF16 to float32 is exact, so only float32 summation differs), on
awkward shapes with the race check on. Model parity: a tiny Llama with F16 or BF16 weights
against the NumPy backend (which widens them to float32): the float32 bars of the other
tiny-model tests, atol/rtol 2e-4, and the same greedy tokens.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from inference.backends.cuda import CudaBackend
from inference.backends.numpy_backend import NumpyBackend
from inference.formats.quants import dequantize
from inference.formats.tensor import TensorData
from inference.generate import generate_step
from inference.models import llama
from inference.sampling import SamplingParams
from kernels.cuda import ops, plan
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.emulator.traffic import TrafficDevice
from tests.kernels.test_cuda_backend import _build, check_batched_decode, tiny_llama


def to_16bit(w: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(stored data, its exact float64 value): F16 rounds, BF16 truncates float32 bits."""
    if qtype == "F16":
        data = w.astype(np.float16)
        return data, data.astype(np.float64)
    bits = (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# (rows, cols, batch): cols % 4 == 0 takes the vector kernel (one partial 128-column step,
# several steps, a single word); odd widths take the float kernel. Rows not a multiple of
# the 4-row blocks.
SHAPES = [(1, 4, 1), (5, 132, 2), (37, 260, 1), (6, 1028, 3), (3, 7, 1), (9, 33, 2)]


@pytest.mark.parametrize("qtype", ["F16", "BF16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_16bit_mat_vec_matches_float64(qtype: str, shape: tuple) -> None:
    rows, cols, batch = shape
    rng = np.random.default_rng(rows * cols)
    dev = EmulatedDevice(check_races=True)
    data, exact = to_16bit(rng.standard_normal((rows, cols)) * 3, qtype)
    w = ops.upload_matrix(dev, data, qtype, (rows, cols))
    assert w.data.nbytes == 2 * rows * cols
    assert ops.half_vector_applies(dev, w) == (cols % 4 == 0)
    x = rng.standard_normal((batch, cols)).astype(np.float32)
    got = dev.to_host(ops.mul_mat_vec(dev, w, dev.to_device(x)))
    ref = x.astype(np.float64) @ exact.T
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(exact).T) + 1e-6
    assert (np.abs(got - ref) <= bound).all()


def test_16bit_mat_vec_loads_whole_sectors() -> None:
    # The memory model, BF16, 4 rows of 1024 (batch 1): every weight and x load of the
    # vector kernel uses whole 32-byte sectors, and it issues a quarter of the float
    # kernel's weight load instructions (8 bytes a lane instead of 2). Weights are 2
    # bytes each: half of what the float32 copy BF16 used to become reads.
    rows, cols = 4, 1024
    dev = TrafficDevice()
    w = ops.upload_matrix(dev, np.zeros((rows, cols), np.uint16), "BF16", (rows, cols))
    x = dev.to_device(np.ones((1, cols), np.float32))
    ops.mul_mat_vec(dev, w, x)
    y = dev.empty((1, rows), np.float32)  # the float kernel on the same weight, for scale
    dev.launch("mmv", "mul_mat_vec_bf16", plan.plan_mul_mat_vec(w.kt, cols, rows),
               (w.data, x, y, np.int32(cols), np.int32(rows), np.int64(w.row_bytes),
                np.int32(1), None, None))
    (wv, xv), wf = ((dev.traffic["mul_mat_vec_h_bf16"][(i, "load")] for i in (0, 1)),
                    dev.traffic["mul_mat_vec_bf16"][(0, "load")])
    assert wv.efficiency == xv.efficiency == 1.0
    assert wv.moved_per_useful == 1.0 and wv.bytes_moved == 2 * rows * cols
    assert wf.instructions == 4 * wv.instructions


def _tiny_16bit(qtype: str) -> tuple:
    """The 1-layer tiny Llama with every 2-D weight re-stored as F16 or BF16."""
    ckpt = tiny_llama("F32", embed_type="F32", layers=1)
    for name, t in list(ckpt.tensors.items()):
        if len(t.shape) == 2:
            data, _ = to_16bit(dequantize(t).reshape(t.shape), qtype)
            ckpt.tensors[name] = TensorData(t.name, t.shape, qtype, data)
    return ckpt


# F16 shares the kernel template (only the widening differs, checked above): opt-in.
@pytest.mark.parametrize("qtype", [pytest.param("F16", marks=pytest.mark.long), "BF16"])
def test_tiny_llama_with_16bit_weights_matches_numpy(qtype: str) -> None:
    # Prefill (11 tokens: the GEMM path, weights widened into the reused scratch) and
    # greedy decode (the 16-bit mat-vec), float32 cache: NumPy's float32 bars.
    N = NumpyBackend()
    ckpt = _tiny_16bit(qtype)
    C = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)
    mc, mn = _build(llama, ckpt, C), _build(llama, ckpt, N)
    for t in ckpt.tensors.values():
        if len(t.shape) == 2:
            assert C.held_bytes(t) == 2 * t.shape[0] * t.shape[1]
    ids = np.array([[1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]])
    got = C.to_numpy(mc(C.array(ids), mc.make_cache()))
    np.testing.assert_allclose(got, mn(ids, mn.make_cache()), atol=2e-4, rtol=2e-4)
    sp = SamplingParams(temperature=0.0)
    a = generate_step(mc, [1, 5, 9], sp, np.random.default_rng(0), max_len=16)
    b = generate_step(mn, [1, 5, 9], sp, np.random.default_rng(0), max_len=16)
    assert list(itertools.islice(a, 6)) == list(itertools.islice(b, 6))


def test_batched_decode_with_16bit_weights_reads_them_once_per_tile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # BF16 weights, 5 sequences in one step: the 16-bit tile-8 kernel, and each sequence
    # gets its own decode step's logits (test_cuda_backend's bar: the tiles equal the 1-row
    # kernel bitwise, test_mmv_tiles.py).
    check_batched_decode(_tiny_16bit("BF16"), "mul_mat_vec_h_b8_", monkeypatch)
