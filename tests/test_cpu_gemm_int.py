"""The integer GEMM of AVX2 prefill products (inference/backends/cpu/gemm_int.py).

Its integer sums are exact and its float tail is the decode kernels' expression in the same
order, so each row's result must be bitwise what the decode mat-vec (``matvec_int``, an
independently written loop over row pairs) gives it, for every row count (groups of 4 / 2
rows and the single-row remainder) and every tile range. Against the NumPy backend it
holds to the integer kernels' tolerance, 1e-5 of the output scale (float32 scales and
another summation order), for the activations quantized as the kernels take them.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.backends.cpu import CpuBackend, features, gemm_int
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu.layout import LANES
from inference.backends.numpy_backend import NumpyBackend
from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import TensorData
from tests.bundled import random_tensor
from tests.test_cpu_idot import _close, _dequantized

pytestmark = pytest.mark.skipif(features.form() != "avx2",
                                reason="the GEMM's multiply-adds are AVX2 intrinsics")

N = NumpyBackend()
TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K")  # 4/5/6/8-bit codes
WIDTHS = list(cpu_quantize.LEVELS)


def _gemm(w, xq, t0: int = 0, t1: int | None = None) -> np.ndarray:
    tiles = len(w.codes) // w.groups
    out = np.zeros((xq[0].shape[0], tiles * LANES), dtype=np.float32)
    gemm_int.gemm_int(w.codes, w.high, w.blocks, w.kind, w.zero, *xq, out, t0,
                      tiles if t1 is None else t1)
    return out


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_gemm_is_bitwise_the_decode_kernels(qtype, width):
    b = CpuBackend(width)
    w = b.weight(random_tensor(qtype, 70, 512, seed=3))  # a partial last tile
    x = np.random.default_rng(1).standard_normal((15, 512)).astype(np.float32) * 3
    xq = cpu_quantize.quantize_rows(x, width, cpu_quantize.narrow(width, w.bits))
    got = _gemm(w, xq)
    for rows in (1, 2, 3, 5, 15):  # each mix of the GEMM's row groups and remainder
        want = np.zeros((rows, got.shape[1]), dtype=np.float32)
        kernel, *args = b._idot(w, tuple(a[:rows] for a in xq), want)
        kernel(*args)
        np.testing.assert_array_equal(_gemm(w, tuple(a[:rows] for a in xq)).view(np.uint32),
                                      want.view(np.uint32))
    np.testing.assert_array_equal(got[:, :70], want[:, :70])
    parts = _gemm(w, xq, 0, 1) + _gemm(w, xq, 1, 3)  # tile ranges write their own columns
    np.testing.assert_array_equal(parts, got)
    _close(got[:, :70], N.linear(_dequantized(x, width), N.weight(random_tensor(qtype, 70, 512,
                                                                                seed=3))))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("qtype", ("Q4_0", "Q8_0"))
def test_extreme_codes_and_activations_do_not_overflow(qtype, width):
    """The largest sums: every 4-bit code 15 (16-bit sums of 16 codes x 127 in the int8
    form) or 8-bit code -128 / 127, against activations all at +L."""
    bt = BLOCK_TYPES[qtype]
    rows, k = 32, 256
    block = np.zeros(bt.type_size, dtype=np.uint8)
    block[:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    block[2:] = 0xFF if qtype == "Q4_0" else 0x80  # code 15; Q8_0: -128
    data = np.tile(block, (rows, k // bt.block_size))
    if qtype == "Q8_0":
        data.reshape(rows, -1, bt.type_size)[1::2, :, 2:] = 0x7F  # odd rows: 127
    t = TensorData("w", (rows, k), qtype, data)
    b = CpuBackend(width)
    w = b.weight(t)
    x = np.full((5, k), 3.0, dtype=np.float32)
    got = _gemm(w, cpu_quantize.quantize_rows(x, width, cpu_quantize.narrow(width, w.bits)))
    _close(got, N.linear(x, N.weight(t)))


def test_prefill_products_take_the_gemm(monkeypatch):
    """CpuBackend routes 4-, 5-, 6- and 8-bit prefill products with integer activations to the
    GEMM on AVX2, and file-byte types and float activations not; the results hold against
    NumPy either way."""
    calls = []
    real = gemm_int.gemm_int
    monkeypatch.setattr(gemm_int, "gemm_int", lambda *a: calls.append(1) or real(*a))
    x = np.random.default_rng(4).standard_normal((24, 512)).astype(np.float32)
    for width, qtype, routed in (("int8", "Q4_K", True), ("int16", "Q4_0", True),
                                 ("int16", "Q6_K", True), ("int8", "Q8_0", True),
                                 ("int16", "Q5_K", True), ("int8", "Q5_0", True),
                                 ("int16", "Q3_K", False), ("float", "Q4_K", False)):
        b = CpuBackend(width)
        b.set_threads(2)
        t = random_tensor(qtype, 96, 512, seed=5)
        calls.clear()
        y = b.linear(x, b.weight(t))
        assert bool(calls) == routed, (width, qtype)
        _close(y, N.linear(_dequantized(x, width) if routed else x, N.weight(t)))
