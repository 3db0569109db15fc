"""The three forms of the integer-dot block intrinsics (inference/backends/cpu/matvec_int.py):
256-bit (AVX2), 512-bit (AVX-512BW) and lane by lane (plain vector IR: ARM NEON, x86 without
AVX2). Each takes a block's exact integer sums and ends with their float tail (``_Tail``),
plain IEEE multiplies and adds in a fixed order. So every form must equal NumPy's float32
evaluation of the same expression from the exact integer sums bit for bit: for 4-bit, 5-bit
(plane of high bits), Q6_K's 6-bit (two planes) and 8-bit (signed) codes, int16 and int8
activations, every scale layout (kind), and the row groups the kernels take (1, 2, 4, 8
rows sharing one unpacking of the codes). The kernels take whichever form the CPU has; this
checks the lane form on every CPU (it compiles for any target), the AVX2 form on an AVX2 CPU
(its 4-bit and Q6_K codes against int16 activations split into bytes), both x86 forms where the CPU
has AVX-512BW (elsewhere the 512-bit 6-bit form is compiled for such a target, not run),
and the 512-bit form's multiply-adds of 4 and 8 rows both ways: one ``vpdpwssd`` (VNNI,
inline asm) and ``vpmaddwd`` + ``vpaddd``. The float tail's result is compared, not the
sums: they are exact integers, and float32 takes them exactly below 2**24 (every 4/5-bit sum
here, asserted). 8-bit sums with int16 activations reach 2**26 here, where float32 rounds to
a multiple of 4: the conversion rounds the same way in NumPy and in the kernels, so the
comparison stays bitwise, but an integer error below 4 there could go unseen
(test_cpu_idot.py checks the kernels' extreme sums against NumPy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numba import njit

from inference.backends.cpu import features as cpu_features
from inference.backends.cpu import matvec_int as cpu_int
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu.layout import (
    AFFINE,
    AFFINE_F16,
    LANES,
    SUB16,
    SYMMETRIC,
    SYMMETRIC_F16,
)
from tests import early

GROUPS = 2  # one block per group of 32 activations
ROWS = 8  # activation rows: every group size divides it
# (vnni, rows): without VNNI only 4 and 8 rows, the only ones taking ``vpdpwssd`` with it
CASES = [(True, 1), (True, 2), (True, 4), (True, 8), (False, 4), (False, 8)]
ZERO = 8.0  # SYMMETRIC's code offset
f32 = np.float32


def _forms(monkeypatch, vnni: bool, nrows: int) -> list:
    """The forms to check: the lane form for the groups its kernels take (1 and 2 rows);
    where the target has AVX-512BW, both x86 forms, and without ``vnni`` only the 512-bit
    one (the AVX2 form never takes ``vpdpwssd``), compiled as if the target had no VNNI
    (the intrinsics read ``_vnni`` when their runner compiles)."""
    forms = ["lanes"] if vnni and nrows <= 2 else []
    if vnni and nrows <= 2 and cpu_features.form() == "avx2":
        forms.append("avx2")  # the host's own, 4-bit and Q6_K codes on split activations
    if cpu_int.wide() and not vnni:
        monkeypatch.setattr(cpu_int, "_vnni", lambda: False)
        forms.append("avx512")
    elif cpu_int.wide() and cpu_int._vnni():
        forms += ["avx2", "avx512"]
    if not forms:
        pytest.skip("the x86 forms need AVX-512BW (and here VNNI)")
    return forms


def _runner(form: str, nrows: int):
    """Block g over rows r0.. of group g, each (g, r0) into its own accumulators, by the
    intrinsic of ``form`` over ``nrows`` rows (a constant where it is typed, as in the
    kernels); ``high`` is None (4-bit or, int8 codes, 8-bit) or the plane rows (5-bit):
    the intrinsic specialises on the types, as in the kernels."""
    dot = cpu_int.make_dot(form)

    @njit
    def run(codes, xp, high, blocks, kind, dx, xs, accs):
        for g in range(GROUPS):
            for r0 in range(0, xp.shape[0] - nrows + 1, nrows):
                dot(codes, g, xp, r0, g, high, blocks, kind, ZERO, dx, xs, accs[g, r0], nrows)

    @njit
    def split(codes, xp, high, blocks, kind, dx, xs, accs):
        # int16 activations against 4-bit or Q6_K codes as the AVX2 kernels take them
        run(codes, cpu_int.split_activations(xp, codes, high), high, blocks, kind, dx, xs, accs)
    return split if form == "avx2" and cpu_features.form() == "avx2" else run


def _activations(width: str, rows: int, rng: np.random.Generator) -> np.ndarray:
    level = cpu_quantize.LEVELS[width]
    xp = rng.integers(-level, level + 1, (rows, GROUPS * 32)).astype(width)
    # the extremes in both halves of a group (int16: high bytes 127 and -128)
    xp[0, [0, 1, 16, 17]], xp[1, [0, 1, 16, 17]] = level, -level
    return xp


def _codes4(rng, five):
    """(GROUPS, 20, LANES) bytes: nibble rows 0-15 (code j low, j+16 high), plane rows 16-19."""
    codes = rng.integers(0, 256, (GROUPS, 20, LANES), dtype=np.uint8)
    values = np.concatenate([codes[:, :16] & 15, codes[:, :16] >> 4], axis=1).astype(np.int64)
    if five:  # bit 4 of code 2p / 2p+1 is bit p of plane row 16 / 17 (18 / 19: codes 16+)
        for j in range(32):
            row, p = 16 + (j % 2) + 2 * (j >= 16), (j % 16) // 2
            values[:, j] |= ((codes[:, row] >> p) & 1).astype(np.int64) << 4
    return codes, values  # values (GROUPS, 32 codes, LANES)


def _scales(rng, c: int):
    """(GROUPS, c + 2, LANES) float32 blocks with random scales in rows c (float32 scales,
    or 2 * LANES float16: scales then biases) and c + 1 (float32 biases); and the row
    quantities d, xsum (ROWS, GROUPS)."""
    blocks = np.zeros((GROUPS, c + 2, LANES), dtype=f32)
    blocks[:, c + 1] = rng.standard_normal((GROUPS, LANES))
    dx = rng.uniform(1e-6, 1e-3, (ROWS, GROUPS)).astype(f32)
    xs = rng.standard_normal((ROWS, GROUPS)).astype(f32)
    return blocks, dx, xs


def _expected(kind, blocks, c, dx, xs, isum, subs=None):
    """NumPy float32, the tail's order: ``isum`` (GROUPS, ROWS, LANES) or, where ``subs``
    (Q6_K's sub-scales, GROUPS x 2 x LANES) is given, (GROUPS, ROWS, 2, LANES). SUB16:
    ``blocks`` are the super rows, block g's ``d`` the first LANES halves of row g // 8."""
    if kind == SUB16:
        halves = np.repeat(blocks[:, 0].view(np.float16).astype(f32), 8, axis=0)
    elif kind == SYMMETRIC_F16:  # a super row a block
        halves = blocks[:, 0].view(np.float16).astype(f32)
    else:
        halves = blocks[:, c].view(np.float16).astype(f32)  # (GROUPS, 2 * LANES)
    out = np.empty((GROUPS, ROWS, LANES), dtype=f32)
    for g in range(GROUPS):
        for r in range(ROWS):
            d, xsum = dx[r, g], xs[r, g]
            if kind == SUB16:
                s0, s1 = isum[g, r].astype(f32)
                sc0, sc1 = subs[g].astype(f32)
                term = (halves[g, :LANES] * d) * (sc0 * s0 + sc1 * s1)
            else:
                s = isum[g, r] if isum.ndim == 3 else isum[g, r].sum(axis=0)
                s = s.astype(f32)
                if kind == AFFINE_F16:
                    term = halves[g, :LANES] * (d * s) + halves[g, LANES:] * xsum
                elif kind == AFFINE:
                    term = blocks[g, c] * (d * s) + blocks[g, c + 1] * xsum
                elif kind == SYMMETRIC_F16:
                    term = halves[g, :LANES] * (d * s - f32(ZERO) * xsum)
                else:
                    term = blocks[g, c] * (d * s - f32(ZERO) * xsum)
            out[g, r] = f32(0.0) + term
    return out


def _check(run, args, kinds, blocks, c, nrows, want, rng, subs=None):
    """Run every kind (float32 scales and float16 ones in row c) and compare bitwise."""
    f32_row = rng.standard_normal((GROUPS, LANES)).astype(f32)
    f16_row = rng.standard_normal((GROUPS, 2 * LANES)).astype(np.float16).view(f32)
    for kind in kinds:
        blocks[:, c] = f16_row if kind == AFFINE_F16 else f32_row
        # SUB16: the super row of the blocks' super-block (GROUPS < 8: one), its d
        scales = (f16_row[:1, None] if kind == SUB16 else f16_row[:, None]
                  if kind == SYMMETRIC_F16 else blocks)
        codes, xp, *rest, dx, xs = args
        accs = np.zeros((GROUPS, ROWS, nrows, LANES), dtype=f32)
        run(codes, xp, *rest, scales, kind, dx, xs, accs)
        exp = _expected(kind, scales, c, dx, xs, want, subs)
        for r0 in range(0, ROWS, nrows):
            got = accs[:, r0]  # (GROUPS, nrows, LANES)
            np.testing.assert_array_equal(got.view(np.uint32),
                                          exp[:, r0:r0 + nrows].view(np.uint32),
                                          err_msg=f"kind {kind}")


@pytest.mark.parametrize("vnni,nrows", CASES)
@pytest.mark.parametrize("width", list(cpu_quantize.LEVELS))
@pytest.mark.parametrize("five", [False, True])
def test_dot4_forms_equal_numpy(width, five, nrows, vnni, monkeypatch):
    forms = _forms(monkeypatch, vnni, nrows)
    rng = np.random.default_rng(nrows * 10 + five)
    codes, values = _codes4(rng, five)
    xp = _activations(width, ROWS, rng)
    want = np.einsum("gjl,rgj->grl", values, xp.reshape(ROWS, GROUPS, 32).astype(np.int64))
    assert np.abs(want).max() < 2**24  # exact in float32 (module docstring)
    c = 5 if five else 4
    blocks, dx, xs = _scales(rng, c)
    high = codes[:, 16:20] if five else None
    for form in forms:
        _check(_runner(form, nrows), (codes, xp, high, dx, xs),
               (SYMMETRIC, AFFINE, AFFINE_F16, SYMMETRIC_F16), blocks, c, nrows, want, rng)


@pytest.mark.parametrize("vnni,nrows", CASES)
@pytest.mark.parametrize("width", list(cpu_quantize.LEVELS))
def test_dot8_forms_equal_numpy(width, nrows, vnni, monkeypatch):
    forms = _forms(monkeypatch, vnni, nrows)
    rng = np.random.default_rng(nrows * 10 + 1)
    dtype = np.int8  # 8-bit codes are signed whatever the type (pack.py)
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, info.max + 1, (GROUPS, 34, LANES)).astype(dtype)
    codes[0, 0] = info.min  # the extremes
    codes[0, 1] = info.max
    xp = _activations(width, ROWS, rng)
    xs16 = xp.reshape(ROWS, GROUPS, 2, 16).astype(np.int64)  # codes 0-15 and 16-31 apart
    cv = codes[:, :32].astype(np.int64).reshape(GROUPS, 2, 16, LANES)
    want = np.einsum("ghjl,rghj->grhl", cv, xs16)  # (GROUPS, ROWS, 2, LANES)
    assert np.abs(want).max() < 2**26  # float32 keeps them to within 4 (module docstring)
    blocks, dx, xs = _scales(rng, 8)
    for form in forms:
        _check(_runner(form, nrows), (codes, xp, None, dx, xs),
               (SYMMETRIC, AFFINE, AFFINE_F16, SUB16, SYMMETRIC_F16), blocks, 8, nrows, want, rng,
               subs=codes[:, 32:34])


