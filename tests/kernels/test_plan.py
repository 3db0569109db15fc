"""Planners swept over many shapes: limits hold and every output element is covered once.

Coverage is checked by replaying each kernel's index arithmetic (the comments in the .cu
files) over the planned grid and block, counting how often each output element is written.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from kernels.cuda import plan, table
from kernels.cuda.plan import Launch
from kernels.cuda.table import TYPES
from kernels.errors import LaunchError

COLS = [1, 2, 31, 32, 33, 64, 100, 127, 128, 255, 256, 257, 384, 511, 768, 1023, 1024, 1025,
        2048, 4096, 4097, 8192, 14336, 32000, 49152, 128256]
ROWS = [1, 2, 3, 5, 7, 31, 33, 100, 200, 1000, 4097]


def _limits_ok(launch: Launch, kernel: str) -> None:
    b = table.budget(kernel)
    assert launch.threads <= min(1024, b.max_threads) and launch.threads % 32 == 0
    # static __shared__ (checked against ptxas in test_nvcc) plus the dynamic request
    assert b.static_smem + launch.shared_bytes <= 48 * 1024
    assert launch.grid[0] <= 2**31 - 1 and max(launch.grid[1:]) <= 65535


def test_row_planner_limits_and_coverage() -> None:
    for ncols, nrows in itertools.product(COLS, ROWS):
        lp = plan.plan_rows(ncols, nrows)
        for kernel in ("rms_norm_f32", "layer_norm_f32", "softmax_f32"):
            _limits_ok(lp, kernel)
        tx, ty, _ = lp.block
        # rows: row = blockIdx.x * blockDim.y + threadIdx.y, guarded by row < nrows
        rows = (np.arange(lp.grid[0])[:, None] * ty + np.arange(ty)[None, :]).ravel()
        assert np.array_equal(np.bincount(rows[rows < nrows], minlength=nrows), np.ones(nrows))
        # columns: col = threadIdx.x + k * blockDim.x for k >= 0
        cols = np.concatenate([np.arange(t, ncols, tx) for t in range(tx)])
        assert np.array_equal(np.bincount(cols, minlength=ncols), np.ones(ncols))
        # at most 8 elements per thread unless the row is longer than 8192 (then 1024 threads)
        assert -(-ncols // tx) <= plan.ROW_ELEMS_PER_THREAD or tx == 1024
        if ncols <= 256:
            assert tx == 32  # short rows: a warp each, the seed bug's fix


def test_layer_norm_seed_shapes_are_not_1024_threads_per_row() -> None:
    for hidden in (128, 256, 384, 512, 768, 1024):
        lp = plan.plan_rows(hidden, 200)
        assert lp.block[0] <= hidden // 4, (hidden, lp.block)


def test_mat_vec_planner() -> None:
    for t in TYPES.values():
        for mult, nrows, batch in itertools.product([1, 2, 3, 16, 33, 128], ROWS,
                                                    [1, 2, 5, 8, 17]):
            ncols = mult * t.qk
            lp = plan.plan_mul_mat_vec(t, ncols, nrows, batch)
            tile = plan.mmv_tile(batch)
            for path in ("", "h") if t.name in table.HALF_TYPES else ("",):
                _limits_ok(lp, table.mmv_kernel(t, tile, path))
            assert lp.block[0] == 32 and lp.threads <= table.budget("mul_mat_vec_").max_threads
            rows = (np.arange(lp.grid[0])[:, None] * lp.block[1] + np.arange(lp.block[1])).ravel()
            assert np.array_equal(np.bincount(rows[rows < nrows], minlength=nrows), np.ones(nrows))
            # block y serves batch rows tile * y .. tile * y + tile - 1 below batch (mmv.cu)
            b = (np.arange(lp.grid[1])[:, None] * tile + np.arange(tile)).ravel()
            assert np.array_equal(np.bincount(b[b < batch], minlength=batch), np.ones(batch))
            assert plan.plan_mul_mat_vec(t, ncols, nrows, batch, tile=1).grid[1] == batch
        with pytest.raises(LaunchError):
            plan.plan_mul_mat_vec(t, t.qk + 1, 4) if t.qk > 1 else plan.plan_mul_mat_vec(t, 0, 4)
        with pytest.raises(LaunchError):
            plan.plan_mul_mat_vec(t, t.qk, 4, 3, tile=3)  # no such kernel


def test_integer_mat_vec_and_q8_1_planners() -> None:
    for t in (t for t in TYPES.values() if t.dp4a):
        for mult, nrows, batch in itertools.product([1, 3, 5, 33, 128], ROWS, [1, 2, 5, 8, 17]):
            ncols = mult * t.qk
            lp = plan.plan_mul_mat_vec_q(t, ncols, nrows, batch)
            tile = plan.mmv_tile(batch)
            _limits_ok(lp, table.mmv_kernel(t, tile, "q"))
            assert lp.block[0] == 32 and lp.block[1] <= table.MMVQ_ROWS
            rows = (np.arange(lp.grid[0])[:, None] * lp.block[1] + np.arange(lp.block[1])).ravel()
            assert np.array_equal(np.bincount(rows[rows < nrows], minlength=nrows), np.ones(nrows))
            # block y serves batch rows tile * y .. tile * y + tile - 1 below batch (mmv.cu)
            b = (np.arange(lp.grid[1])[:, None] * tile + np.arange(tile)).ravel()
            assert np.array_equal(np.bincount(b[b < batch], minlength=batch), np.ones(batch))
            lq = plan.plan_quantize_q8_1(ncols, batch)
            _limits_ok(lq, "quantize_q8_1")
            blocks = (np.arange(lq.grid[0])[:, None] * lq.block[1] + np.arange(lq.block[1])).ravel()
            nb = ncols // 32
            assert np.array_equal(np.bincount(blocks[blocks < nb], minlength=nb), np.ones(nb))
            assert table.q8_1_row_bytes(ncols) % 16 == 0
            assert table.q8_1_row_bytes(ncols) >= nb * table.Q8_1_BYTES
        with pytest.raises(LaunchError):
            plan.plan_mul_mat_vec_q(t, t.qk + 16, 4)
    with pytest.raises(LaunchError):
        plan.plan_mul_mat_vec_q(TYPES["F16"], 256, 4)  # no integer kernel
    with pytest.raises(LaunchError):
        plan.plan_mul_mat_vec_q(TYPES["Q4_0"], 256, 4, 3, tile=3)  # no such kernel


def test_batch_tile_covers_the_batch_up_to_8() -> None:
    # The smallest tile that holds the batch: weights read once per step up to batch 8.
    assert [plan.mmv_tile(b) for b in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 8]
    assert plan.mmv_tile(100) == 8
    with pytest.raises(LaunchError):
        plan.mmv_tile(0)
    with pytest.raises(LaunchError):
        plan.plan_quantize_q8_1(48)


def test_dequantize_planner() -> None:
    for t in TYPES.values():
        for mult, nrows in itertools.product([1, 3, 16, 128], ROWS):
            ncols = mult * t.qk
            lp = plan.plan_dequantize(t, ncols, nrows)
            _limits_ok(lp, f"dequantize_{t.suffix}_f16")
            slices = nrows * ncols // t.ept
            # thread i < slices writes elements [i*ept, (i+1)*ept) of the flat output
            assert lp.grid[0] * lp.block[0] >= slices > (lp.grid[0] - 1) * lp.block[0]
            assert lp.threads == t.dequant_threads
        # the seed bug: K-quants need 16 threads per super-block, 32-element types 1
        assert t.threads_per_qblock == {256: 16, 32: 1, 1: 1}[t.qk]


def test_elementwise_and_argmax_planners() -> None:
    for n in [1, 31, 32, 33, 255, 256, 257, 10**6, 2**31]:
        lp = plan.plan_elementwise(n)
        for kernel in ("rope_f32", "silu_mul_f32", "gelu_tanh_mul_f32", "gelu_f32"):
            _limits_ok(lp, kernel)
        assert lp.grid[0] * lp.block[0] >= n > (lp.grid[0] - 1) * lp.block[0]
    for ncols, nrows in itertools.product(COLS, [1, 2, 64]):
        lp = plan.plan_argmax(ncols, nrows)
        _limits_ok(lp, "argmax_f32")
        assert lp.grid == (nrows, 1, 1) and lp.block[1:] == (1, 1)


def test_attention_planner() -> None:
    for d, rows, n_kv, kv_blocks in itertools.product([16, 64, 80, 128, 256], [1, 3, 8, 9, 4096],
                                                      [1, 31, 32, 129, 4096, 32768], [1, 8, 64]):
        p = plan.plan_attention(d, rows, n_kv, kv_blocks)
        _limits_ok(p.main, "attn_f32")
        gx, gy, splits = p.main.grid
        assert p.main.block == (32, min(rows, table.ATTN_MAX_ROWS), 1)  # no idle warps
        assert gx * p.main.block[1] >= rows > (gx - 1) * p.main.block[1] and gy == kv_blocks
        assert splits == 1 or n_kv / splits >= plan.ATTN_MIN_KEYS_PER_SPLIT / 2
        assert (p.combine is None) == (splits == 1)
        if p.combine is not None:
            _limits_ok(p.combine, "attn_combine_f32")
            assert p.combine.grid == (gx, gy, 1)
    with pytest.raises(LaunchError):
        plan.plan_attention(512, 1, 10, 1)


def test_planners_respect_smaller_device_limits() -> None:
    small = plan.DeviceLimits(max_threads_per_block=256)
    for ncols in COLS:
        assert plan.plan_rows(ncols, 3, small).threads <= 256
        assert plan.plan_argmax(ncols, 3, small).threads <= 256


@pytest.mark.parametrize("sm_count", [40, 80, 128, 132])  # T4, default, RTX 4090, H100 SXM
def test_decode_attention_fills_the_device_at_batch_one(sm_count: int) -> None:
    # One token at 4k and 8k context for SmolLM2 (9/3 heads, d 64) and Llama 3 8B (32/8,
    # d 128): split-K launches at least one block per SM, unlike a block per head.
    limits = plan.DeviceLimits(sm_count=sm_count)
    for heads, kv_heads, d in [(9, 3, 64), (32, 8, 128)]:
        for n_kv in (4096, 8192):
            p = plan.plan_attention(d, heads // kv_heads, n_kv, kv_heads, limits)
            gx, gy, gz = p.main.grid
            assert gx * gy * gz >= sm_count, (heads, n_kv, p.main.grid)


def test_decode_layer_kernel_counts() -> None:
    # Every decoder family (biases, RoPE, the KV writes, per-head q/k norms and the norms
    # after attention and MLP are epilogues): 8 launches a layer, 9 when attention splits
    # its keys; 18-19 before the fusions; whatever the cache's type.
    count = lambda **kw: len(plan.decode_layer_kernels(plan.LayerShape(**kw)))  # noqa: E731
    assert count() == 8 and count(gelu=True) == 8
    assert count(attention_splits=4) == 9
    assert count(qk_norm=True) == 8  # Qwen3
    assert count(sandwich_norms=True, gelu=True) == 8  # Gemma 2
    assert count(qk_norm=True, sandwich_norms=True, gelu=True) == 8  # Gemma 3
    assert count(qk_norm=True, sandwich_norms=True, attention_splits=2) == 9
    assert count(attention_splits=2) < plan.UNFUSED_LAYER_KERNELS
    # Every stem names kernels that exist (the index lists each kernel of every module).
    index = (Path(__file__).resolve().parents[2] / "kernels" / "cuda" / "KERNELS.md").read_text()
    every = plan.decode_layer_kernels(plan.LayerShape(qk_norm=True, sandwich_norms=True,
                                                      attention_splits=2))
    for stem in set(every) | {"gelu_tanh_mul_q8_1", "mul_mat_vec_q_rope_kv"}:
        assert f"`{stem}" in index, stem
