"""Several batch rows per weight read in the float and 16-bit decode mat-vecs (mmv.cu
mul_mat_vec_b<n>_*, mul_mat_vec_h_b<n>_*), on the emulated device (and a GPU with ``-m gpu``).

- Every tile against the 1-row kernel: each batch row's sum takes the same products in the
  same order, so on the emulator (g++ contracts no multiply-add) bitwise equal; on a GPU
  nvcc may contract differently per kernel, so float32 rounding (1e-6 of sum |w||x|, + 1e-7).
- Against float64 NumPy on the exact (dequantized or widened) weights at batch sizes that
  leave a tile partly idle (3, 5) and a full tile of 8 plus a partial one (11):
  |y - ref| <= 2e-5 sum|w||x| + 1e-6 (float32 accumulation, as test_kernels.py).
- Race check: both thread schedules, blocks shuffled, partial tiles and row blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.cuda import ops
from kernels.cuda.device import Device
from kernels.cuda.table import MMV_TILES
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.quantdata import make_weight, reference
from tests.kernels.test_cuda_half_weights import to_16bit

# (qtype, cols, path): the 16-bit vector kernel (cols % 4 == 0), the float kernel on F32, on
# F16/BF16 of odd width, and on a 32- and a 256-element quant type (the float path, q8_1 off).
CASES = [("BF16", 260, "h"), ("F16", 1028, "h"), ("F32", 1025, ""), ("BF16", 33, ""),
         ("F16", 7, ""), ("Q4_0", 1056, ""), ("Q5_1", 96, ""), ("Q6_K", 768, ""),
         ("Q3_K", 256, "")]


def _weight(qtype: str, rows: int, cols: int, rng: np.random.Generator
            ) -> tuple[np.ndarray, np.ndarray]:
    """(stored data, its exact float64 value)."""
    if qtype in ("F16", "BF16"):
        return to_16bit(rng.standard_normal((rows, cols)) * 3, qtype)
    raw = make_weight(qtype, rows, cols, rng)
    return raw, reference(qtype, raw, cols).astype(np.float64)


def recording(dev: EmulatedDevice) -> list[str]:
    """The names of the kernels dev launches from now on, in order."""
    names: list[str] = []
    launch = dev.launch

    def record(module: str, name: str, *args: object) -> None:
        names.append(name)
        launch(module, name, *args)

    dev.launch = record  # type: ignore[method-assign]
    return names


def _path_of(kernel: str) -> str:
    return "h" if kernel.startswith("mul_mat_vec_h_") else ""


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_tiles_equal_the_one_row_kernel(dev: Device, case: tuple) -> None:
    qtype, cols, path = case
    rng = np.random.default_rng(cols)
    rows = 5  # a partial block of 4 rows
    data, exact = _weight(qtype, rows, cols, rng)
    w = ops.upload_matrix(dev, data, qtype, (rows, cols))
    assert ops.half_vector_applies(dev, w) == (path == "h")
    aw = np.abs(exact)
    for batch in [*range(1, 10), 17]:
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        xd = dev.to_device(x)
        one = dev.to_host(ops.mul_mat_vec(dev, w, xd, q8_1=False, tile=1))
        for tile in MMV_TILES:
            got = dev.to_host(ops.mul_mat_vec(dev, w, xd, q8_1=False, tile=tile))
            if isinstance(dev, EmulatedDevice):
                assert np.array_equal(got, one), (qtype, cols, batch, tile)
            else:
                tol = 1e-6 * (np.abs(x).astype(np.float64) @ aw.T) + 1e-7
                assert (np.abs(got - one) <= tol).all(), (qtype, cols, batch, tile)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_tiles_match_float64(case: tuple) -> None:
    qtype, cols, path = case
    rng = np.random.default_rng(cols + 1)
    dev = EmulatedDevice(check_races=True)
    names = recording(dev)
    for rows, batch, tile in [(37, 3, 4), (6, 5, 8), (9, 11, 8), (3, 2, 2)]:
        data, exact = _weight(qtype, rows, cols, rng)
        w = ops.upload_matrix(dev, data, qtype, (rows, cols))
        x = rng.standard_normal((batch, cols)).astype(np.float32)
        names.clear()
        got = dev.to_host(ops.mul_mat_vec(dev, w, dev.to_device(x), q8_1=False))
        (kernel,) = [n for n in names if n.startswith("mul_mat_vec")]
        assert _path_of(kernel) == path and f"_b{tile}_" in kernel, (kernel, batch)
        ref = x.astype(np.float64) @ exact.T
        bound = 2e-5 * (np.abs(x).astype(np.float64) @ np.abs(exact).T) + 1e-6
        assert (np.abs(got - ref) <= bound).all(), (qtype, rows, cols, batch)
