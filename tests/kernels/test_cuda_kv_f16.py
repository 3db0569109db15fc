"""The float16 KV cache mode (CudaBackend(kv_dtype=np.float16), kernels/cuda/kv_f16.cu).

Kernel parity: attention over a half cache against float64 attention over the same half
values, rtol 1e-5 / atol 1e-6 (widening half to float is exact, so only the kernel's float32
arithmetic differs, as for the float32 cache), every ATTN_CASES shape with the race check
on; the captured step's row write bitwise equal to NumPy's astype(float16) (both round to
nearest even). Model parity (half cache against the float32 cache, the same backend
otherwise): bars and measured figures in the tests and in docs/cuda.md.
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
from tests.kernels.emulator.traffic import TrafficDevice
from tests.kernels.test_cuda_backend import _build, tiny_llama
from tests.kernels.test_kernels import ATTN_CASES, _ids, check_attention


@pytest.mark.parametrize("case", ATTN_CASES, ids=_ids)
def test_attention_over_a_half_cache(case: tuple) -> None:
    # Both thread orders and shuffled blocks (bitwise equal), then parity.
    check_attention(EmulatedDevice(check_races=True), case, np.random.default_rng(11),
                    kv_dtype=np.float16)


def test_captured_row_write_rounds_like_numpy() -> None:
    # batch 2, 3 heads, head_dim 20 (not a multiple of a warp) into row 5 of a 7-row view of
    # a 9-row cache; values at half's edges: ties, subnormals, overflow to inf, -0.
    dev = EmulatedDevice(check_races=True)
    rng = np.random.default_rng(2)
    src = (rng.standard_normal((2, 3, 1, 20)) * 100).astype(np.float32)
    src.flat[:8] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 3e-6, 65520.0, -70000.0,
                    -0.0, 65504.0]
    cache = dev.zeros((2, 3, 9, 20), np.float16)
    view = cache[:, :, :7]
    pos = dev.to_device(np.array([5], np.int32))
    step.kv_store(dev, dev.to_device(src), view, pos)
    want = np.zeros((2, 3, 9, 20), np.float16)
    with np.errstate(over="ignore"):  # 65520 and -70000 overflow to +-inf, as in the kernel
        want[:, :, 5:6] = src.astype(np.float16)
    assert np.array_equal(dev.to_host(cache).view(np.uint16), want.view(np.uint16))


def test_half_cache_halves_the_attention_bytes() -> None:
    # The memory model (32-byte sectors per warp-level load): decode over 70 keys (3
    # tiles, the last partial), GQA 2, head_dim 80 (the decode kernel, attn_vec_*). K and V
    # loads stay whole sectors (100%), each K/V byte is read once by the block whatever
    # its rows (moved/useful 1: the tiled kernel read V once per row, 2), and a 16-bit
    # cache moves half the bytes of the float32 one.
    # The bfloat16 cache (ops.KV_BF16, 2-byte bit patterns) moves what the half one does.
    moved = {}
    for kv in (np.float32, np.float16, ops.KV_BF16):
        dev = TrafficDevice()
        rng = np.random.default_rng(0)
        q = dev.to_device(rng.standard_normal((1, 4, 1, 80)).astype(np.float32))
        kc, vc = (dev.to_device(ops.to_bf16_bits(np, x) if kv == ops.KV_BF16 else x.astype(kv))
                  for x in (rng.standard_normal((1, 2, 77, 80)).astype(np.float32)
                            for _ in range(2)))
        ops.attention(dev, q, kc[:, :, :70], vc[:, :, :70], 0.1, causal_offset=69)
        (name,) = [k for k in dev.traffic if k.startswith("attn_") and "combine" not in k]
        k_load, v_load = dev.traffic[name][(1, "load")], dev.traffic[name][(2, "load")]
        assert k_load.efficiency == v_load.efficiency == 1.0, name
        assert name.startswith("attn_vec_"), name
        assert k_load.moved_per_useful == v_load.moved_per_useful == 1.0, name
        moved[np.dtype(kv).name] = k_load.bytes_moved + v_load.bytes_moved
    assert moved["float16"] * 2 == moved["float32"] == 2 * 70 * 80 * 4 * 2  # K, V; 2 heads
    assert moved["uint16"] == moved["float16"]


def test_half_is_the_default_and_other_cache_types_are_refused() -> None:
    assert CudaBackend(EmulatedDevice()).kv_dtype == np.float16  # chosen by the parity below
    with pytest.raises(InvalidInputError, match="float32, float16 or bfloat16, not"):
        CudaBackend(EmulatedDevice(), kv_dtype=np.int8)


def test_tiny_llama_half_cache_against_float32_cache() -> None:
    # Prefill (11 tokens: the GEMM path, the tiled kernel over the half cache) and greedy
    # decode with graphs on (the captured kv_store_f16 and attn_vec_kv_f16_e2_pos). Float mat-vecs,
    # so the cache's rounding is the only difference. Measured (Q4_K, 1 layer): max |logit
    # delta| 2.0e-5 of the largest |logit| (2 layers: also 2.0e-5), top-1 equal at all 11
    # positions, 24 of 24 greedy tokens equal. Bar: 1e-2 relative (K and V each rounded by
    # up to 2^-11 relative; 20x that), top-1 equal where the float32 cache's top two differ
    # by more than twice the bar (10 of the 11), and the first 8 greedy tokens.
    ckpt = tiny_llama("Q4_K", layers=1)
    runs = {}
    for kv in (np.float32, np.float16):
        C = CudaBackend(EmulatedDevice(), kv_dtype=kv)
        C.q8_1_activations = False
        model = _build(llama, ckpt, C)
        cache = model.make_cache()
        ids = np.array([[1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]])
        logits = C.to_numpy(model(C.array(ids), cache))
        assert cache.keys[0].dtype == kv and cache.values[0].dtype == kv
        steps = generate_step(model, [1, 5, 9], SamplingParams(temperature=0.0),
                              np.random.default_rng(0), max_len=16)
        toks = list(itertools.islice(steps, 8))
        steps.close()
        runs[np.dtype(kv).name] = logits, toks, C
    (a, ta, _), (b, tb, C16) = runs["float32"], runs["float16"]
    assert C16.graphs and C16.graph_error is None
    tol = 1e-2 * np.abs(a).max()
    assert np.abs(a - b).max() <= tol, np.abs(a - b).max() / np.abs(a).max()
    top2 = np.sort(a, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * tol
    assert clear.any() and (a.argmax(-1) == b.argmax(-1))[clear].all()
    assert ta == tb


@pytest.mark.long  # ~2 min on 2 cores: opt-in (INFERDESK_LONG=1), figures in docs/cuda.md
def test_smollm2_half_cache_against_float32_cache() -> None:
    # All 30 layers, float mat-vecs (the cache's rounding alone). Measured: see docs/cuda.md.
    from inference.formats import read_checkpoint
    from inference.models.common import Weights

    ckpt = read_checkpoint(smollm2_gguf())
    args = llama.ModelArgs.from_dict(ckpt.config)
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30]
    runs = {}
    for kv in (np.float32, np.float16):
        C = CudaBackend(EmulatedDevice(), kv_dtype=kv)
        C.q8_1_activations = False
        model = llama.Model(args, C, Weights(ckpt, C))
        logits = C.to_numpy(model(C.array(np.array([prompt])), model.make_cache()))
        steps = generate_step(model, prompt[:4], SamplingParams(temperature=0.0),
                              np.random.default_rng(0), max_len=40)
        runs[np.dtype(kv).name] = logits, list(itertools.islice(steps, 16))
        steps.close()
    (a, ta), (b, tb) = runs["float32"], runs["float16"]
    assert np.abs(a - b).max() <= 1e-2 * np.abs(a).max()
    assert (a.argmax(-1) == b.argmax(-1)).all()
    assert ta == tb
