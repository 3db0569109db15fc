"""The integer mat-vec (q8_1 activations, __dp4a) against NumPy, on the emulated device
(and a real GPU with ``-m gpu``).

Two references:
- **exact**: x quantized to q8_1 in NumPy exactly as quantize_q8_1 does (bytes compared
  bitwise), then the dot product in float64 of gguf-py's dequantized weights with the
  dequantized x, plus each group's offset times the kernel's rounding of s = d * sum(q)
  to half. The integer part is exact, so the tolerance covers float32 rounding only:
  |y - ref| <= 1e-5 * sum|w| |x_q| + 1e-6 (one wrong 4-bit code in a 4k row exceeds it).
- **float path** (mul_mat_vec_*, x unrounded): |y - y_float| is bounded by what rounding x
  to q8_1 can do: sum over groups of (d/2 + 127 |d - half(d)|) * sum|w| (each x moves by at
  most half a step of the half-precision scale) + |c| |s - half(d) sum(q)| for groups with
  an offset c, + 1e-5 * sum|w||x| for float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.device import Device
from kernels.cuda.table import MMV_TILES, TYPES, q8_1_row_bytes
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.quantdata import group_offsets, make_weight, q8_1_bytes, quantize_q8_1
from tests.kernels.quantdata import reference as dequantized

DP4A_TYPES = [n for n, t in TYPES.items() if t.dp4a]


def host(dev: Device, a: object) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else dev.to_host(a)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(2024)


def _x(rng: np.random.Generator, batch: int, cols: int) -> np.ndarray:
    """Activations with a spread of block magnitudes, an all-zero block and a lone spike."""
    x = rng.standard_normal((batch, cols), dtype=np.float32)
    x *= np.float32(10.0) ** rng.integers(-3, 3, (batch, cols // 32, 1)).repeat(32, -1).reshape(
        batch, cols).astype(np.float32)
    x[0, :32] = 0
    if cols > 64:
        x[-1, 40] = 1e4
    return x


def test_quantize_q8_1_is_bitwise_numpy(dev: Device, rng: np.random.Generator) -> None:
    for batch, cols in [(1, 32), (3, 96), (2, 1056), (1, 4128)]:
        x = _x(rng, batch, cols)
        got = host(dev, ops.quantize_q8_1(dev, dev.to_device(x)))
        want = q8_1_bytes(*quantize_q8_1(x), q8_1_row_bytes(cols))
        nb = cols // 32 * 36
        assert got.shape == want.shape
        assert np.array_equal(got[:, :nb], want[:, :nb]), (batch, cols)


def _cols(qtype: str) -> list[int]:
    # 32 * odd, one column block past a 1024-column warp step, three steps with a partial one
    return [32, 96, 1056, 2080] if TYPES[qtype].qk == 32 else [256, 1280, 2304]


@pytest.mark.parametrize("qtype", DP4A_TYPES)
def test_mul_mat_vec_q(dev: Device, qtype: str, rng: np.random.Generator) -> None:
    for cols in _cols(qtype):
        # batch 2, 3, 11: tiles 2, 4 (one row idle) and 8 (a full tile and a partial one)
        for rows, batch in [(1, 1), (5, 2), (37, 1), (6, 3), (5, 11)]:
            raw = make_weight(qtype, rows, cols, rng)
            w_ref = dequantized(qtype, raw, cols).astype(np.float64)
            w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
            x = _x(rng, batch, cols)
            xd = dev.to_device(x)
            y = host(dev, ops.mul_mat_vec(dev, w, xd))
            assert y.shape == (batch, rows)

            q, d, s = quantize_q8_1(x)
            dh = d.astype(np.float64)
            xq = q.astype(np.float64) * np.repeat(dh, 32, -1)
            s_err = s.astype(np.float64) - dh * q.reshape(batch, -1, 32).sum(-1)
            off = group_offsets(qtype, raw, cols)  # (rows, groups)
            ref = xq @ w_ref.T + s_err @ off.T
            aw = np.abs(w_ref)
            tol = 1e-5 * (np.abs(xq) @ aw.T) + 1e-6
            assert (np.abs(y - ref) <= tol).all(), (qtype, rows, cols, batch,
                                                   np.abs(y - ref).max())

            y_float = host(dev, ops.mul_mat_vec(dev, w, xd, q8_1=False))
            d32 = np.abs(x).reshape(batch, -1, 32).max(-1) / 127.0
            step = 0.5 * d32 + 127 * np.abs(d32 - dh)  # max |x - x_q| per group
            wg = aw.reshape(rows, -1, 32).sum(-1)  # sum |w| per group
            bound = step @ wg.T + np.abs(s_err) @ np.abs(off).T + 1e-5 * (np.abs(x) @ aw.T)
            assert (np.abs(y - y_float) <= bound).all(), (qtype, rows, cols, batch)


@pytest.mark.parametrize("qtype", DP4A_TYPES)
def test_batch_tiles_match_one_row_per_read(dev: Device, qtype: str,
                                            rng: np.random.Generator) -> None:
    """Every tile (batch rows per weight read) against the 1-row kernel, batch 1 to 9 and 17:
    the same vdot calls in the same order for each row, so on the emulator (g++ contracts
    no multiply-add) bitwise equal; on a GPU nvcc may contract differently per kernel, so
    float32 rounding (1e-6 of sum |w||x_q|, plus 1e-7)."""
    cols = _cols(qtype)[1]
    rows = 5
    raw = make_weight(qtype, rows, cols, rng)
    w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
    aw = np.abs(dequantized(qtype, raw, cols)).astype(np.float64)
    for batch in [*range(1, 10), 17]:
        x = _x(rng, batch, cols)
        xd = dev.to_device(x)
        one = host(dev, ops.mul_mat_vec(dev, w, xd, tile=1))
        exact = isinstance(dev, EmulatedDevice)
        for tile in MMV_TILES:
            got = host(dev, ops.mul_mat_vec(dev, w, xd, tile=tile))
            if exact:
                assert np.array_equal(got, one), (qtype, batch, tile)
            else:
                tol = 1e-6 * (np.abs(x) @ aw.T) + 1e-7
                assert (np.abs(got - one) <= tol).all(), (qtype, batch, tile)


def test_dp4a_path_is_free_of_races(rng: np.random.Generator) -> None:
    """Both schedules of threads, blocks shuffled, bitwise equal; a partial row block and a
    partial last warp step; batch tiles 2, 4 (partial) and 8 (a full tile, a partial one)."""
    dev = EmulatedDevice(check_races=True)
    for qtype, cols, batch in [("Q4_0", 1056, 11), ("Q4_1", 2080, 3), ("Q6_K", 1280, 2),
                               ("Q5_K", 2304, 4), ("Q2_K", 1280, 2), ("Q3_K", 2304, 8)]:
        m = ops.upload_matrix(dev, make_weight(qtype, 7, cols, rng), qtype, (7, cols))
        ops.mul_mat_vec(dev, m, dev.to_device(_x(rng, batch, cols)))


def test_unaligned_weight_takes_the_float_path(rng: np.random.Generator) -> None:
    dev = EmulatedDevice()
    raw = make_weight("Q4_0", 3, 64, rng)
    w = ops.upload_matrix(dev, raw, "Q4_0", (3, 64))
    assert ops.dp4a_applies(dev, w)
    shifted = dev.empty((w.data.size + 2,), np.uint8)[2:].reshape(w.data.shape)
    shifted[...] = w.data
    w2 = ops.QuantMatrix(shifted, "Q4_0", 3, 64)
    assert not ops.dp4a_applies(dev, w2)
    x = dev.to_device(_x(rng, 1, 64))
    np.testing.assert_array_equal(ops.mul_mat_vec(dev, w2, x),
                                  ops.mul_mat_vec(dev, w, x, q8_1=False))
