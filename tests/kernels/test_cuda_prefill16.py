"""16-bit prefill GEMMs (CudaBackend(prefill_dtype=float16 | "bfloat16")): weights and
activations rounded to 16 bits, cublasGemmEx with float32 products and sums.

- The cuBLAS stand-in (tests/kernels/emulator/cublas.py) follows cuBLAS's column-major
  contract: checked against products built independently of our argument mapping, for all
  four transposes with padded leading dimensions. ops.gemm_16 (the mapping + the call)
  against float64 on the exact 16-bit values: |y - ref| <= 1e-5 sum|x||w| + 1e-6 (float32
  sums only).
- dequantize_*_bf16 rounds like ops.to_bf16_bits (nearest even) of the float32 kernel's
  values, bitwise, race check on.
- Whole model: per mode against the float32 mode, bars 20x the rounding of one input
  (half 2^-11: 1e-2; bfloat16 2^-9: 4e-2) of the largest |logit|; scratch reused.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from inference.backends.cuda import CudaBackend
from inference.errors import InvalidInputError
from inference.generate import generate_step
from inference.models import llama
from inference.sampling import SamplingParams
from kernels.cuda import blas, ops
from kernels.cuda.device import Device
from tests.bundled import smollm2_gguf
from tests.kernels.conftest import fake_gpu
from tests.kernels.emulator.cublas import emulate_gemm_ex
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.test_cuda_backend import _build, _tensor, tiny_llama
from tests.kernels.test_cuda_half_weights import _tiny_16bit

BF16 = ops.BF16
BARS = {"float16": 1e-2, "bfloat16": 4e-2}  # of the largest |logit|: 20x one rounding


def _sixteen(a: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(stored 16-bit data, its exact float64 value)."""
    if dtype == BF16:
        bits = ops.to_bf16_bits(np, a)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    h = a.astype(np.float16)
    return h, h.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("ta,tb", list(itertools.product([0, 1], repeat=2)))
def test_gemm_ex_stand_in_follows_the_column_major_contract(dtype: np.dtype, ta: int,
                                                            tb: int) -> None:
    rng = np.random.default_rng(ta * 2 + tb)
    m, n, k, pad = 7, 5, 33, 3
    a, a64 = _sixteen(rng.standard_normal((m, k)).astype(np.float32), dtype)  # op(A)
    b, b64 = _sixteen(rng.standard_normal((k, n)).astype(np.float32), dtype)  # op(B)

    def col_major(mat: np.ndarray, ld: int) -> np.ndarray:
        """mat stored column-major with leading dimension ld (rows past mat's: junk)."""
        buf = np.full(ld * mat.shape[1], 0x7F80 if dtype == BF16 else np.inf, dtype)
        for j in range(mat.shape[1]):
            buf[j * ld:j * ld + mat.shape[0]] = mat[:, j]
        return buf

    A = a.T if ta else a  # the stored matrix, op(A) = A.T when transposed
    B = b.T if tb else b
    lda, ldb, ldc = A.shape[0] + pad, B.shape[0] + pad, m + pad
    c = np.full(ldc * n, 7.0, np.float32)
    g = blas.GemmEx(ta, tb, m, n, k, lda, ldb, ldc, blas.DATA_TYPES[dtype],
                    blas.DATA_TYPES[dtype], blas.CUDA_R_32F)
    emulate_gemm_ex(g, col_major(A, lda), col_major(B, ldb), c)
    ref = a64 @ b64
    got = c.reshape(n, ldc).T  # column j of C at c[j * ldc:]
    np.testing.assert_allclose(got[:m], ref, rtol=0,
                               atol=1e-5 * (np.abs(a64) @ np.abs(b64)).max() + 1e-6)
    assert (got[m:] == 7.0).all()  # rows past m: untouched
    with pytest.raises(ValueError, match="leading dimension"):
        emulate_gemm_ex(
            blas.GemmEx(ta, tb, m, n, k, A.shape[0] - 1, ldb, ldc, g.a_type, g.b_type, g.c_type),
            col_major(A, lda), col_major(B, ldb), c)
    with pytest.raises(ValueError, match="type code"):
        other = blas.CUDA_R_16F if dtype == BF16 else blas.CUDA_R_16BF
        emulate_gemm_ex(blas.GemmEx(ta, tb, m, n, k, lda, ldb, ldc, other, other,
                                    blas.CUDA_R_32F), col_major(A, lda), col_major(B, ldb), c)


