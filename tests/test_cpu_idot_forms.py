"""The two forms of the integer-dot block sums (inference/backends/cpu_idot.py): 256-bit
(AVX2) and 512-bit (AVX-512BW). Integer sums are exact, so both must equal the NumPy sums
bit for bit, for 4-bit, 5-bit (plane of high bits) and 8-bit (signed and unsigned) codes,
int16 and int8 activations, the row groups the kernels take (1, 2, 4, 8 rows sharing one
unpacking of the codes). The kernels take whichever form the CPU has; this checks the other
one too where the CPU can run both, and the 512-bit form's multiply-adds of 4 and 8 rows
both ways: one ``vpdpwssd`` (VNNI, inline asm) and ``vpmaddwd`` + ``vpaddd``."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from inference.backends import cpu_idot as I
from inference.backends.cpu_kernels import LANES

pytestmark = pytest.mark.skipif(not I.wide(), reason="the 512-bit form needs AVX-512BW")

GROUPS = 2  # one block per group of 32 activations
ROWS = 8  # activation rows: every group size divides it
NROWS = [1, 2, 4, 8]


def _forms(monkeypatch, vnni: bool) -> None:
    """The makers of both forms; without ``vnni`` the 512-bit one is compiled as if the
    target had no VNNI (the makers read ``_vnni`` when their runner compiles)."""
    if not vnni:
        monkeypatch.setattr(I, "_vnni", lambda: False)
    elif not I._vnni():
        pytest.skip("the target has no AVX-512 VNNI")


def _runner(dot, nrows):
    @njit
    def run(codes, xp, out):
        for g in range(GROUPS):
            for r0 in range(0, xp.shape[0] - nrows + 1, nrows):
                dot(codes, g, xp, r0, g * 16, out[g, r0])
    return run


def _runner4(dot, nrows):
    """``high`` is None (4-bit codes) or the plane rows (5-bit): the intrinsic specialises
    on its type, as in the kernels."""
    @njit
    def run(codes, xp, out, high):
        for g in range(GROUPS):
            for r0 in range(0, xp.shape[0] - nrows + 1, nrows):
                dot(codes, g, xp, r0, g * 16, out[g, r0], high)
    return run


def _activations(width: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    level = I.LEVELS[width]
    return rng.integers(-level, level + 1, (rows, GROUPS * 32)).astype(width)


def _codes4(rng, five):
    """(GROUPS, 20, LANES) bytes: nibble rows 0-15 (code j low, j+16 high), plane rows 16-19."""
    codes = rng.integers(0, 256, (GROUPS, 20, LANES), dtype=np.uint8)
    values = np.concatenate([codes[:, :16] & 15, codes[:, :16] >> 4], axis=1).astype(np.int64)
    if five:  # bit 4 of code 2p / 2p+1 is bit p of plane row 16 / 17 (18 / 19: codes 16+)
        for j in range(32):
            row, p = 16 + (j % 2) + 2 * (j >= 16), (j % 16) // 2
            values[:, j] |= ((codes[:, row] >> p) & 1).astype(np.int64) << 4
    return codes, values  # values (GROUPS, 32 codes, LANES)


@pytest.mark.parametrize("vnni", [True, False])
@pytest.mark.parametrize("width", list(I.LEVELS))
@pytest.mark.parametrize("five", [False, True])
@pytest.mark.parametrize("nrows", NROWS)
def test_dot4_forms_equal_numpy(width, five, nrows, vnni, monkeypatch):
    _forms(monkeypatch, vnni)
    rng = np.random.default_rng(nrows * 10 + five)
    codes, values = _codes4(rng, five)
    xp = _activations(width, ROWS, rng)
    want = np.einsum("gjl,rgj->grl", values, xp.reshape(ROWS, GROUPS, 32).astype(np.int64))
    for make in (I._make_dot4, I._make_wide_dot4):
        out = np.zeros((GROUPS, ROWS, 2 * LANES * nrows), dtype=np.int32)
        _runner4(make(nrows), nrows)(codes, xp, out, codes[:, 16:20] if five else None)
        for r0 in range(0, ROWS, nrows):
            for r in range(nrows):
                got = out[:, r0, 2 * LANES * r: 2 * LANES * r + LANES]
                np.testing.assert_array_equal(got, want[:, r0 + r], err_msg=make.__name__)


@pytest.mark.parametrize("vnni", [True, False])
@pytest.mark.parametrize("width", list(I.LEVELS))
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("nrows", NROWS)
def test_dot8_forms_equal_numpy(width, signed, nrows, vnni, monkeypatch):
    _forms(monkeypatch, vnni)
    rng = np.random.default_rng(nrows * 10 + signed)
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, info.max + 1, (GROUPS, 32, LANES)).astype(dtype)
    codes[0, 0] = info.min  # the extremes
    codes[0, 1] = info.max
    xp = _activations(width, ROWS, rng)
    xs = xp.reshape(ROWS, GROUPS, 2, 16).astype(np.int64)  # codes 0-15 and 16-31 apart
    c = codes.astype(np.int64).reshape(GROUPS, 2, 16, LANES)
    want = np.einsum("ghjl,rghj->grhl", c, xs)
    for make in (I._make_dot8, I._make_wide_dot8):
        out = np.zeros((GROUPS, ROWS, 2 * LANES * nrows), dtype=np.int32)
        _runner(make(nrows), nrows)(codes, xp, out)
        for r0 in range(0, ROWS, nrows):
            for r in range(nrows):
                got = out[:, r0, 2 * LANES * r: 2 * LANES * (r + 1)].reshape(GROUPS, 2, LANES)
                np.testing.assert_array_equal(got, want[:, r0 + r], err_msg=make.__name__)
