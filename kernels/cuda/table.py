"""Every per-type launch constant of the CUDA kernels, in one table.

The C++ side (quants.cuh) mirrors ``qk``, ``block_bytes``, ``ept`` and ``dp4a``; a test reads them
back from the ``type_info`` kernel and compares, and another compares ``qk``/``block_bytes``
with gguf-py's GGML_QUANT_SIZES. Planners take launch parameters only from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelType:
    name: str  # GGML type name, as in TensorData.qtype
    suffix: str  # kernel name suffix: mul_mat_vec_<suffix>, dequantize_<suffix>_f32
    ggml_id: int  # GGMLQuantizationType value
    qk: int  # elements per block
    block_bytes: int  # bytes per block
    ept: int  # elements one thread dequantizes (a block, a 16-element sub-block, or 1)
    mmv_rows_per_block: int  # warps (= output rows) per block of mul_mat_vec
    dequant_threads: int  # threads per block of dequantize_* (one thread per ept elements)
    dp4a: bool = False  # has mul_mat_vec_q_<suffix>: q8_1 activations, integer dot products

    @property
    def threads_per_qblock(self) -> int:
        """Threads that share one quant block (16 for K-quants: the seed bug's constant)."""
        return self.qk // self.ept

    def row_bytes(self, ncols: int) -> int:
        return ncols // self.qk * self.block_bytes


# Mat-vec: 4 warps (128 threads) per block gives each SM enough resident blocks to hide
# memory latency at 32-48 registers per thread without starving small matrices of blocks.
# Dequantize: 256 threads, a common occupancy sweet spot for streaming kernels.
_T = KernelType
TYPES: dict[str, KernelType] = {
    t.name: t
    for t in (
        _T("F32", "f32", 0, 1, 4, 1, 4, 256),
        _T("F16", "f16", 1, 1, 2, 1, 4, 256),
        _T("BF16", "bf16", 30, 1, 2, 1, 4, 256),
        _T("Q4_0", "q4_0", 2, 32, 18, 32, 4, 256, True),
        _T("Q4_1", "q4_1", 3, 32, 20, 32, 4, 256, True),
        _T("Q5_0", "q5_0", 6, 32, 22, 32, 4, 256, True),
        _T("Q5_1", "q5_1", 7, 32, 24, 32, 4, 256, True),
        _T("Q8_0", "q8_0", 8, 32, 34, 32, 4, 256, True),
        _T("Q2_K", "q2_k", 10, 256, 84, 16, 4, 256, True),
        _T("Q3_K", "q3_k", 11, 256, 110, 16, 4, 256, True),
        _T("Q4_K", "q4_k", 12, 256, 144, 16, 4, 256, True),
        _T("Q5_K", "q5_k", 13, 256, 176, 16, 4, 256, True),
        _T("Q6_K", "q6_k", 14, 256, 210, 16, 4, 256, True),
    )
}

# q8_1 activation blocks (quants.cuh): 32 int8 and two halves. A q8_1 row of x is padded to
# a multiple of 16 bytes so that every row starts 16-byte aligned (mmv.cu loads uint4).
Q8_1_QK = 32
Q8_1_BYTES = 36
# Integer mat-vec (mul_mat_vec_q_*): 4 warps (rows) per block like the float path, and
# MMVQ_COLS columns per warp step (32 lanes x one 32-element group each): MMVQ_* in mmv.cu.
MMVQ_ROWS = 4
MMVQ_COLS = 1024
# Batch rows one block of a decode mat-vec dots with each weight read (llama.cpp's mmvq
# ncols_y), for the integer, float and 16-bit kernels alike: mul_mat_vec_<path><suffix> for 1,
# mul_mat_vec_<path>b<n>_<suffix> for the others (each written out in mmv.cu).
# plan.mmv_tile picks one per batch size.
MMV_TILES = (1, 2, 4, 8)
MMVQ_X_WORDS = MMVQ_COLS // Q8_1_QK * Q8_1_BYTES // 16  # uint4 of one batch row's x stage
MMVQ_W_WORDS = 72  # uint4 per warp of the weight stage


def mmv_kernel(t: KernelType, tile: int, path: str = "") -> str:
    """Name of the decode mat-vec of type t that reads each weight once per `tile` batch rows;
    path "q" the integer kernel, "h" the 16-bit vector kernel, "" the float kernel."""
    head = f"mul_mat_vec_{path}_" if path else "mul_mat_vec_"
    return f"{head}{t.suffix}" if tile == 1 else f"{head}b{tile}_{t.suffix}"


def mmvq_smem(tile: int) -> int:
    """Static shared memory of the integer mat-vec with `tile` batch rows (mmvq_smem_<n>)."""
    return 16 * (tile * MMVQ_X_WORDS + MMVQ_ROWS * MMVQ_W_WORDS)

# 16-bit mat-vec (mul_mat_vec_h_*, F16 and BF16): lane l of a warp step takes columns
# 4l..4l+3, one 8-byte weight word and one float4 of x (MMVH_* in mmv.cu).
MMVH_COLS = 128
HALF_TYPES = ("F16", "BF16")
# quantize_q8_1: one warp per q8_1 block, 8 warps per block (256 threads, as the
# elementwise kernels).
Q8_1_WARPS = 8


# dequant.cu's weight stage, uint4: a block's quant blocks (at most 256 x 34 bytes, Q8_0)
# in up to DQ_MAX_SEGS runs (a gather: one per output row), each with the partial words on
# either side.
DQ_W_WORDS = 576
DQ_MAX_SEGS = 16


def q8_1_row_bytes(ncols: int) -> int:
    """Bytes of one q8_1 row of ncols values (ncols % 32 == 0), padded to 16."""
    return -(-(ncols // Q8_1_QK * Q8_1_BYTES) // 16) * 16


# Order of FOR_EACH_TYPE in quants.cuh (the type_info kernel writes in this order).
CUDA_ORDER: tuple[str, ...] = tuple(TYPES)


@dataclass(frozen=True)
class KernelBudget:
    """What a planner assumes of a compiled kernel; ptxas -v output is checked against it."""

    max_threads: int  # the largest block the planner launches (== __launch_bounds__)
    max_registers: int  # per thread; max_threads * max_registers <= 64K registers per SM
    static_smem: int  # bytes of __shared__ the kernel may declare


# mmv.cu's mmvq_tail_smem: MMVQ_ROWS pair floats, 32 reduction floats, the flag; padded
# to 16 bytes (ptxas: the uint4 stage beside it is 16-aligned).
MMVQ_TAIL_BYTES = -(-4 * (MMVQ_ROWS + 32 + 1) // 16) * 16

# Keyed by kernel name prefix (longest match wins).
BUDGETS: dict[str, KernelBudget] = {
    "mul_mat_vec_": KernelBudget(256, 64, 0),
    # float tiles of 2-8 batch rows: a quant type's dequantized slice (up to 32 floats) and
    # NY accumulators live together (ptxas: up to 90 registers, 32-element types at tile 8,
    # sm_75..sm_90; F32/F16/BF16 stay within 63). At 96, the planner's 128-thread blocks still
    # fit 5 to an SM's registers (20 warps). The 16-bit tiles (mul_mat_vec_h_b<n>_) stay
    # within 59: the 64 of mul_mat_vec_h_ below.
    **{f"mul_mat_vec_b{n}_": KernelBudget(256, 96, 0) for n in MMV_TILES[1:]},
    "mul_mat_vec_q_": KernelBudget(128, 64, mmvq_smem(1)),
    # tiles of 4 and 8 batch rows hold more accumulators (ptxas: up to 72 registers on
    # sm_75..sm_90): 80 x 128 threads still lets 6 blocks (24 warps) share an SM's registers.
    **{f"mul_mat_vec_q_b{n}_": KernelBudget(128, 64 if n == 2 else 80, mmvq_smem(n))
       for n in MMV_TILES[1:]},
    # q/k/v with RoPE and the KV write in the epilogue, and the mat-vec with a norm before
    # the residual: the 1-row stage and mmv.cu's mmvq_tail_smem (the pair exchange, a
    # reduction slot per warp and the last-block flag).
    "mul_mat_vec_q_rope_kv_": KernelBudget(128, 64, mmvq_smem(1) + MMVQ_TAIL_BYTES),
    "mul_mat_vec_q_norm_add_": KernelBudget(128, 64, mmvq_smem(1) + MMVQ_TAIL_BYTES),
    "mul_mat_vec_h_": KernelBudget(256, 64, 0),
    "quantize_q8_1": KernelBudget(256, 32, 0),
    # dequant.cu: the output stage (floats, a pad per 32) and the weight stage (DQ_W_WORDS).
    # dq reading its bytes from shared memory takes up to 76 registers (ptxas, 32-element
    # types on sm_75/80); 80 x 256 threads lets 3 blocks share an SM's registers, and the
    # 42.5 KB of stages already cap an RTX 4090 SM at 2.
    # The segment table: a shift (8 bytes) and an end (4) per run, and a count.
    # Rounded up to 16 bytes: ptxas aligns the end of static shared memory to 16 where the
    # unit also declares dynamic shared memory (nvcc_check compiles all modules as one).
    "dequantize_": KernelBudget(256, 80, -(-(4 * (256 * 32 + 256) + 16 * DQ_W_WORDS
                                            + 12 * DQ_MAX_SEGS + 8) // 16) * 16),
    "rms_norm_f32": KernelBudget(1024, 32, 128),
    "rms_norm_q8_1": KernelBudget(1024, 32, 128),
    "rms_norm_add_rms_norm_q8_1": KernelBudget(1024, 32, 128),
    "layer_norm_f32": KernelBudget(1024, 32, 128),
    "softmax_f32": KernelBudget(1024, 32, 128),
    "argmax_f32": KernelBudget(1024, 32, 256),
    "rope_f32": KernelBudget(256, 64, 0),
    "silu_mul_f32": KernelBudget(256, 64, 0),
    "gelu_f32": KernelBudget(256, 64, 0),
    "gelu_tanh_mul_f32": KernelBudget(256, 64, 0),
    "silu_mul_q8_1": KernelBudget(256, 64, 0),
    "gelu_tanh_mul_q8_1": KernelBudget(256, 64, 0),
    "rope_kv_": KernelBudget(256, 64, 0),
    "attn_f32": KernelBudget(256, 96, 4 * (32 * 257 + 8 * 256 + 8 * 32)),
    "attn_kv_f16": KernelBudget(256, 96, 4 * (32 * 257 + 8 * 256 + 8 * 32)),
    "attn_kv_bf16": KernelBudget(256, 96, 4 * (32 * 257 + 8 * 256 + 8 * 32)),
    "attn_combine_f32": KernelBudget(256, 64, 0),
    # decode attention: dynamic shared memory only (plan.attn_vec_shared_bytes); 2 * 32
    # K/V values in flight per lane (ptxas: 96-126 registers): 128 x 128 fits 4 blocks.
    "attn_vec_": KernelBudget(128, 128, 0),
    "step_inputs_i32": KernelBudget(32, 32, 0),
    "step_ids_i32": KernelBudget(32, 32, 0),
    "kv_store_f32": KernelBudget(256, 64, 0),
    "kv_store_f16": KernelBudget(256, 64, 0),
    "kv_store_bf16": KernelBudget(256, 64, 0),
    "add_f32": KernelBudget(256, 64, 0),
    "scale_f32": KernelBudget(256, 64, 0),
    "softcap_f32": KernelBudget(256, 64, 0),
    "type_info": KernelBudget(32, 64, 0),
    "selftest_f16": KernelBudget(32, 32, 0),
}


def budget(kernel: str) -> KernelBudget:
    best = max((p for p in BUDGETS if kernel.startswith(p)), key=len, default=None)
    if best is None:
        raise KeyError(f"no launch budget for kernel {kernel!r}")
    return BUDGETS[best]


# Device limits the planners assume when the device does not say otherwise.
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_PER_BLOCK = 48 * 1024  # without cudaFuncAttributeMaxDynamicSharedMemorySize
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
WARP = 32
# Streaming multiprocessors when the device does not say (the emulator): between a T4 (40)
# and an RTX 4090 (128); sizes split-K only.
SM_COUNT = 80
ATTN_MAX_HEAD_DIM = 256  # ATTN_MAX_D in attention.cu
ATTN_MAX_ROWS = 8  # ATTN_MAX_ROWS in attention.cu: query rows (warps) per block
ATTN_TILE = 32  # ATTN_TILE in attention.cu: keys per shared-memory tile
