"""Decode mat-vec of Q2_K / Q3_K file bytes over int16 / int8 activations
(inference/backends/cpu/kdot.py) against NumPy and the float file-byte kernel.

The kernel computes ``W @ (d * q)`` up to float32 rounding, ``d * q`` the activations
quantized per group of 32 (``cpu_quantize.quantize_rows``). So:
- against ``dequantize_raw(W) @ (d * q)`` in float64 it is within 1e-5 of the output
  scale (float32 tails and a different summation order, as tests/test_cpu_idot.py);
- against the float kernel on ``x`` itself it is within the quantization's own bound,
  ``|W| @ (d / 2)`` per output (rounding moves each activation by at most half a step),
  plus that 1e-5: for int16 the bound is ~3e-5 of the output scale, for int8 ~1e-2.
Real files: the tiny Llama 3 quantized by llama.cpp (tests/goldens/tiny, every matrix a
K-quant: Q2_K, Q3_K among them) decoded token by token against transformers' logits.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.backends.cpu import CpuBackend
from inference.backends.cpu import kdot as cpu_kdot
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu import raw as cpu_raw
from inference.backends.cpu.pack import RawWeight
from inference.formats.quants import dequantize_raw
from inference.formats.tensor import TensorData
from tests import early
from tests import goldens_io as g
from tests.bundled import random_tensor

pytestmark = pytest.mark.skipif(not cpu_kdot.available(),
                                reason="x86 AVX2 kernels (elsewhere the float file-byte ones)")

TYPES = ("Q2_K", "Q3_K")
WIDTHS = list(cpu_quantize.LEVELS)
# (weight rows, row length, activation rows): odd row counts (tasks of 8 rows cut short),
# one to five blocks a row, every activation grouping (4, 2, 1 and their sums up to 8).
SHAPES = [(37, 512, 1), (33, 256, 3), (70, 1280, 5), (9, 768, 7), (64, 256, 8), (1, 256, 2)]


def _raw(t: TensorData) -> np.ndarray:
    return np.ascontiguousarray(t.data).view(np.uint8).reshape(t.shape[0], -1)


def _linear(t: TensorData, x: np.ndarray, width: str) -> np.ndarray:
    out = np.full((x.shape[0], t.shape[0]), np.nan, dtype=np.float32)
    cpu_kdot.linear(_raw(t), cpu_raw.CODE[t.qtype], x, cpu_quantize.level(width), out)
    return out


def _dense(t: TensorData) -> np.ndarray:
    return dequantize_raw(t.data, t.qtype).reshape(t.shape).astype(np.float64)


def _steps(x: np.ndarray, width: str) -> tuple[np.ndarray, np.ndarray]:
    """The dequantized activations ``d * q`` and each one's step ``d`` (float64)."""
    xp, dx, _ = cpu_quantize.quantize_rows(x, width)
    d = np.repeat(dx.astype(np.float64), 32, axis=1)
    return xp.astype(np.float64) * d, d


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_multiplies_the_quantized_activations(qtype, width, shape):
    n, k, rows = shape
    t = random_tensor(qtype, n, k, seed=n + k)
    x = np.random.default_rng(rows).standard_normal((rows, k)).astype(np.float32) * 3
    xd, step = _steps(x, width)
    w = _dense(t)
    got, want = _linear(t, x, width), xd @ w.T
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    # Against the float kernel on x itself: the quantization's bound, and no better than
    # it by accident (the bound is not vacuous: int8 moves the result visibly).
    fl = np.empty_like(got)
    cpu_raw.matvec(_raw(t), cpu_raw.CODE[qtype], x, fl)
    bound = np.abs(w) @ (step / 2).T
    assert np.all(np.abs(got - fl) <= bound.T + 2e-5 * scale)
    if width == "int8":
        assert np.abs(got - fl).max() > 1e-4 * scale


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_extreme_codes_and_scales_do_not_overflow(qtype, width):
    """The largest integer sums: every code at its extreme (Q2_K 3, Q3_K -4), every
    sub-block scale at its largest magnitude (Q2_K 15 with min 15, Q3_K -32), against
    activations all at +-L; and then the other extreme (Q3_K +3 with scale +31)."""
    t = random_tensor(qtype, 16, 512, seed=1)
    b = _raw(t).reshape(-1, cpu_kdot.SIZE[cpu_raw.CODE[qtype]]).copy()
    x = np.full((3, 512), 2.0, dtype=np.float32)
    x[1] = -2.0
    x[2, ::3] = -2.0
    fills = ([{(0, 16): 0xFF, (16, 80): 0xFF}] if qtype == "Q2_K"
             else [{(0, 32): 0x00, (32, 96): 0x00, (96, 108): 0x00},  # code -4, scale -32
                   {(0, 32): 0xFF, (32, 96): 0xFF, (96, 108): 0xFF}])  # code 3, scale 31
    for fill in fills:
        for (lo, hi), v in fill.items():
            b[:, lo:hi] = v
        tt = TensorData("w", t.shape, qtype, b.reshape(t.shape[0], -1))
        for xx in (x, x[:1]):
            want = _steps(xx, width)[0] @ _dense(tt).T
            np.testing.assert_allclose(_linear(tt, xx, width), want, rtol=0,
                                       atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("width", WIDTHS)
def test_backend_decode_takes_the_integer_kernel_and_prefill_the_float_path(width):
    b = CpuBackend(width)
    t = random_tensor("Q3_K", 40, 512, seed=5)
    w = b.weight(t)
    assert isinstance(w, RawWeight) and w.code in cpu_kdot.CODES
    x = np.random.default_rng(6).standard_normal((9, 512)).astype(np.float32)
    for rows in (1, 8):  # decode: the one call, bit for bit
        np.testing.assert_array_equal(b.linear(x[:rows], w).view(np.uint32),
                                      _linear(t, x[:rows], width).view(np.uint32))
    fl = CpuBackend("float")
    np.testing.assert_array_equal(b.linear(x, w), fl.linear(x, fl.weight(t)))  # 9 rows


@pytest.mark.parametrize("name", ["llama3_Q2_K.llamacpp", "llama3_Q3_K_M.llamacpp"])
def test_tiny_llama_cpp_files_decode_like_transformers(name, monkeypatch):
    """Token by token with the default int16 activations; this file's Q2_K / Q3_K matrices
    go through cpu_kdot, and each such call on the model's real activations is checked
    against NumPy on the quantized activations (1e-5 of the output scale; measured 2e-7).
    End to end against transformers: the same argmax at every position and max |delta
    logit| <= 2e-3 * max |logit|. The float kernels meet 1e-5 here; int16 activations
    move each product by ~3e-5 (relative, measured per call) and the tiny random model
    amplifies that: measured 4.6e-3 / 6.0e-3 (Q2_K) and 8.1e-3 / 1.5e-2 (Q3_K_M) on
    logits of 12-13.5, against 1.0e-3 / 2.3e-3 when only the packed types' kernels
    quantized (before cpu_kdot)."""
    from inference.api import load_model
    from tests.test_cpu_kquants import decode_logits

    seen: set[int] = set()
    kernel = cpu_kdot.linear
    qtypes = {v: k for k, v in cpu_raw.CODE.items()}

    def checked(raw, code, x, level, out):  # type: ignore[no-untyped-def]
        kernel(raw, code, x, level, out)
        seen.add(code)
        w = dequantize_raw(raw, qtypes[code]).reshape(raw.shape[0], -1).astype(np.float64)
        want = _steps(x, "int16")[0] @ w.T
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))

    monkeypatch.setattr(cpu_kdot, "linear", checked)
    z = np.load(g.GOLDENS_DIR / "tiny" / f"{name}.npz")
    model = load_model(str(g.GOLDENS_DIR / "tiny" / f"{name}.gguf"), backend="cpu")
    assert model.backend.activations == "int16"
    for seq in ("chat", "random"):
        ref = z[f"{seq}.logits"]
        got = decode_logits(model, z[f"{seq}.ids"].tolist())
        assert np.array_equal(got.argmax(-1), ref.argmax(-1)), seq
        diff = float(np.abs(got - ref).max())
        assert diff <= 2e-3 * float(np.abs(ref).max()), (seq, diff)
    assert cpu_raw.CODE["Q2_K" if "Q2_K" in name else "Q3_K"] in seen


