"""Prefill's dequantize kernels stage a block's weight bytes in shared memory with aligned
16-byte loads, and its values with 16-byte stores, by consecutive threads (dequant.cu).
Parity: equal to gguf-py's values (float32: rtol 2e-7, one rounding; half: NumPy's rounding
of those, bitwise) on shapes whose element count is not a multiple of a word or of a block,
with the race check on (the stages are shared: a missing barrier shows). Memory model:
whole-sector loads and stores."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.table import TYPES
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.emulator.traffic import TrafficDevice
from tests.kernels.quantdata import make_weight, reference


# (type, rows, cols): 7 x 33 F16 (231 elements: a partial word), 9 x 1025 BF16 (several
# blocks of 256 threads, the last partial), 5 x 96 Q4_0 (480 elements, one partial block),
# 3 x 768 Q6_K (16-element slices); several thread blocks whose weight stages start and
# end mid-row: 37 x 1056 Q8_0 (the largest stage, 8,704 bytes), 11 x 800 Q5_1, 5 x 2304 Q3_K.
@pytest.mark.parametrize("qtype, rows, cols", [("F16", 7, 33), ("BF16", 9, 1025),
                                               ("Q4_0", 5, 96), ("Q6_K", 3, 768),
                                               ("Q8_0", 37, 1056), ("Q5_1", 11, 800),
                                               ("Q3_K", 5, 2304)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_staged_stores_match_gguf(qtype: str, rows: int, cols: int, dtype: type) -> None:
    dev = EmulatedDevice(check_races=True)
    rng = np.random.default_rng(rows * cols)
    raw = make_weight(qtype, rows, cols, rng)
    ref = reference(qtype, raw, cols)
    w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
    ids = dev.to_device(np.array([rows - 1, 0, rows, rows - 1], np.int32))  # rows: a NaN row
    for got, want in ((ops.dequantize(dev, w, dtype), ref),
                      (ops.dequantize(dev, w, dtype, ids=ids), ref[[rows - 1, 0, 0, rows - 1]])):
        got = dev.to_host(got)
        if got.shape[0] == 4:  # the gather: its out-of-range id gave NaN
            assert np.isnan(got[2]).all()
            got, want = got[[0, 1, 3]], want[[0, 1, 3]]
        if dtype == np.float32:
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-30)
        else:
            assert np.array_equal(got.view(np.uint16), want.astype(np.float16).view(np.uint16))


def test_dequantize_stores_whole_sectors() -> None:
    # Q4_0, 8 rows of 1024: each store instruction writes 512 contiguous bytes (a warp's
    # 16-byte words), every sector whole; a thread storing its own 32-element slice
    # touched 8x (float) or 16x (half) the bytes it wrote, as the model counted before.
    for dtype, per_store in ((np.float32, 4), (np.float16, 8)):
        dev = TrafficDevice()
        w = ops.upload_matrix(dev, make_weight("Q4_0", 8, 1024, np.random.default_rng(0)),
                              "Q4_0", (8, 1024))
        ops.dequantize(dev, w, dtype)
        (kernel,) = dev.traffic
        st = dev.traffic[kernel][(2, "store")]
        assert st.efficiency == 1.0 and st.moved_per_useful == 1.0
        assert st.instructions == 8 * 1024 // (32 * per_store)


BLOCK_TYPES = [n for n, t in TYPES.items() if t.qk > 1]


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_dequantize_loads_whole_sectors(qtype: str) -> None:
    # 8 rows of 1024: the weights leave memory once, as aligned 16-byte words by consecutive
    # threads (a thread reading its own block 2 bytes at a time used 6-51% of each sector).
    dev = TrafficDevice()
    w = ops.upload_matrix(dev, make_weight(qtype, 8, 1024, np.random.default_rng(0)),
                          qtype, (8, 1024))
    ops.dequantize(dev, w)
    (kernel,) = dev.traffic
    ld = dev.traffic[kernel][(0, "load")]
    assert ld.footprint == w.data.nbytes  # every byte, once
    assert ld.efficiency == 1.0 and ld.moved_per_useful == 1.0, (ld.efficiency,
                                                                 ld.moved_per_useful)
    # each thread block (256 slices here, none partial) loads its bytes in words of 16,
    # 32 a warp-level load
    blocks = 8 * 1024 // TYPES[qtype].ept // 256
    assert ld.instructions == blocks * -(-w.data.nbytes // blocks // 512)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K"])
def test_unaligned_weight_reads_global_memory_directly(qtype: str) -> None:
    # The stage loads the aligned words around the bytes: only from a 16-byte aligned w;
    # otherwise each thread reads its block where it is, with the same values.
    dev = EmulatedDevice(check_races=True)
    cols = TYPES[qtype].qk * 3
    w = ops.upload_matrix(dev, make_weight(qtype, 5, cols, np.random.default_rng(1)), qtype,
                          (5, cols))
    shifted = dev.empty((w.data.size + 2,), np.uint8)[2:].reshape(w.data.shape)
    shifted[...] = w.data
    w2 = ops.QuantMatrix(shifted, qtype, 5, cols)
    assert dev.address(w2.data) % 16 == 2
    np.testing.assert_array_equal(ops.dequantize(dev, w2), ops.dequantize(dev, w))


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_gather_loads_whole_sectors(qtype: str) -> None:
    # The embedding gather stages each picked row's blocks as aligned 16-byte words too:
    # 16 of 64 rows of 4,096 columns (every type's row is whole sectors there), in a
    # shuffled order. Read by each thread where it lies, 6-51% of each sector was used.
    dev = TrafficDevice()
    rng = np.random.default_rng(0)
    w = ops.upload_matrix(dev, make_weight(qtype, 64, 4096, rng), qtype, (64, 4096))
    ids = dev.to_device(rng.permutation(64)[:16].astype(np.int32))
    ops.get_rows(dev, w, ids)
    (kernel,) = dev.traffic
    ld = dev.traffic[kernel][(0, "load")]
    assert ld.footprint == 16 * w.row_bytes  # the picked rows' bytes, each once
    assert ld.efficiency == 1.0 and ld.moved_per_useful == 1.0, (ld.efficiency,
                                                                 ld.moved_per_useful)
    blocks = 16 * 4096 // TYPES[qtype].ept // 256
    assert ld.instructions == blocks * -(-16 * w.row_bytes // blocks // 512)


# (type, rows, cols, ids): rows not whole 16-byte words (Q8_0 576: SmolLM2's width, 18
# slices a row, up to 16 rows a block), exactly 16 rows a block (Q4_K 256), more than 16
# rows a block (Q4_0 256: 8 slices a row, read directly), blocks ending mid-row (Q6_K 768,
# Q5_1 800); repeated and out-of-range ids (-1, rows) between valid ones.
GATHERS = [("Q8_0", 40, 576, 45), ("Q4_K", 20, 256, 37), ("Q4_0", 50, 256, 70),
           ("Q6_K", 9, 768, 23), ("Q5_1", 11, 800, 19)]


@pytest.mark.parametrize("case", GATHERS, ids=lambda c: f"{c[0]}x{c[2]}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_staged_gather_matches_direct_reads_and_gguf(case: tuple, dtype: type) -> None:
    qtype, rows, cols, n = case
    dev = EmulatedDevice(check_races=True)
    rng = np.random.default_rng(rows * cols)
    raw = make_weight(qtype, rows, cols, rng)
    ref = reference(qtype, raw, cols)
    w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
    picked = rng.integers(0, rows, n)
    picked[[3, n // 2, n - 2]] = [-1, rows, picked[0]]  # NaN rows, a repeat
    ids = dev.to_device(picked.astype(np.int32))
    got = dev.to_host(ops.dequantize(dev, w, dtype, ids=ids))
    bad = (picked < 0) | (picked >= rows)
    assert np.isnan(got[bad]).all()
    want = ref[picked[~bad]]
    if dtype == np.float32:
        np.testing.assert_allclose(got[~bad], want, rtol=2e-7, atol=1e-30)
    else:
        assert np.array_equal(got[~bad].view(np.uint16), want.astype(np.float16).view(np.uint16))
    # an unaligned copy of the weight is read where it lies: the same bits
    shifted = dev.empty((w.data.size + 2,), np.uint8)[2:].reshape(w.data.shape)
    shifted[...] = w.data
    direct = ops.dequantize(dev, ops.QuantMatrix(shifted, qtype, rows, cols), dtype, ids=ids)
    np.testing.assert_array_equal(dev.to_host(direct).view(np.uint8), got.view(np.uint8))
