"""Decode mat-vec over int16 / int8 activations (inference/backends/cpu/matvec_int.py) against
NumPy.

The kernels compute ``W @ (d * q)`` exactly up to float32 rounding, where ``d * q`` is the
activation row quantized per group of 32 (``quantize_rows``). So:
- with activations already on the grid (``x = d * q``, ``d`` a power of two, one
  ``|q| = L`` per group, L = 127 or 32767) quantizing changes nothing, and the result
  equals the NumPy reference for ``x``;
- for any ``x`` it equals the NumPy reference for ``d * q``;
both with the float kernels' tolerance, 1e-5 of the output scale (float32 scales and a
different summation order). What quantizing costs a real model is asserted on SmolLM2 for
the default, int16, with the parity bars (top-1 >= 99%, mean |delta log p| <= 0.01
against transformers); int8 does not meet them there (docs/benchmarks.md has its figures).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.backends.cpu import ACTIVATIONS_ENV, CpuBackend
from inference.backends.cpu import features as cpu_features
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu.layout import LANES
from inference.backends.numpy_backend import NumpyBackend
from inference.errors import InvalidInputError
from inference.formats.tensor import TensorData
from tests import early
from tests import goldens_io as g
from tests.bundled import random_tensor
from tests.test_backend_cpu import PACKED, _mlx_tensor

N = NumpyBackend()
TYPES = PACKED + ("MLX4", "MLX5", "MLX8")
WIDTHS = list(cpu_quantize.LEVELS)


@pytest.fixture(scope="module", params=WIDTHS)
def ci(request) -> CpuBackend:
    return CpuBackend(request.param)


def _weight(qtype: str, rows: int = 70, k: int = 512):
    if qtype.startswith("MLX"):
        return _mlx_tensor(int(qtype[3]), rows, k, seed=7)
    return random_tensor(qtype, rows, k, seed=7)


def _grid(rows: int, k: int, levels: int, seed: int) -> np.ndarray:
    """Activations on the grid: d * q with d a power of two, one |q| = levels a group."""
    r = np.random.default_rng(seed)
    q = r.integers(-levels, levels + 1, size=(rows, k // 32, 32)).astype(np.float32)
    q[:, :, 5] = levels * r.choice([-1, 1], size=(rows, k // 32))
    d = 2.0 ** r.integers(-8, 3, size=(rows, k // 32, 1))
    return (q * d).reshape(rows, k).astype(np.float32)


def _dequantized(x: np.ndarray, width: str) -> np.ndarray:
    xp, dx, _ = cpu_quantize.quantize_rows(x, width)
    q = xp.view(getattr(np, width)).reshape(x.shape[0], -1, 32).astype(np.float32)
    return (q * dx[:, :, None]).reshape(x.shape)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()), rtol=0)


@pytest.mark.parametrize("width", WIDTHS)
def test_quantize_rows_matches_numpy(width):
    levels = cpu_quantize.LEVELS[width]
    r = np.random.default_rng(0)
    x = (r.standard_normal((3, 128)) * 10.0 ** r.integers(-3, 4, size=(3, 1))).astype(np.float32)
    x[1, 32:64] = 0.0  # an all-zero group: d = 0, codes 0
    x[2, 3] = 1e30
    xp, dx, xs = cpu_quantize.quantize_rows(x, width)
    g4 = x.reshape(3, 4, 32)
    amax = np.abs(g4).max(-1)
    inv = np.where(amax > 0, np.float32(levels) / np.where(amax > 0, amax, 1), 0)
    q = np.rint(g4 * inv.astype(np.float32)[..., None]).astype(getattr(np, width))
    np.testing.assert_array_equal(xp.view(getattr(np, width)).reshape(3, 4, 32), q)
    assert np.abs(q.astype(np.int32)).max() <= levels
    np.testing.assert_array_equal(dx, amax / np.float32(levels))
    np.testing.assert_allclose(xs, dx * q.astype(np.float32).sum(-1), rtol=1e-6)
    assert dx[1, 1] == 0 and xs[1, 1] == 0


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_integer_matvec_is_exact_on_grid_activations(ci, qtype, rows):
    t = _weight(qtype)
    x = _grid(rows, 512, cpu_quantize.LEVELS[ci.activations], seed=rows)
    _close(ci.linear(x, ci.weight(t)), N.linear(x, N.weight(t)))


@pytest.mark.parametrize("qtype", TYPES)
def test_integer_matvec_multiplies_the_quantized_activations(ci, qtype):
    t = _weight(qtype, rows=100, k=768)  # 3 K-quant super-blocks, 24 groups
    x = np.random.default_rng(1).standard_normal((2, 768)).astype(np.float32) * 3
    _close(ci.linear(x, ci.weight(t)),
           N.linear(_dequantized(x, ci.activations), N.weight(t)))


@pytest.mark.parametrize("qtype", TYPES)
def test_one_call_linear_is_bitwise_the_two_calls(ci, qtype):
    """An uncaptured decode linear quantizes inside its one numba call (``linear_q4`` /
    ``linear_q8``); a captured step replays ``quantize_call``'s fill, then the kernel. Both
    must give the same bits, for every batch size a decode step takes (1-8 rows: each mix
    of row groups)."""
    from inference.backends.cpu import quantize as cpu_quantize

    w = ci.weight(_weight(qtype))
    x = np.random.default_rng(2).standard_normal((8, 512)).astype(np.float32) * 3
    for rows in range(1, 9):
        one, two = (np.empty((rows, len(w.codes) // w.groups * LANES), dtype=np.float32)
                    for _ in range(2))
        ci._matvec_into(x[:rows], w, one)
        xq = cpu_quantize.quantize_rows(x[:rows], ci.activations,
                                        cpu_quantize.narrow(ci.activations, w.bits))  # as the tape
        fn, *args = ci._idot(w, xq, two)
        fn(*args)
        np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))


def test_extreme_codes_and_activations_do_not_overflow(ci):
    """The largest products the sums can meet: 8-bit codes of -128..127 (Q8_0, and MLX
    8-bit stored signed: cpu_pack), and 15 (4-bit), against activations all at +-L."""
    x = np.full((1, 512), 3.0, dtype=np.float32)
    x[0, ::2] = -3.0
    for qtype in ("Q8_0", "MLX8", "Q4_1", "Q6_K"):
        t = _weight(qtype)
        _close(ci.linear(x, ci.weight(t)), N.linear(x, N.weight(t)))


@pytest.mark.parametrize("rows", [1, 2])
def test_largest_5_bit_sums_do_not_overflow(ci, rows):
    """Every 5-bit code at 31 against activations all at +L: with int8 activations a pair
    of products is 2 * 31 * 127 = 7874, so the 16-bit sums must be widened every 4 pairs
    (8 pairs would pass 32767)."""
    from inference.formats.affine import pack_codes

    codes = np.full((70, 512), 31, dtype=np.uint8)
    scales = np.full((70, 8), 0.01, dtype=np.float16)
    t = _mlx_tensor(5, 70, 512, seed=7)
    t = TensorData("w", t.shape, "MLX", pack_codes(codes, 5),
                {**t.extra, "scales": scales, "biases": np.zeros_like(scales)})
    blocks = np.frombuffer(bytearray(np.asarray(_weight("Q5_1").data).tobytes()), np.uint8)
    blocks = blocks.reshape(-1, 24)
    blocks[:, 4:] = 0xFF  # qh and qs: every code 31
    q51 = TensorData("w", (70, 512), "Q5_1", blocks.reshape(70, -1))
    x = np.full((rows, 512), 3.0, dtype=np.float32)
    for w in (t, q51):
        _close(ci.linear(x, ci.weight(w)), N.linear(x, N.weight(w)))


def test_mode_from_argument_and_environment(monkeypatch):
    monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    assert CpuBackend().activations == "int16"
    monkeypatch.setenv(ACTIVATIONS_ENV, "float")
    assert CpuBackend().activations == "float"
    assert CpuBackend("int8").activations == "int8"
    monkeypatch.setenv(ACTIVATIONS_ENV, "int4")
    with pytest.raises(InvalidInputError, match="int16, int8, float"):
        CpuBackend()


def test_float_activations_take_the_float_kernels():
    b = CpuBackend("float")
    assert b.activations == "float"
    t = _weight("Q4_1")
    x = np.random.default_rng(2).standard_normal((1, 512)).astype(np.float32)
    _close(b.linear(x, b.weight(t)), N.linear(x, N.weight(t)))


@pytest.fixture(scope="module")
def smollm2_int16():
    from inference import load_model

    m = load_model("smollm2", backend="cpu")
    assert m.backend.activations == "int16"
    return m


def test_smollm2_int16_decode_matches_transformers(smollm2_int16):
    """Token by token (the mat-vec path), against transformers' float32 logits, on the
    chat golden (191 tokens; measured top-1 100%, mean |delta log p| 1.8e-4; the code and
    prose goldens, 100% / 1.1e-4 and 99.2% / 1.9e-4, are in docs/benchmarks.md)."""
    text = g.load_smollm2()["texts"]["chat"]
    ids = [int(i) for i in text["ids"]]
    m, B = smollm2_int16, smollm2_int16.backend
    cache = m.model.make_cache(len(ids))
    rows = [B.to_numpy(m.model(B.array(np.asarray([[t]])), cache))[0, 0] for t in ids]
    agree, dlogp = g.smollm2_agreement(text, np.stack(rows))
    assert agree >= g.SMOLLM2_MIN_TOP1_AGREEMENT, agree
    assert dlogp <= g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1, dlogp


AVX2_CHECK = """
import pickle, sys
import numpy as np
from inference.backends.cpu.quantize import narrow, quantize_rows
from inference.backends.cpu import features as cpu_features
from inference.backends.cpu import matvec_int as cpu_int
from inference.backends.cpu import CpuBackend
from inference.backends.numpy_backend import NumpyBackend
from tests.bundled import random_tensor