# (tokens, rows, k): one element; odd k past a multiple of 8; wide k; rows not multiples of 8.
GEMM_SHAPES = [(1, 1, 1), (9, 37, 1025), (13, 96, 256), (10, 5, 4100)]


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_16_matches_float64(dtype: np.dtype, shape: tuple, dev: Device) -> None:
    # On a GPU (-m gpu) this is the real cublasGemmEx call, never run here.
    t, rows, k = shape
    rng = np.random.default_rng(t + rows + k)
    x, x64 = _sixteen(rng.standard_normal((t, k)).astype(np.float32) * 3, dtype)
    w, w64 = _sixteen(rng.standard_normal((rows, k)).astype(np.float32) * 0.1, dtype)
    before = dev.launches
    y = ops.gemm_16(dev, dev.to_device(x), dev.to_device(w))
    assert dev.launches == before + 1  # one Python-level launch
    y = dev.to_host(y)
    assert y.shape == (t, rows) and y.dtype == np.float32
    ref = x64 @ w64.T
    bound = 1e-5 * (np.abs(x64) @ np.abs(w64).T) + 1e-6  # float32 summation only
    assert (np.abs(y - ref) <= bound).all()


def test_gemm_16_refuses_mixed_or_float32_operands() -> None:
    dev = EmulatedDevice()
    h = dev.to_device(np.ones((2, 8), np.float16))
    with pytest.raises(Exception, match="float16 or bfloat16"):
        ops.gemm_16(dev, h, dev.to_device(np.ones((3, 8), np.uint16)))
    with pytest.raises(Exception, match="float16 or bfloat16"):
        ops.gemm_16(dev, dev.to_device(np.ones((2, 8), np.float32)),
                    dev.to_device(np.ones((3, 8), np.float32)))


# (type, rows, cols): one element a thread (F32 as the activations' rounding, F16, BF16);
# staged block types with blocks that start and end mid-row.
DQ_CASES = [("F32", 11, 1025), ("F16", 7, 33), ("BF16", 9, 1025), ("Q4_0", 5, 96),
            ("Q8_0", 37, 1056), ("Q6_K", 3, 768), ("Q3_K", 5, 2304)]


@pytest.mark.parametrize("case", DQ_CASES, ids=lambda c: c[0])
def test_dequantize_to_bfloat16_rounds_to_nearest_even(case: tuple) -> None:
    qtype, rows, cols = case
    rng = np.random.default_rng(rows)
    if qtype == "F32":  # activations: spread exponents, ties, -0 and an overflow to inf
        data = (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-6, 6, (rows, cols))
                ).astype(np.float32)
        data.reshape(-1)[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -0.0, 3.4e38]
    elif qtype in ("F16", "BF16"):
        data = _sixteen(rng.standard_normal((rows, cols)).astype(np.float32),
                        np.dtype(np.float16) if qtype == "F16" else BF16)[0]
    else:
        data = _tensor("w", qtype, (rows, cols), rng).data
    dev = EmulatedDevice(check_races=True)
    w = ops.upload_matrix(dev, data, qtype, (rows, cols))
    ids = dev.to_device(np.array([rows - 1, 0, rows, 1 % rows, -1], np.int32))
    for sel in (None, ids):
        f32 = ops.dequantize(dev, w, np.float32, ids=sel)
        got = ops.dequantize(dev, w, BF16, ids=sel)
        np.testing.assert_array_equal(got.view(np.ndarray), ops.to_bf16_bits(np, f32))
    assert (got[2:5:2] == 0x7FC0).all()  # ids out of range: NaN rows


def _logits_and_tokens(ckpt: object, make: object, mode: object, prompt: list[int],
                       n_tokens: int) -> tuple[np.ndarray, list[int], CudaBackend]:
    """Prefill logits over `prompt` (more than 8 rows: the GEMM path) and n_tokens greedy
    tokens after it, float mat-vecs and a float32 cache (the GEMMs alone differ)."""
    C = CudaBackend(EmulatedDevice(), prefill_dtype=mode, kv_dtype=np.float32)
    C.q8_1_activations = False
    model = make(ckpt, C)
    logits = C.to_numpy(model(C.array(np.array([prompt])), model.make_cache()))
    steps = generate_step(model, prompt, SamplingParams(temperature=0.0),
                          np.random.default_rng(0), max_len=len(prompt) + n_tokens + 8)
    toks = list(itertools.islice(steps, n_tokens))
    steps.close()
    return logits, toks, C


