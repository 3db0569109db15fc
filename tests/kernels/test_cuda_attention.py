"""Attention at long context: prefill scratch that does not grow with t^2, and split-K
decode that fills a device at batch 1, checked on the emulator against float64 NumPy.

Tolerances: rtol 1e-5, atol 1e-6 (float32 online softmax against float64).
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from inference.backends.cuda import CudaBackend
from kernels.cuda import ops, plan, table
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.test_kernels import attention_ref

ROOT = Path(__file__).resolve().parents[2]


def _qkv(dev: EmulatedDevice, rng: np.random.Generator, t: int, n_kv: int, heads: int = 4,
         kv_heads: int = 2, d: int = 32) -> tuple:
    q = rng.standard_normal((1, heads, t, d), dtype=np.float32)
    k = rng.standard_normal((1, kv_heads, n_kv, d), dtype=np.float32)
    v = rng.standard_normal((1, kv_heads, n_kv, d), dtype=np.float32)
    return q, k, v


def _record_launches(dev: EmulatedDevice) -> list[str]:
    """The names of the kernels ``dev`` launches from now on, in order."""
    launched: list[str] = []
    launch = dev.launch
    dev.launch = lambda m, n, *a: (launched.append(n), launch(m, n, *a))  # type: ignore
    return launched


def _host_peak(t: int) -> int:
    """Peak bytes of Python-level allocations during one prefill attention at ``t``."""
    dev = EmulatedDevice()
    q, k, v = (dev.to_device(a) for a in _qkv(dev, np.random.default_rng(5), t, t))
    C = CudaBackend(dev)
    tracemalloc.start()
    C.attention(q, k, v, 0.17, causal_offset=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_prefill_attention_scratch_does_not_grow_with_t_squared() -> None:
    # The backend's prefill attention at t = 96 and t = 384: the device allocates the output
    # and the planned split-K partials (linear in t), and the host's Python-level
    # allocations stay under 64 KiB (call overhead) while the (heads, t, t) score matrix
    # would be 0.15 MB and 2.4 MB. tracemalloc counts every thread of its process, so the
    # host peak is read in a fresh interpreter, where the call is the only thread.
    rng = np.random.default_rng(5)
    for t in (96, 384):
        dev = EmulatedDevice()
        C = CudaBackend(dev)
        q, k, v = (dev.to_device(a) for a in _qkv(dev, rng, t, t))
        scores_bytes = q.shape[1] * t * t * 4
        dev.allocations.clear()
        out = C.attention(q, k, v, 0.17, causal_offset=0)
        scratch = plan.plan_attention(32, 2 * t, t, 2).scratch_bytes
        assert sum(dev.allocations) == q.nbytes + scratch, dev.allocations
        assert max(dev.allocations) < scores_bytes  # no buffer the size of the scores
        np.testing.assert_allclose(out, attention_ref(q, k, v, 0.17, 0), rtol=1e-5, atol=1e-6)
    code = ("from tests.kernels.test_cuda_attention import _host_peak; "
            "print(_host_peak(96), _host_peak(384))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, check=True)
    for t, host_peak in zip((96, 384), map(int, r.stdout.split()), strict=True):
        assert host_peak < 64 * 1024 < q.shape[1] * t * t * 4, (t, host_peak)


def test_planned_scratch_is_linear_in_t_at_any_context() -> None:
    # Split-K partials are the kernel's only scratch: bounded by the blocks that fill the
    # device times one row tile, never by t * n_kv.
    d, heads, kv_heads = 128, 32, 8
    rows_per_t = heads // kv_heads
    fill = plan.ATTN_BLOCKS_PER_SM * table.SM_COUNT
    for t in (1, 7, 100, 1000, 8192, 32768):
        for n_kv in {t, t + 4096}:
            p = plan.plan_attention(d, rows_per_t * t, n_kv, kv_heads)
            row_tiles = p.main.grid[0]
            bound = 4 * (d + 2) * table.ATTN_MAX_ROWS * (fill + row_tiles * kv_heads)
            assert p.scratch_bytes <= bound, (t, n_kv, p)


@pytest.mark.parametrize("masked", [False, True])
def test_decode_attention_at_8k_context(masked: bool) -> None:
    # One token, 4 query heads over 2 kv heads, head_dim 32, 8192 cached keys (a view of a
    # 8200-slot cache): the decode kernel (attn_vec_*), split-K giving at least one block
    # per SM at batch 1.
    n_kv, cap = 8192, 8200
    p = plan.plan_attention_vec(32, 2, n_kv, 2)
    blocks = p.main.grid[0] * p.main.grid[1] * p.main.grid[2]
    assert p.splits > 1 and blocks >= table.SM_COUNT, p
    dev = EmulatedDevice(check_races=True)  # both thread orders, blocks shuffled
    rng = np.random.default_rng(8)
    q, kc, vc = _qkv(dev, rng, 1, cap)
    mask = None
    if masked:  # padding-style holes, and the whole first half of the cache hidden
        mask = (rng.random((1, n_kv)) > 0.2).astype(np.float32)
        mask[0, : n_kv // 2] = 0
    k, v = dev.to_device(kc)[:, :, :n_kv], dev.to_device(vc)[:, :, :n_kv]
    launched = _record_launches(dev)
    got = ops.attention(dev, dev.to_device(q), k, v, 1 / np.sqrt(32), causal_offset=n_kv - 1,
                        key_mask=None if mask is None else dev.to_device(mask))
    ref = attention_ref(q, kc[:, :, :n_kv], vc[:, :, :n_kv], 1 / np.sqrt(32), n_kv - 1, mask)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert launched == ["attn_vec_f32_e2", "attn_combine_f32"]
    assert dev.allocations[-3:] == [q.nbytes, p.scratch_bytes - 4 * p.splits * 2 * 2 * 2,
                                    4 * p.splits * 2 * 2 * 2]  # output, partials, (m, l)


@pytest.mark.parametrize(("d", "kv", "kernel"), [
    (64, np.float16, "attn_vec_kv_f16_e2"), (128, "bfloat16", "attn_vec_kv_bf16_e4"),
    (256, np.float32, "attn_vec_f32_e8"), (72, np.float16, "attn_vec_kv_f16_e4"),
    (66, np.float16, "attn_kv_f16")])  # 66 % 4: no vector width, the tiled kernel
def test_decode_takes_the_vector_kernel(d: int, kv: object, kernel: str) -> None:
    # A decode step without GQA (one row a kv head, so several warps split the keys) and
    # a 4-group one, against float64 over the cache's values: rtol 1e-5, atol 1e-6.
    rng = np.random.default_rng(d)
    for heads, kv_heads in ((3, 3), (8, 2)):
        C = CudaBackend(EmulatedDevice(), kv_dtype=kv)
        launched = _record_launches(C.dev)
        q, k, v = _qkv(C.dev, rng, 1, 150, heads, kv_heads, d)
        kc = C.dev.to_device(ops.to_bf16_bits(np, k) if kv == "bfloat16" else k.astype(kv))
        vc = C.dev.to_device(ops.to_bf16_bits(np, v) if kv == "bfloat16" else v.astype(kv))
        got = C.attention(C.dev.to_device(q), kc, vc, 0.1, causal_offset=149)
        ref = attention_ref(q, ops.kv_as_f32(np, C.to_numpy(kc)),
                            ops.kv_as_f32(np, C.to_numpy(vc)), 0.1, 149)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        assert launched[0] == kernel


@pytest.mark.parametrize("kv", [np.float32, np.float16, "bfloat16"])
def test_head_dim_past_the_kernel_limit_takes_the_gemm_path(kv: object) -> None:
    # head_dim 288 > ATTN_MAX_HEAD_DIM: CudaBackend.attention folds grouped queries into
    # rows and runs two GEMMs around the masked softmax kernel, widening a 16-bit cache
    # exactly first. Prefill of 5 tokens after 6 cached ones (GQA 2), with a window and a
    # key mask; against float64 over the cache's values, rtol 1e-5 / atol 1e-6.
    d, t, n_kv = table.ATTN_MAX_HEAD_DIM + 32, 5, 11
    C = CudaBackend(EmulatedDevice(), kv_dtype=kv)
    launched: list[str] = []
    launch = C.dev.launch
    C.dev.launch = lambda m, n, *a: (launched.append(n), launch(m, n, *a))  # type: ignore
    rng = np.random.default_rng(d)
    q, k, v = _qkv(C.dev, rng, t, n_kv, d=d)
    k, v = (ops.to_bf16_bits(np, a) if kv == "bfloat16" else a.astype(kv) for a in (k, v))
    mask = (rng.random((1, n_kv)) > 0.2).astype(np.float32)
    for window, key_mask in ((None, None), (4, mask)):
        got = C.to_numpy(C.attention(C.array(q), C.dev.to_device(k), C.dev.to_device(v),
                                     d ** -0.5, causal_offset=n_kv - t, window=window,
                                     key_mask=None if key_mask is None else C.array(key_mask)))
        ref = attention_ref(q, ops.kv_as_f32(np, k), ops.kv_as_f32(np, v), d ** -0.5,
                            n_kv - t, key_mask, window)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert launched == ["softmax_f32", "softmax_f32"]  # no tiled attention kernel