@pytest.mark.parametrize("vnni,nrows", CASES)
@pytest.mark.parametrize("width", list(cpu_quantize.LEVELS))
def test_dot6_forms_equal_numpy(width, nrows, vnni, monkeypatch):
    """Q6_K's 6-bit codes: nibble rows 0-15, planes of bit 4 (rows 16-19) and bit 5 (20-23),
    each code standing for ``q - 32``; the int8 scales of ``SUB16`` in rows 24-25."""
    forms = _forms(monkeypatch, vnni, nrows)
    rng = np.random.default_rng(nrows * 10 + 6)
    codes = rng.integers(0, 256, (GROUPS, 28, LANES), dtype=np.uint8)
    codes[0, :24, 0] = 0xFF  # lane 0 of block 0: every code 63, the largest
    codes[0, :24, 1] = 0  # lane 1: every code 0, i.e. -32
    values = np.concatenate([codes[:, :16] & 15, codes[:, :16] >> 4], axis=1).astype(np.int64)
    for j in range(32):  # bit 4 + k of code 2p / 2p+1 / 2p+16 / 2p+17: bit p of plane k's row
        for k in range(2):
            row, p = 16 + 4 * k + (j % 2) + 2 * (j >= 16), (j % 16) // 2
            values[:, j] |= ((codes[:, row] >> p) & 1).astype(np.int64) << (4 + k)
    values -= 32
    xp = _activations(width, ROWS, rng)
    xs16 = xp.reshape(ROWS, GROUPS, 2, 16).astype(np.int64)  # codes 0-15 and 16-31 apart
    want = np.einsum("ghjl,rghj->grhl", values.reshape(GROUPS, 2, 16, LANES), xs16)
    assert np.abs(want).max() < 2**24  # exact in float32 (module docstring)
    blocks, dx, xs = _scales(rng, 6)
    high = codes[:, 16:24].reshape(GROUPS, 2, 4, LANES)  # the kernels' type: two planes
    for form in forms:
        _check(_runner(form, nrows), (codes, xp, high, dx, xs),
               (SYMMETRIC, AFFINE, AFFINE_F16, SUB16, SYMMETRIC_F16), blocks, 6, nrows, want, rng,
               subs=codes[:, 24:26].view(np.int8))