assert cpu_features.form() == "avx2" and cpu_int.ROW_GROUP == 2
N = NumpyBackend()
x = np.random.default_rng(8).standard_normal((8, 512)).astype(np.float32) * 3
xs = np.random.default_rng(9).standard_normal((19, 512)).astype(np.float32)  # a prefill's
kept = {}
for mode in ("int16",):  # the default; int8 shares the pair loops (a compile is ~20 s)
    b = CpuBackend(mode)
    assert b.activations == mode
    for qtype in ("Q4_1", "Q5_K", "Q8_0", "Q6_K"):  # 4-, 5- and 8-bit codes
        t = random_tensor(qtype, 70, 512, seed=7)
        w = b.weight(t)
        alone = np.concatenate([b.linear(x[i:i + 1], w) for i in range(8)])
        want = N.linear(x, N.weight(t))
        assert np.abs(alone - want).max() <= 0.05 * np.abs(want).max(), (mode, qtype)
        for rows in range(2, 9):
            got = b.linear(x[:rows], w)
            assert (got.view(np.uint32) == alone[:rows].view(np.uint32)).all(), (mode, qtype, rows)
        # a prefill product (more than MATVEC_ROWS rows): the integer GEMM, each row the
        # bits of the decode mat-vec alone; kept for the AVX-VNNI build's step (below)
        xq = quantize_rows(xs, mode, narrow(mode, w.bits))
        got = b.linear(xs, w)
        rows_alone = np.concatenate([b.linear(xs[i:i + 1], w) for i in range(len(xs))])
        assert (got.view(np.uint32) == rows_alone.view(np.uint32)).all(), (mode, qtype)
        kept[qtype] = (w, xq, got)
