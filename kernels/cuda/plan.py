"""Launch planners: pure functions (shape, type, device limits) -> Launch.

Nothing here touches a device, so tests sweep them over thousands of shapes. Every planner
returns blocks whose thread count is a multiple of 32 (the emulator rejects partial warps in
warp intrinsics) and within the device's limits, and raises LaunchError for a shape it
cannot launch rather than launching a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.cuda import table
from kernels.cuda.table import KernelType
from kernels.errors import LaunchError


@dataclass(frozen=True)
class DeviceLimits:
    max_threads_per_block: int = table.MAX_THREADS_PER_BLOCK
    max_shared_per_block: int = table.MAX_SHARED_PER_BLOCK
    max_grid_x: int = table.MAX_GRID_X
    max_grid_yz: int = table.MAX_GRID_YZ
    sm_count: int = table.SM_COUNT


DEFAULT_LIMITS = DeviceLimits()


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0  # dynamic shared memory; static __shared__ is in table.BUDGETS

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def check(self, limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
        if not (0 < self.threads <= limits.max_threads_per_block and self.threads % 32 == 0):
            raise LaunchError(f"block {self.block} is not 32..1024 whole warps")
        gx, gy, gz = self.grid
        if not (0 < gx <= limits.max_grid_x and 0 < gy <= limits.max_grid_yz
                and 0 < gz <= limits.max_grid_yz):
            raise LaunchError(f"grid {self.grid} exceeds the device's limits")
        if self.shared_bytes > limits.max_shared_per_block:
            raise LaunchError(f"{self.shared_bytes} bytes of shared memory exceed the limit")
        return self


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# Elements each thread of a row kernel handles, at most. 8 gives every thread a few
# independent loads to overlap, and still gives a 4096-wide row (Llama hidden size) 512
# threads, so a single decode row is not left to one warp. (The seed bug: 1024 threads for
# every row, which for a 384-wide row leaves 640 threads idle and costs 3-6x.)
ROW_ELEMS_PER_THREAD = 8
# Rows of up to 256 columns get one warp each; 4 such rows share a block so that blocks are
# 128 threads: an SM runs at most 16-32 blocks at once, and 1-warp blocks would cap it at
# 16-32 resident warps.
ROWS_PER_WARP_BLOCK = 4


def threads_per_row(ncols: int, limits: DeviceLimits = DEFAULT_LIMITS) -> int:
    want = _pow2_at_least(_cdiv(max(ncols, 1), ROW_ELEMS_PER_THREAD))
    return max(32, min(want, limits.max_threads_per_block, 1024))


def plan_rows(ncols: int, nrows: int, limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """rms_norm, layer_norm, softmax: blockDim.x threads per row, blockDim.y rows per block."""
    if ncols < 1 or nrows < 1:
        raise LaunchError(f"row kernel on an empty ({nrows}, {ncols}) array")
    tpr = threads_per_row(ncols, limits)
    rows = min(ROWS_PER_WARP_BLOCK, nrows) if tpr == 32 else 1
    return Launch((_cdiv(nrows, rows), 1, 1), (tpr, rows, 1)).check(limits)


def plan_mul_mat_vec(t: KernelType, ncols: int, nrows: int, batch: int = 1,
                     limits: DeviceLimits = DEFAULT_LIMITS, tile: int | None = None) -> Launch:
    """Float and 16-bit mat-vecs (mmv.cu mul_mat_vec_*, mul_mat_vec_h_*): one warp per output
    row; `tile` batch rows of x per block (default :func:`mmv_tile`), the tiles on grid.y."""
    if ncols % t.qk or ncols < 1 or nrows < 1 or batch < 1:
        raise LaunchError(f"{t.name} mat-vec needs columns in whole blocks of {t.qk}, "
                                f"got ({nrows}, {ncols}) x batch {batch}")
    tile = _tile(batch, tile)
    rows = min(t.mmv_rows_per_block, nrows)  # tiny matrices: no idle warps
    return Launch((_cdiv(nrows, rows), _cdiv(batch, tile), 1), (32, rows, 1)).check(limits)


def plan_quantize_q8_1(ncols: int, batch: int = 1,
                       limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """One warp per q8_1 block (mmv.cu quantize_q8_1); batch rows on grid.y."""
    if ncols % table.Q8_1_QK or ncols < 1 or batch < 1:
        raise LaunchError(f"q8_1 needs whole blocks of {table.Q8_1_QK} values, got {ncols}")
    nb = ncols // table.Q8_1_QK
    warps = min(table.Q8_1_WARPS, nb)
    return Launch((_cdiv(nb, warps), batch, 1), (32, warps, 1)).check(limits)


def mmv_tile(batch: int) -> int:
    """Batch rows per weight read of the decode mat-vecs (integer, float and 16-bit) for a
    batch of x rows: the smallest of table.MMV_TILES that holds the whole batch (the largest
    beyond it).

    Decode is bound by weight bytes, and a block reads its weights once for its whole tile,
    so the weight bytes per token fall by the tile: 1 / batch up to 8. Rows of a tile past
    the batch cost nothing (the kernels skip them), but a bigger tile than needed holds more
    accumulators (and, in the integer kernel, shared memory: 5.6 KB at 1, 13.5 KB at 8), so
    fewer blocks fit an SM; hence the smallest tile that covers the batch, not always 8."""
    if batch < 1:
        raise LaunchError(f"mat-vec of an empty batch ({batch})")
    return next((n for n in table.MMV_TILES if n >= batch), table.MMV_TILES[-1])


def _tile(batch: int, tile: int | None) -> int:
    tile = mmv_tile(batch) if tile is None else tile
    if tile not in table.MMV_TILES:
        raise LaunchError(f"no mat-vec reads its weights once per {tile} rows")
    return tile


def plan_mul_mat_vec_q(t: KernelType, ncols: int, nrows: int, batch: int = 1,
                       limits: DeviceLimits = DEFAULT_LIMITS, tile: int | None = None) -> Launch:
    """Integer mat-vec (mmv.cu mul_mat_vec_q_*): one warp per output row, up to
    table.MMVQ_ROWS per block (they share the staged x); `tile` batch rows of x per block
    (default :func:`mmv_tile`), the tiles on grid.y."""
    if not t.dp4a:
        raise LaunchError(f"{t.name} has no integer mat-vec")
    if ncols % t.qk or ncols < 1 or nrows < 1 or batch < 1:
        raise LaunchError(f"{t.name} mat-vec needs columns in whole blocks of {t.qk}, "
                          f"got ({nrows}, {ncols}) x batch {batch}")
    tile = _tile(batch, tile)
    rows = min(table.MMVQ_ROWS, nrows)
    return Launch((_cdiv(nrows, rows), _cdiv(batch, tile), 1), (32, rows, 1)).check(limits)


def plan_dequantize(t: KernelType, ncols: int, nrows: int,
                    limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """One thread per t.ept elements (see dequant.cu); 1-D grid."""
    if ncols % t.qk or ncols < 1 or nrows < 1:
        raise LaunchError(f"{t.name} rows need whole blocks of {t.qk}, got {ncols} columns")
    slices = nrows * (ncols // t.ept)
    return Launch((_cdiv(slices, t.dequant_threads), 1, 1), (t.dequant_threads, 1, 1)).check(limits)


# The probe's self-test: one warp, the smallest launch that exercises a shuffle.
SELFTEST_THREADS = 32


def plan_self_test(n: int, limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    if not 0 < n <= SELFTEST_THREADS:
        raise LaunchError(f"the self-test takes 1..{SELFTEST_THREADS} values, got {n}")
    return Launch((1, 1, 1), (SELFTEST_THREADS, 1, 1)).check(limits)


def plan_step_inputs(limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """step_inputs_i32 writes two ints: one thread does it; a warp is the smallest block."""
    return Launch((1, 1, 1), (table.WARP, 1, 1)).check(limits)


# Streaming elementwise kernels: 256 threads per block, one element (or pair) per thread.
ELEMENTWISE_THREADS = 256


def plan_elementwise(n: int, limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    if n < 1:
        raise LaunchError("elementwise kernel on an empty array")
    return Launch((_cdiv(n, ELEMENTWISE_THREADS), 1, 1), (ELEMENTWISE_THREADS, 1, 1)).check(limits)


def plan_rope_kv(heads: int, kv_heads: int, head_dim: int, batch: int = 1,
                 limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """rope_kv_* (kv_store.cuh): one thread per pair of a q/k/v row, ELEMENTWISE_THREADS a
    block; the batch's rows on grid.y."""
    if heads < 1 or kv_heads < 1 or head_dim < 2 or head_dim % 2 or batch < 1:
        raise LaunchError(f"rope_kv of {heads} heads, {kv_heads} kv heads of {head_dim}")
    pairs = (heads + 2 * kv_heads) * head_dim // 2
    return Launch((_cdiv(pairs, ELEMENTWISE_THREADS), batch, 1),
                  (ELEMENTWISE_THREADS, 1, 1)).check(limits)