AVX512_COMPILE = """
from numba import types
from inference.backends.cpu import features
from inference.backends.cpu import matvec_int as cpu_int
from tests.test_cpu_idot_forms import _runner

assert features.form() == "avx512" and cpu_int._vnni()
u8, f32 = types.uint8, types.float32
for nrows in (1, 2, 8):  # a single row, a pair, a VNNI group
    for width in (types.int16, types.int8):
        _runner("avx512", nrows).compile((
            types.Array(u8, 3, "C"), types.Array(width, 2, "C"), types.Array(u8, 4, "A"),
            types.Array(f32, 3, "C"), types.int64, types.Array(f32, 2, "C"),
            types.Array(f32, 2, "C"), types.Array(f32, 4, "C")))
print("avx512 compiled")
"""
AVX512_FEATURES = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,"
                   "+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,+avx512f,"
                   "+avx512bw,+avx512vl,+avx512dq,+avx512cd,+avx512vnni")


def _avx512_steps(tmp: Path) -> list[early.Step] | str:
    if cpu_int.wide():
        return "the host runs the 512-bit form: the checks above cover it"
    if not cpu_features._x86():
        return "needs an x86 host (LLVM's x86 target)"
    # a cache of its own: this target's entries beside the host's would race on their index
    return [early.python(AVX512_COMPILE, NUMBA_CPU_NAME="icelake-server",
                         NUMBA_CPU_FEATURES=AVX512_FEATURES, NUMBA_CACHE_DIR=str(tmp))]


@pytest.mark.early(steps=_avx512_steps)
def test_avx512_six_bit_form_compiles(request):
    """Where the host has no AVX-512, the 512-bit form of Q6_K's 6-bit sums (the only one
    the host cannot run here that is new) is at least compiled, for an AVX-512 VNNI target
    in a subprocess, with one row, a pair and a group of 8 (``vpdpwssd``): nothing runs it.
    (Started early in the run: tests/early.py.)"""
    (out,) = early.result(request.node)
    assert out.returncode == 0 and "avx512 compiled" in out.stdout, out.stderr[-3000:]