def _compare(name: str, ref: tuple, got: tuple, mode: str) -> float:
    (a, ta, _), (b, tb, _) = ref, got
    rel = float(np.abs(a - b).max() / np.abs(a).max())
    print(f"{name} prefill {mode} vs float32: max |dlogit| {np.abs(a - b).max():.4g} "
          f"({rel:.3g} of {np.abs(a).max():.3g}), top-1 {(a.argmax(-1) == b.argmax(-1)).sum()}"
          f" of {a.shape[1]}, greedy {sum(x == y for x, y in zip(ta, tb, strict=True))} of "
          f"{len(ta)}")
    tol = BARS[mode] * np.abs(a).max()
    assert np.abs(a - b).max() <= tol, rel
    top2 = np.sort(a, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * tol
    assert (a.argmax(-1) == b.argmax(-1))[clear].all()
    return rel


IDS = [1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]


def test_16bit_prefill_modes_against_float32_on_a_tiny_llama(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Q4_K weights: dequantized into the 16-bit scratch; Q8_0 down projections too.
    ckpt = tiny_llama("Q4_K", layers=1)
    make = lambda c, C: _build(llama, c, C)  # noqa: E731
    ref = _logits_and_tokens(ckpt, make, np.float32, IDS, 6)
    for mode in ("float16", "bfloat16"):
        got = _logits_and_tokens(ckpt, make, mode if mode == "bfloat16" else np.float16, IDS, 6)
        _compare("tiny Llama Q4_K", ref, got, mode)
        C = got[2]
        dtype = BF16 if mode == "bfloat16" else np.dtype(np.float16)
        # one weight's worth of scratch (the largest: gate/up stacked, 1024 x 256), not the
        # model's, and the activations' rows x widest input; both of the mode's type
        assert {k: (v.dtype, v.size) for k, v in C._scratch.items()} == {
            "w": (dtype, 1024 * 256), "x": (dtype, len(IDS) * 512)}
        # a second prefill reuses both buffers and calls gemmEx once per linear
        kept = dict(C._scratch)
        calls: list[object] = []
        gemm = C.dev.gemm_ex
        monkeypatch.setattr(C.dev, "gemm_ex",
                            lambda *a, c=calls, f=gemm: (c.append(a[0]), f(*a)))
        model = _build(llama, ckpt, C)
        model(C.array(np.array([IDS])), model.make_cache())
        assert all(C._scratch[k] is kept[k] for k in kept)
        # q/k/v, o, gate/up, down (stacked) and the LM head
        assert len(calls) == 5 and all(g.a_type == blas.DATA_TYPES[dtype] for g in calls)


def test_bf16_weights_go_to_the_bfloat16_gemm_in_place() -> None:
    # BF16 checkpoint weights are the GEMM's operands as they are: no weight scratch, and
    # only the activations are rounded.
    ckpt = _tiny_16bit("BF16")
    make = lambda c, C: _build(llama, c, C)  # noqa: E731
    ref = _logits_and_tokens(ckpt, make, np.float32, IDS, 4)
    got = _logits_and_tokens(ckpt, make, "bfloat16", IDS, 4)
    _compare("tiny Llama BF16 weights", ref, got, "bfloat16")
    assert set(got[2]._scratch) == {"x"}


def test_prefill_dtype_is_checked() -> None:
    assert CudaBackend(EmulatedDevice()).prefill_dtype == np.float32
    assert CudaBackend(EmulatedDevice(), prefill_dtype="bfloat16").prefill_dtype == BF16
    with pytest.raises(InvalidInputError, match="float32, float16 or bfloat16, not"):
        CudaBackend(EmulatedDevice(), prefill_dtype=np.int8)


def test_load_model_takes_the_prefill_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    # load_model(prefill_dtype=...) reaches the cuda backend; a backend without the setting
    # refuses it in one sentence before any weight loads.
    import inference.api as api
    from inference import load_model

    fake_gpu(monkeypatch, EmulatedDevice)
    m = load_model(str(smollm2_gguf()), backend="cuda", n_layers=1, prefill_dtype="float16")
    assert m.backend.prefill_dtype == np.float16
    with pytest.raises(InvalidInputError, match="numpy backend has no prefill_dtype setting"):
        load_model(str(smollm2_gguf()), backend="numpy", prefill_dtype="float16")
    assert "prefill_dtype" in api.load_model.__doc__


@pytest.mark.long  # ~3 min on 2 cores: opt-in (INFERDESK_LONG=1), figures in docs/cuda.md
def test_smollm2_16bit_prefill_against_float32() -> None:
    # All 30 layers, float mat-vecs, float32 cache: the prefill GEMMs alone differ.
    from inference.formats import read_checkpoint
    from inference.models.common import Weights

    ckpt = read_checkpoint(smollm2_gguf())
    args = llama.ModelArgs.from_dict(ckpt.config)
    make = lambda c, C: llama.Model(args, C, Weights(c, C))  # noqa: E731
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30]
    ref = _logits_and_tokens(ckpt, make, np.float32, prompt, 16)
    for mode in ("float16", "bfloat16"):
        got = _logits_and_tokens(ckpt, make, mode if mode == "bfloat16" else np.float16,
                                 prompt, 16)
        _compare("SmolLM2", ref, got, mode)
        assert (ref[0].argmax(-1) == got[0].argmax(-1)).all()
        assert ref[1] == got[1]