def plan_argmax(ncols: int, nrows: int, limits: DeviceLimits = DEFAULT_LIMITS) -> Launch:
    """One block per row; threads follow the row length like the norms (a vocab row of 32K+
    gets 1024 threads, a 100-wide test row one warp)."""
    if ncols < 1 or nrows < 1:
        raise LaunchError("argmax of an empty array")
    return Launch((nrows, 1, 1), (threads_per_row(ncols, limits), 1, 1)).check(limits)


# Attention (attention.cu): one query row per warp, at most table.ATTN_MAX_ROWS per block, so
# a block's K tile serves 8 rows; fewer rows (decode: the query heads of one kv head) get
# exactly as many warps.
#
# Split-K: launch enough blocks to keep every SM busy. An SM holds 16-32 blocks; 4 per SM
# of up to 8 warps each gives it 4-32 warps to hide the K/V reads behind, and beyond that
# more splits only add partial writes. A split covers at least 2 tiles (64 keys): it reads
# 2 * 64 * head_dim floats of K/V and writes (head_dim + 2) floats per row (rows = the
# group, <= 8 in decode), so partials and the combine cost at most ~1/16 of its K/V
# traffic; with fewer keys a small model (3 kv heads) could not fill a 132-SM device at
# 4k context. Prefill rarely splits: its row tiles already fill the device.
ATTN_BLOCKS_PER_SM = 4
ATTN_MIN_KEYS_PER_SPLIT = 2 * table.ATTN_TILE


