"""The bfloat16 KV cache mode (CudaBackend(kv_dtype="bfloat16"), kernels/cuda/kv_bf16.cu).

bfloat16 is stored as uint16 bit patterns (ops.KV_BF16). Kernel parity: attention over a
bfloat16 cache against float64 attention over the same values, rtol 1e-5 / atol 1e-6
(widening is a shift, exact, so only the kernel's float32 arithmetic differs), every
ATTN_CASES shape with the race check on. The rounding (ops.to_bf16_bits, the eager write,
and kv_store_bf16, the captured step's) against an independent nearest-even reference.
Model parity against the float32 cache: bars and measured figures in the tests and in
docs/cuda.md.
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
from kernels.cuda import ops, step
from tests.bundled import smollm2_gguf
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.test_cuda_backend import _build, tiny_llama
from tests.kernels.test_kernels import ATTN_CASES, _ids, check_attention
from tests.kernels.test_mmv_tiles import recording

BF16 = ops.KV_BF16


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids)
def test_attention_over_a_bfloat16_cache(case: tuple) -> None:
    # Both thread orders and shuffled blocks (bitwise equal), then parity.
    check_attention(EmulatedDevice(check_races=True), case, np.random.default_rng(13),
                    kv_dtype=BF16)


def nearest_even_bf16(x: np.ndarray) -> np.ndarray:
    """The reference: of the two bfloat16 values around x (its float32 bits truncated, and
    the next one up in magnitude), the nearer in float64, the even one on a tie; past the
    largest finite value the next one is inf, which counts as 2^128 (IEEE overflow)."""
    u = x.astype(np.float32).view(np.uint32)
    lo = (u >> 16).astype(np.uint32)
    hi = lo + 1

    def mag(bits: np.ndarray) -> np.ndarray:
        f = (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where((bits & 0x7FFF) == 0x7F80, 2.0**128, np.abs(f))

    with np.errstate(invalid="ignore"):  # NaN inputs: replaced below
        xa = np.abs(x.astype(np.float64))
        dlo, dhi = xa - mag(lo), mag(hi) - xa
    up = (dhi < dlo) | ((dhi == dlo) & (lo & 1 == 1))
    out = np.where(up, hi, lo).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), out)


def _edge_values(rng: np.random.Generator, n: int) -> np.ndarray:
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    x[:12] = [1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 2.0**-130, 3e-39, -0.0,
              3.4028235e38, -3.39e38, np.inf, -np.inf, np.nan, 1 + 2.0**-8 + 2.0**-20]
    return x


def test_rounding_is_nearest_even() -> None:
    # Ties (1 + 2^-8 down to 1, 1 + 3 * 2^-8 up to even), subnormals, -0, overflow to inf,
    # infinities and NaN; then a million random bit patterns of every exponent.
    rng = np.random.default_rng(5)
    x = _edge_values(rng, 4096)
    assert np.array_equal(ops.to_bf16_bits(np, x), nearest_even_bf16(x))
    r = rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    assert np.array_equal(ops.to_bf16_bits(np, r), nearest_even_bf16(r))
    exact = np.array([1.5, -1.75 * 2.0**100, 2.0**-133], np.float32)  # 8 mantissa bits
    assert np.array_equal(ops.kv_as_f32(np, ops.to_bf16_bits(np, exact)), exact)


def test_captured_row_write_rounds_like_the_eager_write() -> None:
    # batch 2, 3 heads, head_dim 20 into row 5 of a 7-row view of a 9-row cache.
    dev = EmulatedDevice(check_races=True)
    src = _edge_values(np.random.default_rng(2), 120).reshape(2, 3, 1, 20)
    cache = dev.zeros((2, 3, 9, 20), BF16)
    pos = dev.to_device(np.array([5], np.int32))
    step.kv_store(dev, dev.to_device(src), cache[:, :, :7], pos)
    want = np.zeros((2, 3, 9, 20), np.uint16)
    want[:, :, 5:6] = nearest_even_bf16(src)
    assert np.array_equal(dev.to_host(cache), want)


def test_bfloat16_is_a_mode_not_the_default() -> None:
    assert CudaBackend(EmulatedDevice()).kv_dtype == np.float16
    assert CudaBackend(EmulatedDevice(), kv_dtype="bfloat16").kv_dtype == BF16
    with pytest.raises(InvalidInputError, match="float32, float16 or bfloat16, not"):
        CudaBackend(EmulatedDevice(), kv_dtype=np.int8)


def _runs(ckpt: object, prompt: list[int], greedy_prompt: int, n_tokens: int,
          make: object) -> dict:
    """Per cache mode: prefill logits over `prompt`, and n_tokens greedy tokens after its
    first `greedy_prompt` ids (graphs on), with float mat-vecs (the cache alone differs)."""
    runs = {}
    for kv in (np.float32, "bfloat16"):
        C = CudaBackend(EmulatedDevice(), kv_dtype=kv)
        C.q8_1_activations = False
        names = recording(C.dev)
        model = make(ckpt, C)
        cache = model.make_cache()
        logits = C.to_numpy(model(C.array(np.array([prompt])), cache))
        assert cache.keys[0].dtype == C.kv_dtype
        steps = generate_step(model, prompt[:greedy_prompt], SamplingParams(temperature=0.0),
                              np.random.default_rng(0), max_len=greedy_prompt + n_tokens + 8)
        toks = list(itertools.islice(steps, n_tokens))
        steps.close()
        assert C.graphs and C.graph_error is None
        if kv == "bfloat16":  # prefill, the eager first decode step, the captured ones
            assert {"attn_kv_bf16", "kv_store_bf16", "attn_vec_kv_bf16_e2_pos"} <= set(names)
        runs[str(kv if isinstance(kv, str) else np.dtype(kv).name)] = logits, toks
    return runs


def test_tiny_llama_bfloat16_cache_against_float32_cache() -> None:
    # Prefill (11 tokens: the tiled kernel over the bfloat16 cache) and greedy decode with
    # graphs on (the captured kv_store_bf16 and attn_vec_kv_bf16_e2_pos). Measured (Q4_K, 1 layer):
    # see docs/cuda.md. Bar: 4e-2 of the largest |logit| (K and V each rounded by up to 2^-9
    # relative; 20x that, as the half cache's bar is 20x 2^-11), top-1 equal where the
    # float32 cache's top two differ by more than twice the bar.
    ckpt = tiny_llama("Q4_K", layers=1)
    ids = [1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]
    runs = _runs(ckpt, ids, 3, 8, lambda c, C: _build(llama, c, C))
    (a, ta), (b, tb) = runs["float32"], runs["bfloat16"]
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"tiny Llama Q4_K bfloat16 vs float32 cache: max |dlogit| {rel:.3g} of the largest, "
          f"top-1 {(a.argmax(-1) == b.argmax(-1)).sum()} of {a.shape[1]}, greedy "
          f"{sum(x == y for x, y in zip(ta, tb, strict=True))} of {len(ta)}")
    tol = 4e-2 * np.abs(a).max()
    assert np.abs(a - b).max() <= tol, rel
    top2 = np.sort(a, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * tol
    assert (a.argmax(-1) == b.argmax(-1))[clear].all()


@pytest.mark.long  # ~2 min on 2 cores: opt-in (INFERDESK_LONG=1), figures in docs/cuda.md
def test_smollm2_bfloat16_cache_against_float32_cache() -> None:
    # All 30 layers, float mat-vecs (the cache's rounding alone). Measured: docs/cuda.md.
    from inference.formats import read_checkpoint
    from inference.models.common import Weights

    ckpt = read_checkpoint(smollm2_gguf())
    args = llama.ModelArgs.from_dict(ckpt.config)
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30]
    runs = _runs(ckpt, prompt, 4, 16, lambda c, C: llama.Model(args, C, Weights(c, C)))
    (a, ta), (b, tb) = runs["float32"], runs["bfloat16"]
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"SmolLM2 bfloat16 vs float32 cache: max |dlogit| {np.abs(a - b).max():.4g} "
          f"({rel:.3g} of {np.abs(a).max():.3g}), top-1 "
          f"{(a.argmax(-1) == b.argmax(-1)).sum()} of {a.shape[1]}, greedy "
          f"{sum(x == y for x, y in zip(ta, tb, strict=True))} of {len(ta)}")
    assert rel <= 4e-2
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert ta == tb