with open(sys.argv[1], "wb") as f:
    pickle.dump({q: ((w.codes, w.high, w.blocks, w.kind, w.zero, w.groups), xq, got)
                 for q, (w, xq, got) in kept.items()}, f)
print("avx2 ok")
"""
# The integer GEMM built for AVX-VNNI (``vpdpwssd``): the AVX2 build's prefill products,
# bitwise, from the weights and quantized rows that build kept (no packing or decode
# kernel compiled here).
VNNI_CHECK = """
import pickle, sys
import numpy as np
from inference.backends.cpu import features as cpu_features
from inference.backends.cpu import gemm_int, matvec_int
from inference.backends.cpu.layout import LANES

assert cpu_features.form() == "avx2" and matvec_int._avx_vnni()
with open(sys.argv[1], "rb") as f:
    kept = pickle.load(f)
for qtype, ((codes, high, blocks, kind, zero, groups), xq, want) in kept.items():
    tiles = len(codes) // groups
    out = np.zeros((want.shape[0], tiles * LANES), dtype=np.float32)
    gemm_int.gemm_int(codes, high, blocks, kind, zero, *xq, out, 0, tiles)
    got = np.ascontiguousarray(out[:, :want.shape[1]])
    assert (got.view(np.uint32) == want.view(np.uint32)).all(), qtype