@dataclass(frozen=True)
class AttentionPlan:
    main: Launch  # attn_f32; main.grid[2] is the number of splits
    combine: Launch | None  # attn_combine_f32, when there is more than one split
    scratch_floats: int  # part + part_ml: splits * heads * rows * (head_dim + 2), or 0

    @property
    def splits(self) -> int:
        return self.main.grid[2]

    @property
    def scratch_bytes(self) -> int:
        return 4 * self.scratch_floats


def plan_attention(head_dim: int, rows: int, n_kv: int, kv_blocks: int,
                   limits: DeviceLimits = DEFAULT_LIMITS) -> AttentionPlan:
    """rows = query rows per kv head (group * positions); kv_blocks = batch * kv_heads."""
    if not 0 < head_dim <= table.ATTN_MAX_HEAD_DIM:
        raise LaunchError(f"head_dim {head_dim} outside 1..{table.ATTN_MAX_HEAD_DIM}")
    if n_kv < 1 or rows < 1 or kv_blocks < 1:
        raise LaunchError("attention over an empty cache or no queries")
    if kv_blocks > limits.max_grid_yz:
        raise LaunchError(f"batch * kv_heads = {kv_blocks} exceeds the grid's y limit")
    warps = min(table.ATTN_MAX_ROWS, rows)
    row_tiles = _cdiv(rows, warps)
    want = _cdiv(ATTN_BLOCKS_PER_SM * limits.sm_count, row_tiles * kv_blocks)
    splits = max(1, min(want, _cdiv(n_kv, ATTN_MIN_KEYS_PER_SPLIT), limits.max_grid_yz))
    main = Launch((row_tiles, kv_blocks, splits), (32, warps, 1)).check(limits)
    if splits == 1:
        return AttentionPlan(main, None, 0)
    combine = Launch((row_tiles, kv_blocks, 1), (32, warps, 1)).check(limits)
    return AttentionPlan(main, combine, splits * kv_blocks * rows * (head_dim + 2))


# Decode attention (attention.cuh, attn_vec_*): every query row of a kv head in one block
# (rows <= table.ATTN_MAX_ROWS: decode's group of query heads), ATTN_VEC_WARPS warps splitting
# the keys, lane l holding E = attn_vec_width(head_dim) elements of a K/V row. Split-K from
# the SM count: ATTN_VEC_BLOCKS_PER_SM blocks per SM (4 warps each; ptxas: 96-126 registers,
# so 4 such blocks fit an SM's registers, 16 warps with 64 K/V values in flight per lane),
# each split at least ATTN_MIN_KEYS_PER_SPLIT keys.
ATTN_VEC_WARPS = 4
ATTN_VEC_BLOCKS_PER_SM = 2
ATTN_VEC_WIDTHS = (2, 4, 8)  # E: head_dim up to 64, 128, 256


def attn_vec_width(head_dim: int) -> int | None:
    """E for head_dim (the smallest with 32 * E >= head_dim), or None where the vector
    kernel does not apply (head_dim % E != 0 or past 256)."""
    e = next((e for e in ATTN_VEC_WIDTHS if 32 * e >= head_dim), None)
    return e if e is not None and head_dim % e == 0 else None


def attn_vec_shared_bytes(head_dim: int, rows: int, warps: int = ATTN_VEC_WARPS) -> int:
    """The rows' queries and each warp's running (accumulator, max, sum) per row."""
    return 4 * (rows * head_dim + warps * rows * (head_dim + 2))


