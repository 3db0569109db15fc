"""The emulator's memory-transaction model (tests/kernels/emulator/traffic.py): planted access
patterns first, then the decode mat-vec kernels against their bars (weights >= 90%
sector efficiency, x >= 80%)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.cuda.table import TYPES
from tests.kernels.emulator.module import EmulatedModule, EmulatorError
from tests.kernels.emulator.traffic import aligned_empty, analyze, mat_vec_streams, recording

PROBES = Path(__file__).with_name("emu_probes.cu")


@pytest.fixture(scope="module")
def probes() -> EmulatedModule:
    return EmulatedModule(PROBES)


@pytest.mark.parametrize("stride, efficiency", [(1, 1.0), (2, 0.5), (8, 0.125), (64, 0.125)])
def test_planted_gathers(probes: EmulatedModule, stride: int, efficiency: float) -> None:
    n = 256
    x = aligned_empty((n * stride,), np.float32)
    x[:] = np.arange(n * stride)
    y = aligned_empty((n,), np.float32)
    with recording() as log:
        probes.get_function("gather_stride")((2,), (128,), (x, y, np.int32(stride), np.int32(n)))
    (name, events), = log
    s = analyze(events, [(x.ctypes.data, x.nbytes), (y.ctypes.data, y.nbytes)])
    assert name == "gather_stride" and np.array_equal(y, x[::stride])
    load, store = s[(0, "load")], s[(1, "store")]
    assert load.instructions == store.instructions == n // 32  # one per warp
    assert load.requested == 4 * n and load.footprint == 4 * n
    assert load.efficiency == efficiency
    assert load.moved_per_useful == 1 / efficiency
    assert store.efficiency == 1.0 and store.moved_per_useful == 1.0


def test_every_typed_access_is_checked_for_alignment(probes: EmulatedModule) -> None:
    x = np.zeros(160, np.uint8)
    y = np.zeros(32, np.float32)
    probes.get_function("load_at")((1,), (32,), (x, y, np.int32(4)))
    with pytest.raises(EmulatorError, match="misaligned 4-byte load"):
        probes.get_function("load_at")((1,), (32,), (x, y, np.int32(2)))


# Decode shapes, batch 1: rows of 4096 (Llama 7B's hidden size) for every type, and of
# 11008 (its FFN width) for the K-quants, whose rows then start at 8 different alignments.
# (python -m tests.kernels.emulator.traffic reports 16 rows of each.)
BAR_CASES = ([(n, 4096, 4) for n, t in TYPES.items() if t.dp4a]
             + [("Q4_K", 11008, 8), ("Q6_K", 11008, 8)])


@pytest.mark.parametrize("qtype, cols, rows", BAR_CASES)
def test_integer_mat_vec_meets_the_sector_bars(qtype: str, cols: int, rows: int) -> None:
    st = mat_vec_streams(qtype, cols, q8_1=True, rows=rows)
    w, x = st["w"], st["x"]
    assert st["kernel"] == f"mul_mat_vec_q_{TYPES[qtype].suffix}"
    assert w.footprint == rows * TYPES[qtype].row_bytes(cols)  # every byte seen
    assert w.efficiency >= 0.90 and w.moved_per_useful <= 1.1, (w.efficiency, w.moved_per_useful)
    assert x.efficiency >= 0.80, x.efficiency


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
def test_float_mat_vec_is_what_the_issue_measured(qtype: str) -> None:
    # The old path: 2-byte weight loads at block strides, x as float4 per lane 64-128 B apart.
    st = mat_vec_streams(qtype, 4096, q8_1=False, rows=4)
    assert st["w"].efficiency < 0.3 and st["x"].efficiency == 0.5


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q3_K"])
def test_batched_decode_reads_the_weights_once_per_tile(qtype: str) -> None:
    # A block dots each weight read with its tile of batch rows: weight bytes moved by a
    # launch = one batch-1 read per tile (exactly: the same instructions per block), so per
    # token they fall by the tile; one read per row (tile 1) moves batch x as much.
    one = mat_vec_streams(qtype, 4096, q8_1=True, rows=4)["w"].bytes_moved
    for batch, tiles in [(2, 1), (3, 1), (4, 1), (8, 1), (11, 2)]:
        st = mat_vec_streams(qtype, 4096, q8_1=True, rows=4, batch=batch)
        assert st["w"].bytes_moved == tiles * one, (batch, st["w"].bytes_moved / one)
        assert st["x"].efficiency >= 0.80, st["x"].efficiency
        rowwise = mat_vec_streams(qtype, 4096, q8_1=True, rows=4, batch=batch, tile=1)
        assert rowwise["w"].bytes_moved == batch * one


@pytest.mark.parametrize("qtype, kernel", [("BF16", "mul_mat_vec_h_b"), ("F16", "mul_mat_vec_h_b"),
                                           ("F32", "mul_mat_vec_b"), ("Q4_K", "mul_mat_vec_b")])
def test_float_and_16bit_batched_decode_read_the_weights_once_per_tile(qtype: str,
                                                                       kernel: str) -> None:
    # The same for the 16-bit vector kernel and the float kernel (F32 weights, and a quant
    # type with q8_1 off): a tile's weight loads are the batch-1 kernel's, once per tile.
    one = mat_vec_streams(qtype, 4096, q8_1=False, rows=4)["w"].bytes_moved
    for batch, tiles in [(2, 1), (3, 1), (5, 1), (8, 1), (11, 2)]:
        st = mat_vec_streams(qtype, 4096, q8_1=False, rows=4, batch=batch)
        assert st["kernel"].startswith(kernel), st["kernel"]
        assert st["w"].bytes_moved == tiles * one, (batch, st["w"].bytes_moved / one)
        rowwise = mat_vec_streams(qtype, 4096, q8_1=False, rows=4, batch=batch, tile=1)
        assert rowwise["w"].bytes_moved == batch * one
        assert st["x"].efficiency == rowwise["x"].efficiency, batch  # x loads unchanged