print("vnni ok")
"""
AVX2_FEATURES = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,+fxsr,+lzcnt,+mmx,"
                 "+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")


def _avx2_steps(tmp: Path) -> list[early.Step] | str:

    if not (cpu_features._x86() and "+avx2" in cpu_features.host_cpu_features().split(",")):
        return "needs an x86 host with AVX2"
    # a cache of its own: this target's entries beside the host's would race on their index
    kept = str(tmp / "products.pickle")
    steps = [early.python(AVX2_CHECK, kept, NUMBA_CPU_NAME="haswell",
                          NUMBA_CPU_FEATURES=AVX2_FEATURES, NUMBA_CACHE_DIR=str(tmp / "avx2"))]
    if "+avxvnni" in cpu_features.host_cpu_features().split(","):
        steps.append(early.python(VNNI_CHECK, kept, NUMBA_CPU_NAME="haswell",
                                  NUMBA_CPU_FEATURES=AVX2_FEATURES + ",+avxvnni",
                                  NUMBA_CACHE_DIR=str(tmp / "avxvnni")))
    return steps


@pytest.mark.early(steps=_avx2_steps)
def test_avx2_build_batches_bitwise_as_rows_alone(request):
    """The AVX2 build (pairs, then a single row; ``ROW_GROUP`` 2) compiled for a Haswell
    target in a subprocess, so an AVX-512 host checks it too: each row of batches of 2-8
    is the same bits as the row alone, and near NumPy (5% of the output scale: the
    activations are quantized; the exact checks above run on the host's own build); each
    row of a prefill product (the integer GEMM) is the bits of the row alone. Where the
    host has AVX-VNNI, the GEMM built for it gives the same bits as the AVX2 build's.
    (Started early in the run: tests/early.py.)"""
    runs = early.result(request.node)
    assert runs[0].returncode == 0 and "avx2 ok" in runs[0].stdout, runs[0].stderr[-3000:]
    if "+avxvnni" in cpu_features.host_cpu_features().split(","):
        assert len(runs) == 2 and runs[1].returncode == 0 and "vnni ok" in runs[1].stdout, \
            runs[-1].stderr[-3000:]


CACHED_CALLS = """
import sys
import numpy as np
from inference.backends.cpu import matvec_int as cpu_int
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu import CpuBackend
from tests.bundled import random_tensor
w = CpuBackend("int16").weight(random_tensor("Q4_0", 64, 256, seed=1))
x = np.ones((8, 256), dtype=np.float32)
out = np.empty((8, 64), dtype=np.float32)
if sys.argv[1] == "matvec":
    cpu_int.matvec_packed_int(w.codes, w.blocks, w.halves, w.flat, w.high, w.kind, w.zero,
                              *cpu_quantize.quantize_rows(x, "int16"), out)
else:
    cpu_int.linear_packed_int(w.codes, w.blocks, w.halves, w.flat, w.high, w.kind, w.zero, x,
                              cpu_quantize.level("int16"), out)
print("ok")
"""


CACHED_RUNS = ("matvec", "linear")


@pytest.mark.early(steps=early.over_one_cache(CACHED_CALLS, *CACHED_RUNS))
def test_a_caller_of_a_cached_kernel_compiles(request):
    """Processes over one fresh numba cache: the kernel alone (cached), then the one-call
    entry, which links the cached kernel without generating its IR. Where the kernel holds
    VNNI inline asm, LLVM needs its assembly parser set up in that process too: it
    aborted there when the parser was set up only while generating the asm.
    (Started early in the run: tests/early.py.)"""
    early.assert_ok(early.result(request.node), CACHED_RUNS)