def plan_attention_vec(head_dim: int, rows: int, n_kv: int, kv_blocks: int,
                       limits: DeviceLimits = DEFAULT_LIMITS) -> AttentionPlan:
    """attn_vec_*: rows = query rows per kv head (<= ATTN_MAX_ROWS), kv_blocks = batch *
    kv_heads; the combine (attn_combine_f32) as for plan_attention."""
    if attn_vec_width(head_dim) is None:
        raise LaunchError(f"head_dim {head_dim} has no vector attention kernel")
    if not 0 < rows <= table.ATTN_MAX_ROWS or n_kv < 1 or kv_blocks < 1:
        raise LaunchError(f"vector attention takes 1..{table.ATTN_MAX_ROWS} rows and keys")
    if kv_blocks > limits.max_grid_yz:
        raise LaunchError(f"batch * kv_heads = {kv_blocks} exceeds the grid's y limit")
    want = _cdiv(ATTN_VEC_BLOCKS_PER_SM * limits.sm_count, kv_blocks)
    splits = max(1, min(want, _cdiv(n_kv, ATTN_MIN_KEYS_PER_SPLIT), limits.max_grid_yz))
    main = Launch((1, kv_blocks, splits), (32, ATTN_VEC_WARPS, 1),
                  attn_vec_shared_bytes(head_dim, rows)).check(limits)
    if splits == 1:
        return AttentionPlan(main, None, 0)
    combine = Launch((1, kv_blocks, 1), (32, rows, 1)).check(limits)
    return AttentionPlan(main, combine, splits * kv_blocks * rows * (head_dim + 2))


# --- a decoder layer's decode step: its kernels, in launch order ---------------------------
# The fused step (ops.py's entry points) for one new token, q8_1 activations on a weight
# type with an integer mat-vec: what each launch replaces.
#   rms_norm_q8_1       the input norm and quantize_q8_1 of its output
#   mul_mat_vec_q_rope_kv_*  q/k/v stacked (Weights.linears), + bias (Qwen2), the
#                       per-head q/k RMSNorms (Qwen3, Gemma 3: in the last block of each
#                       head), then RoPE and the KV row writes, all in the epilogue (two
#                       ropes, two norms and two KV row writes; a float32, float16 or
#                       bfloat16 cache)
#   attn_vec_*          attention, ending in o_proj's q8_1 row (no quantize_q8_1); softcap
#                       (Gemma 2) and the window are kernel arguments
#   attn_combine_f32    only when attention splits its keys (plan_attention_vec): then it
#                       writes the q8_1 row
#   mul_mat_vec_q_*     o_proj, + the residual in the epilogue (with norms after attention
#                       and MLP, Gemma 2/3: no residual; the next launch adds it)
#   rms_norm_q8_1       the pre-MLP norm and its quantize_q8_1; Gemma 2/3:
#                       rms_norm_add_rms_norm_q8_1, the post-attention norm, the residual
#                       add and the pre-MLP norm (rms_norm_f32 and add_f32 saved)
#   mul_mat_vec_q_*     gate/up stacked
#   silu_mul_q8_1       the activation (gelu_tanh_mul_q8_1: Gemma) and its quantize_q8_1
#   mul_mat_vec_q_*     down, + the residual in the epilogue (mul_mat_vec_q_norm_add_*
#                       with the post-feedforward norm, as o_proj)
@dataclass(frozen=True)
class LayerShape:
    """The switches of a decoder layer (inference/models/llama.py) that change its launches."""

    qk_norm: bool = False
    sandwich_norms: bool = False
    gelu: bool = False  # gelu_tanh_mul instead of silu_mul
    attention_splits: int = 1  # plan_attention_vec's splits at the step's key count


def decode_layer_kernels(s: LayerShape) -> tuple[str, ...]:
    """The launches of one layer's fused decode step, by kernel (name stem: the mat-vecs
    are mul_mat_vec_q_<type>, attention attn_vec_<cache>_e<E>_pos): 8, 9 when attention
    splits its keys, whatever the cache's type."""
    mmv = "mul_mat_vec_q"
    down = "mul_mat_vec_q_norm_add" if s.sandwich_norms else mmv
    mlp_norm = "rms_norm_add_rms_norm_q8_1" if s.sandwich_norms else "rms_norm_q8_1"
    combine = ("attn_combine_f32",) if s.attention_splits > 1 else ()
    act = "gelu_tanh_mul_q8_1" if s.gelu else "silu_mul_q8_1"
    return ("rms_norm_q8_1", "mul_mat_vec_q_rope_kv", "attn_vec", *combine, mmv, mlp_norm, mmv,
            act, down)


# Before the fusions (the eager step's kernels, a captured step's extra row writes and adds):
# per layer 2 norms, 4 quantize_q8_1, 4 mat-vecs, 2 ropes, 2 KV row writes, attention,
# silu_mul and 2 residual adds, + the combine when attention splits.
UNFUSED_LAYER_KERNELS = 18