CACHED_CALLS = """
import sys
import numpy as np
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu import kdot as cpu_kdot
from inference.backends.cpu import raw as cpu_raw
from tests.bundled import random_tensor
t = random_tensor("Q2_K", 16, 256, seed=1)
raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(16, -1)
x = np.ones((1, 256), dtype=np.float32)
xp, dx, _ = cpu_quantize.quantize_rows(x, "int16")
out = np.empty((1, 16), dtype=np.float32)
if sys.argv[1] == "matvec":
    cpu_kdot.matvec(raw, cpu_raw.Q2_K, xp, dx, cpu_kdot._sums16(xp, dx), out)
else:
    cpu_kdot.linear(raw, cpu_raw.Q2_K, x, cpu_quantize.level("int16"), out)
print("ok")
"""


CACHED_RUNS = ("matvec", "linear", "linear")


@pytest.mark.early(steps=early.over_one_cache(CACHED_CALLS, *CACHED_RUNS))
def test_kernels_load_from_numba_cache_without_crashing(request):
    """Processes over one fresh numba cache: the kernel alone, then the one-call entry
    twice (the second run loads it from the cache). With the kernel cached on its own,
    that third process crashed (segfault); it is left out of the cache since.
    (Started early in the run: tests/early.py.)"""
    early.assert_ok(early.result(request.node), CACHED_RUNS)
