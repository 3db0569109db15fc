"""The emulator's memory-transaction model (kernels/emulator/traffic.py): planted access
patterns first, then the decode mat-vec kernels against the issue's bars (weights >= 90%
sector efficiency, x >= 80%)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.table import TYPES
from kernels.emulator.module import EmulatedModule, EmulatorError
from kernels.emulator.traffic import TrafficDevice, aligned_empty, analyze, recording
from tests.kernels.quantdata import make_weight

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


# Decode shape: a 4096-wide row (Llama 7B's hidden size), 8 rows, batch 1.
COLS, ROWS = 4096, 8


def mat_vec_traffic(qtype: str, q8_1: bool) -> dict:
    """{(argument, kind): Stream} of the mat-vec kernel (not the x quantization)."""
    dev = TrafficDevice()
    rng = np.random.default_rng(5)
    w = ops.upload_matrix(dev, make_weight(qtype, ROWS, COLS, rng), qtype, (ROWS, COLS))
    ops.mul_mat_vec(dev, w, dev.to_device(rng.standard_normal((1, COLS), dtype=np.float32)),
                    q8_1=q8_1)
    (kernel,) = [k for k in dev.traffic if k.startswith("mul_mat_vec")]
    return dev.traffic[kernel] | {"w_bytes": w.data.nbytes}


@pytest.mark.parametrize("qtype", [n for n, t in TYPES.items() if t.dp4a])
def test_integer_mat_vec_meets_the_sector_bars(qtype: str) -> None:
    t = mat_vec_traffic(qtype, q8_1=True)
    w, x = t[(0, "load")], t[(1, "load")]
    assert w.footprint == t["w_bytes"]  # every weight byte went through the model
    assert w.efficiency >= 0.90 and w.moved_per_useful <= 1.1, (w.efficiency, w.moved_per_useful)
    assert x.efficiency >= 0.80, x.efficiency


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
def test_float_mat_vec_is_what_the_issue_measured(qtype: str) -> None:
    # The old path: 2-byte weight loads at block strides, x as float4 per lane 64-128 B apart.
    t = mat_vec_traffic(qtype, q8_1=False)
    assert t[(0, "load")].efficiency < 0.3 and t[(1, "load")].efficiency == 0.5
