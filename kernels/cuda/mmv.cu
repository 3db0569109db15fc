// Matrix-vector product for decode, every weight type: y[b, r] = sum_c W[r, c] * x[b, c].
// W rows hold GGML blocks (row_bytes apart); x and y are float32, batch rows on grid.y.
#include "quants.cuh"
#include "bf16.cuh"
#include "kv_store.cuh"

// The end of every mat-vec below: a warp's sums for the NY batch rows of its tile, each
// reduced over the warp (every lane takes part, whatever its row), and lane 0 of a warp
// with a row stores the first ny of them; y points at the tile's first batch row. The
// epilogue adds what a decoder layer adds to a projection, where given (else null): a bias
// per output row (Qwen2's q/k/v) and a residual of y's shape (res, at the tile's first
// batch row: the o_proj and down projections' skip connections), as (sum + bias) + res,
// the rounding of the separate adds, so the fused step equals the unfused one bit for bit.
template <int NY>
static __device__ __forceinline__ void mmv_store_tile(
        float (&acc)[NY], float * __restrict__ y, const int row, const int nrows, const int ny,
        const float * __restrict__ bias, const float * __restrict__ res) {
#pragma unroll
    for (int b = 0; b < NY; ++b) {
        acc[b] = warp_reduce_sum(acc[b]);
    }
    if (row < nrows && threadIdx.x == 0) {
        const float add = bias ? ld_global(bias + row) : 0.0f;
#pragma unroll
        for (int b = 0; b < NY; ++b) {
            if (b < ny) {
                const long long i = (long long) b * nrows + row;
                const float v = bias ? acc[b] + add : acc[b];
                st_global(y + i, res ? v + ld_global(res + i) : v);
            }
        }
    }
}

// One warp per output row. Lane l takes the row's thread slices l, l+32, ... (EPT elements
// each, see quants.cuh), so neighbouring lanes read neighbouring bytes of W and x; a warp
// reduction finishes the row. No __syncthreads: a warp past the last row still joins its
// own reduction and simply stores nothing.
// A block serves batch rows NY * blockIdx.y .. + NY - 1 (those below `batch`; grid (row
// blocks, ceil(batch / NY))): each slice of W is loaded and dequantized once and dotted with
// every one of them, so the weights leave memory once per NY batch rows. Each batch row's
// sum takes the same products in the same order whatever NY: the tiles are the 1-row
// kernel's results (bitwise where the compiler contracts alike).
template <typename Q, int NY>
static __device__ __forceinline__ void mul_mat_vec(
        const uint8_t * __restrict__ w, const float * __restrict__ x, float * __restrict__ y,
        const int ncols, const int nrows, const long long row_bytes, const int batch,
        const float * __restrict__ bias, const float * __restrict__ res) {
    static_assert(Q::EPT == 1 || Q::EPT % 4 == 0, "x is read as float4 or single floats");
    constexpr int per_block = Q::QK / Q::EPT;
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int b0 = blockIdx.y * NY, ny = min(NY, batch - b0);
    x += (long long) b0 * ncols;
    y += (long long) b0 * nrows;
    res = res ? res + (long long) b0 * nrows : nullptr;

    float acc[NY];
#pragma unroll
    for (int j = 0; j < NY; ++j) {
        acc[j] = 0.0f;
    }
    if (row < nrows) {
        const uint8_t * wr = w + row * row_bytes;
        const int nslices = ncols / Q::EPT;
        for (int i = threadIdx.x; i < nslices; i += WARP_SIZE) {
            float v[Q::EPT];
            Q::dq(wr + (i / per_block) * Q::BYTES, i % per_block, v);
#pragma unroll
            for (int b = 0; b < NY; ++b) {
                if (b >= ny) {
                    break;
                }
                const float * xs = x + (long long) b * ncols + i * Q::EPT;
                if constexpr (Q::EPT % 4 == 0) {  // x rows are 16-byte aligned: ncols % 32 == 0
#pragma unroll
                    for (int j = 0; j < Q::EPT; j += 4) {
                        const float4 xv = load_float4(xs + j);
                        acc[b] += v[j] * xv.x + v[j + 1] * xv.y + v[j + 2] * xv.z +
                                  v[j + 3] * xv.w;
                    }
                } else {
                    acc[b] += v[0] * ld_global(xs);  // F32/F16/BF16: one element per slice
                }
            }
        }
    }
    mmv_store_tile(acc, y, row, nrows, ny, bias, res);
}

// block = (32, rows per block <= 8): see plan.plan_mul_mat_vec. mul_mat_vec_<type> (NY = 1)
// and mul_mat_vec_b<NY>_<type>: the NY of table.MMV_TILES.
// The kernels: mul_mat_vec_<type> (NY = 1) and mul_mat_vec_b<NY>_<type>, NY of
// table.MMV_TILES. MMV(tag, NY, name) defines `name` as mul_mat_vec<tag, NY>.
#define MMV(Q, NY, name)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) name(                                     \
            const uint8_t * w, const float * x, float * y, const int ncols, const int nrows,     \
            const long long row_bytes, const int batch, const float * bias, const float * res) { \
        mul_mat_vec<Q, NY>(w, x, y, ncols, nrows, row_bytes, batch, bias, res);                  \
    }
MMV(t_f32, 1, mul_mat_vec_f32)
MMV(t_f32, 2, mul_mat_vec_b2_f32)
MMV(t_f32, 4, mul_mat_vec_b4_f32)
MMV(t_f32, 8, mul_mat_vec_b8_f32)
MMV(t_f16, 1, mul_mat_vec_f16)
MMV(t_f16, 2, mul_mat_vec_b2_f16)
MMV(t_f16, 4, mul_mat_vec_b4_f16)
MMV(t_f16, 8, mul_mat_vec_b8_f16)
MMV(t_bf16, 1, mul_mat_vec_bf16)
MMV(t_bf16, 2, mul_mat_vec_b2_bf16)
MMV(t_bf16, 4, mul_mat_vec_b4_bf16)
MMV(t_bf16, 8, mul_mat_vec_b8_bf16)
MMV(t_q4_0, 1, mul_mat_vec_q4_0)
MMV(t_q4_0, 2, mul_mat_vec_b2_q4_0)
MMV(t_q4_0, 4, mul_mat_vec_b4_q4_0)
MMV(t_q4_0, 8, mul_mat_vec_b8_q4_0)
MMV(t_q4_1, 1, mul_mat_vec_q4_1)
MMV(t_q4_1, 2, mul_mat_vec_b2_q4_1)
MMV(t_q4_1, 4, mul_mat_vec_b4_q4_1)
MMV(t_q4_1, 8, mul_mat_vec_b8_q4_1)
MMV(t_q5_0, 1, mul_mat_vec_q5_0)
MMV(t_q5_0, 2, mul_mat_vec_b2_q5_0)
MMV(t_q5_0, 4, mul_mat_vec_b4_q5_0)
MMV(t_q5_0, 8, mul_mat_vec_b8_q5_0)
MMV(t_q5_1, 1, mul_mat_vec_q5_1)
MMV(t_q5_1, 2, mul_mat_vec_b2_q5_1)
MMV(t_q5_1, 4, mul_mat_vec_b4_q5_1)
MMV(t_q5_1, 8, mul_mat_vec_b8_q5_1)
MMV(t_q8_0, 1, mul_mat_vec_q8_0)
MMV(t_q8_0, 2, mul_mat_vec_b2_q8_0)
MMV(t_q8_0, 4, mul_mat_vec_b4_q8_0)
MMV(t_q8_0, 8, mul_mat_vec_b8_q8_0)
MMV(t_q2_k, 1, mul_mat_vec_q2_k)
MMV(t_q2_k, 2, mul_mat_vec_b2_q2_k)
MMV(t_q2_k, 4, mul_mat_vec_b4_q2_k)
MMV(t_q2_k, 8, mul_mat_vec_b8_q2_k)
MMV(t_q3_k, 1, mul_mat_vec_q3_k)
MMV(t_q3_k, 2, mul_mat_vec_b2_q3_k)
MMV(t_q3_k, 4, mul_mat_vec_b4_q3_k)
MMV(t_q3_k, 8, mul_mat_vec_b8_q3_k)
MMV(t_q4_k, 1, mul_mat_vec_q4_k)
MMV(t_q4_k, 2, mul_mat_vec_b2_q4_k)
MMV(t_q4_k, 4, mul_mat_vec_b4_q4_k)
MMV(t_q4_k, 8, mul_mat_vec_b8_q4_k)
MMV(t_q5_k, 1, mul_mat_vec_q5_k)
MMV(t_q5_k, 2, mul_mat_vec_b2_q5_k)
MMV(t_q5_k, 4, mul_mat_vec_b4_q5_k)
MMV(t_q5_k, 8, mul_mat_vec_b8_q5_k)
MMV(t_q6_k, 1, mul_mat_vec_q6_k)
MMV(t_q6_k, 2, mul_mat_vec_b2_q6_k)
MMV(t_q6_k, 4, mul_mat_vec_b4_q6_k)
MMV(t_q6_k, 8, mul_mat_vec_b8_q6_k)

// ---- the integer mat-vec: q8_1 activations, __dp4a ---------------------------------------
// Decode reads each weight once per token, so the mat-vec runs at memory bandwidth only if
// (a) every warp-level load moves whole 32-byte sectors it uses and (b) the arithmetic per
// weight byte is small. The float path above fails (a) for x (each lane reads its own
// float4s, 64-128 bytes apart) and for weights (2-byte loads at block-size strides), and
// spends ~2 float FMAs per weight. Here x is quantized once per call to q8_1 (3.6x fewer
// x bytes than float32) and multiplied with integer dot products (__dp4a, sm_61+: 4
// int8 products per instruction); the float scales are applied once per 32 elements.
// Both operands are staged in shared memory with aligned 16-byte loads by consecutive
// lanes: whole sectors whatever the block size (GGML blocks are 2-byte aligned).

// quantize_q8_1: one warp per q8_1 block, blockDim = (32, <= 8); grid (row blocks, batch).
// x row b is ncols floats; its q8_1 row starts at xq + b * xq_stride (16-byte multiple).
extern "C" __global__ void __launch_bounds__(256) quantize_q8_1(
        const float * __restrict__ x, uint8_t * __restrict__ xq, const int ncols,
        const long long xq_stride) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= ncols / 32) {
        return;  // the whole warp: no lane of it reaches the shuffles below
    }
    const float v = ld_global(x + (long long) blockIdx.y * ncols + blk * 32 + threadIdx.x);
    store_q8_1_block(v, xq + blockIdx.y * xq_stride + blk * Q8_1_BYTES);
}

// A warp step covers MMVQ_COLS columns: lane l takes the l-th 32-element group (a whole
// 32-element block, or one group of a 256-element K-quant block) and its q8_1 block.
#define MMVQ_COLS 1024  // table.MMVQ_COLS
#define MMVQ_ROWS 4  // warps (= output rows) per block: table.MMVQ_ROWS
#define MMVQ_X_WORDS (MMVQ_COLS / 32 * Q8_1_BYTES / 16)  // 72 uint4: a step's q8_1 blocks
#define MMVQ_W_WORDS 72  // table.MMVQ_W_WORDS: uint4 per warp, a step's weights (<= 1088 B) + 2

// The shared stage of a mul_mat_vec_q kernel with NY batch rows per weight read: the step's
// x blocks of each of its NY batch rows, then each warp's weight bytes (NY = 1: 5,760
// bytes; 8: 13,824). One plain function per NY, so that the emulator poisons it.
#define MMVQ_SMEM(NY)                                                                           \
    static __device__ __forceinline__ uint4 * mmvq_smem_##NY() {                                \
        __shared__ uint4 s[NY * MMVQ_X_WORDS + MMVQ_ROWS * MMVQ_W_WORDS];                      \
        return s;                                                                               \
    }
MMVQ_SMEM(1)
MMVQ_SMEM(2)
MMVQ_SMEM(4)
MMVQ_SMEM(8)

// y[b, row] = sum over 32-element groups of Q::vdot, one warp per row, blockDim =
// (32, rows <= MMVQ_ROWS), grid (row blocks, ceil(batch / NY)). A block serves batch rows
// NY * blockIdx.y .. + NY - 1 (those below `batch`): each weight byte is loaded from global
// memory once and dotted with all of them (llama.cpp's mmvq ncols_y), so a batched decode
// step reads the weights once per NY sequences, not once per sequence.
// The weight buffer and every q8_1 row start 16-byte aligned (ops.mul_mat_vec checks); a
// weight row starts anywhere 2-aligned, so a warp loads the aligned 16-byte words that cover
// its step's bytes: up to 15 bytes before and after them belong to the neighbouring rows
// (never outside the buffer: its start is aligned and its end is inside an aligned word).
// Every warp runs every step (the barriers are uniform); warps past the last row stage and
// compute nothing, and batch rows past `batch` are neither staged nor computed (`ny` is
// the same for the whole block).
// mmvq_sums: this warp's sums (not yet reduced across the warp) of weight row `row` (none
// when row >= nrows) with batch rows b0 .. b0 + ny - 1; the callers below pick the row and
// store the sums.
template <typename Q, int NY>
static __device__ __forceinline__ void mmvq_sums(
        const uint8_t * __restrict__ w, const uint8_t * __restrict__ xq, const int ncols,
        const int nrows, const long long row_bytes, const long long xq_stride, const int row,
        const int b0, const int ny, uint4 * smem, float (&acc)[NY]) {
    constexpr int GROUPS = Q::QK / 32;  // lanes per weight block
    constexpr int STEP_BYTES = MMVQ_COLS / Q::QK * Q::BYTES;
    static_assert(Q::QK % 32 == 0 && MMVQ_COLS % Q::QK == 0, "a step holds whole blocks");
    static_assert((STEP_BYTES + 30) / 16 <= MMVQ_W_WORDS, "a step's weights fit the stage");
    const int lane = threadIdx.x;
    const int tid = threadIdx.y * WARP_SIZE + lane, nthreads = blockDim.y * WARP_SIZE;
    uint4 * sx = smem;
    uint4 * sw = smem + NY * MMVQ_X_WORDS + threadIdx.y * MMVQ_W_WORDS;
    const uint8_t * xr = xq + b0 * xq_stride;
    const uint8_t * wr = w + (long long) row * row_bytes;
#pragma unroll
    for (int j = 0; j < NY; ++j) {
        acc[j] = 0.0f;
    }
    for (int c0 = 0; c0 < ncols; c0 += MMVQ_COLS) {
        const int groups = min(MMVQ_COLS, ncols - c0) / 32;
        // x: this step's q8_1 blocks of each batch row, shared by the block's warps (rounded
        // up to whole words: q8_1 rows are padded to 16 bytes); row j at sx + j * X_WORDS.
        const int xwords = (groups * Q8_1_BYTES + 15) / 16;
        for (int i = tid; i < ny * xwords; i += nthreads) {
            const int j = i / xwords, k = i - j * xwords;
            sx[j * MMVQ_X_WORDS + k] =
                ld_global((const uint4 *) (xr + j * xq_stride + (c0 / 32) * Q8_1_BYTES) + k);
        }
        const uint8_t * wc = wr + (c0 / Q::QK) * Q::BYTES;
        const uintptr_t a0 = (uintptr_t) wc & ~(uintptr_t) 15;
        if (row < nrows) {
            const int words = (int) (((uintptr_t) wc + groups / GROUPS * Q::BYTES + 15 - a0) / 16);
            for (int i = lane; i < words; i += WARP_SIZE) {
                sw[i] = ld_global((const uint4 *) a0 + i);
            }
        }
        __syncthreads();
        if (row < nrows && lane < groups) {
            const uint8_t * b = (const uint8_t *) sw + ((uintptr_t) wc - a0) +
                                (lane / GROUPS) * Q::BYTES;
            const uint8_t * xb = (const uint8_t *) sx + lane * Q8_1_BYTES;
#pragma unroll
            for (int j = 0; j < NY; ++j) {
                if (j < ny) {
                    acc[j] += Q::vdot(b, lane % GROUPS, xb + j * (MMVQ_X_WORDS * 16));
                }
            }
        }
        __syncthreads();  // the next step overwrites the stage
    }
}

template <typename Q, int NY>
static __device__ __forceinline__ void mul_mat_vec_q(
        const uint8_t * __restrict__ w, const uint8_t * __restrict__ xq, float * __restrict__ y,
        const int ncols, const int nrows, const long long row_bytes, const long long xq_stride,
        const int batch, const float * __restrict__ bias, const float * __restrict__ res,
        uint4 * smem) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int b0 = blockIdx.y * NY, ny = min(NY, batch - b0);
    float acc[NY];
    mmvq_sums<Q, NY>(w, xq, ncols, nrows, row_bytes, xq_stride, row, b0, ny, smem, acc);
    mmv_store_tile(acc, y + (long long) b0 * nrows, row, nrows, ny, bias,
                   res ? res + (long long) b0 * nrows : nullptr);
}

// A value another block of this launch stored (after its __threadfence): read past the SM's
// L1, which is not coherent across SMs.
static __device__ __forceinline__ float ld_other_block(const float * p) {
    return *(const volatile float *) p;
}

// The shared stage of the grid-completion epilogues below: the block's per-warp pair
// values, its reduction slots and the "this block finishes" flag. A plain function so
// that the emulator poisons it.
struct mmvq_tail_smem {
    float pair[MMVQ_ROWS];
    float sum[32];
    int last;
};
static __device__ __forceinline__ mmvq_tail_smem * mmvq_tail() {
    __shared__ mmvq_tail_smem s;
    return &s;
}

// Whether this block is the last of `blocks` blocks to finish a piece of the output: every
// thread's global stores so far are made visible (__threadfence), one thread counts the
// block in *done, and the block that brings it to `blocks` returns true after resetting it
// to 0 (ready for the next launch or graph replay; the counters start zeroed). Every
// thread of the block calls it (barriers). The threadFenceReduction pattern.
static __device__ __forceinline__ bool last_block_of(unsigned int * done, const unsigned blocks,
                                                     mmvq_tail_smem * t) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        const bool last = atomicAdd(done, 1u) == blocks - 1;
        if (last) {
            *done = 0;
        }
        t->last = last;
    }
    __syncthreads();
    return t->last;
}

// 1 / sqrt(mean(x^2) + eps) of the n floats at p that other blocks of this launch stored
// (rms_norm_f32's scale, the squares summed in another order), by the whole block.
static __device__ __forceinline__ float tail_rms_scale(const float * p, const int n,
                                                       const float eps, mmvq_tail_smem * t) {
    const int tid = threadIdx.y * WARP_SIZE + threadIdx.x, nt = blockDim.y * WARP_SIZE;
    float ss = 0.0f;
#pragma unroll 4  // several loads in flight: the tail is latency-bound
    for (int e = tid; e < n; e += nt) {
        const float x = ld_other_block(p + e);
        ss += x * x;
    }
    ss = warp_reduce_sum(ss);
    if (threadIdx.x == 0) {
        t->sum[threadIdx.y] = ss;
    }
    __syncthreads();
    float sum = 0.0f;
    for (int y = 0; y < (int) blockDim.y; ++y) {
        sum += t->sum[y];
    }
    return rsqrtf(sum / n + eps);
}

// The q/k/v mat-vec of a decode step with RoPE and the KV-cache write in its epilogue (one
// launch for what mul_mat_vec_q_* and rope_kv_* do in two). W is the stacked [q; k; v]
// weight, nrows = (heads + 2 kv_heads) * head_dim; grid (row blocks, batch), one new token
// per batch row, all at position *pos (KV row *row: see rope_kv_row, kv_store.cuh). The
// block's warps take rows in RoPE pairs (warps 2p and 2p + 1: pair elements i0 and i1 of a
// head, rope.cu's pairing; v heads pair the same way, unrotated), so after the sums (+ bias)
// the pair meets in shared memory and warp 2p's lane 0 rotates and stores it
// (store_qkv_pair, kv_store.cuh: q into q_out, k and v into the caches as T, float, half
// or bfloat16). blockDim.y is even (MMVQ_ROWS, or nrows when smaller: nrows is even). Bit for bit
// mul_mat_vec_q_* then rope_kv_*: the same sums, the same rotation.
// Per-head q/k RMSNorm (Qwen3, Gemma 3: q_norm and k_norm, head_dim weights each, else
// null): a block's rows lie in one head (head_dim % blockDim.y == 0), so a q or k head is
// head_dim / blockDim.y blocks. Each stores its sums (+ bias) into stage (batch, nrows)
// and counts itself in done[b * (heads + kv_heads) + head]; the head's last block
// (last_block_of) norms the head (rms_norm_f32's scale * x * w, the sum of squares in
// another order: equal to it within float32 rounding), rotates it and stores it. v heads
// store as without norms.
template <typename Q, typename T>
static __device__ __forceinline__ void mul_mat_vec_q_rope_kv(
        const uint8_t * __restrict__ w, const uint8_t * __restrict__ xq, float * __restrict__ q_out,
        T * __restrict__ kc, T * __restrict__ vc, const int ncols, const long long row_bytes,
        const long long xq_stride, const float * __restrict__ bias, const int heads,
        const int kv_heads, const int head_dim, const long long stride_b,
        const long long stride_h, const long long stride_s, const int * __restrict__ pos,
        const int * __restrict__ kv_row, const float theta, const int neox,
        const float * __restrict__ freq_factors, const float * __restrict__ q_norm,
        const float * __restrict__ k_norm, const float eps, float * stage, unsigned int * done,
        uint4 * smem, mmvq_tail_smem * tail) {
    const int nrows = (heads + 2 * kv_heads) * head_dim, half = head_dim / 2;
    const int l = blockIdx.x * blockDim.y + threadIdx.y;  // a pair element, in pair order
    const int p = l / 2, h = p / half, i = p % half;
    const int i0 = neox ? i : 2 * i, i1 = i0 + (neox ? half : 1);
    const int row = l < nrows ? h * head_dim + (l % 2 ? i1 : i0) : nrows;
    const int b = blockIdx.y;
    float acc[1];
    mmvq_sums<Q, 1>(w, xq, ncols, nrows, row_bytes, xq_stride, row, b, 1, smem, acc);
    acc[0] = warp_reduce_sum(acc[0]);
    const float v = bias && row < nrows ? acc[0] + ld_global(bias + row) : acc[0];
    const int hb = (int) (blockIdx.x * blockDim.y / 2) / half;  // the block's head
    if (q_norm != nullptr && hb < heads + kv_heads) {
        float * sh = stage + ((long long) b * nrows + (long long) hb * head_dim);
        if (threadIdx.x == 0 && row < nrows) {
            st_global(sh + (row - hb * head_dim), v);
        }
        if (!last_block_of(done + b * (heads + kv_heads) + hb, head_dim / blockDim.y, tail)) {
            return;  // the whole block
        }
        const float scale = tail_rms_scale(sh, head_dim, eps, tail);
        const int tid = threadIdx.y * WARP_SIZE + threadIdx.x;
        const float * nw = hb < heads ? q_norm : k_norm;
        if (tid < half) {  // a pair a thread: half <= blockDim.y * 32 (ops.qkv_rope_kv checks)
            const int j0 = neox ? tid : 2 * tid, j1 = j0 + (neox ? half : 1);
            const float x0 = scale * ld_other_block(sh + j0) * ld_global(nw + j0);
            const float x1 = scale * ld_other_block(sh + j1) * ld_global(nw + j1);
            store_qkv_pair<T>(x0, x1, b, hb, tid, j0, j1, q_out, kc, vc, heads, kv_heads,
                              head_dim, stride_b, stride_h, stride_s, pos, kv_row, theta,
                              freq_factors);
        }
        return;
    }
    if (threadIdx.x == 0 && row < nrows) {
        tail->pair[threadIdx.y] = v;
    }
    __syncthreads();
    if (threadIdx.x != 0 || l % 2 || row >= nrows) {
        return;
    }
    store_qkv_pair<T>(tail->pair[threadIdx.y], tail->pair[threadIdx.y + 1], b, h, i, i0, i1,
                      q_out, kc, vc, heads, kv_heads, head_dim, stride_b, stride_h, stride_s, pos,
                      kv_row, theta, freq_factors);
}

// A projection whose output is normed before the residual joins it (Gemma 2/3's
// post-attention and post-feedforward norms): y[b] = res[b] + rms_norm(W x[b]) * nw, one
// launch for mul_mat_vec_q_*, rms_norm_f32 and add_f32. Each block stores its rows' sums
// into y, then the last block of batch row b (last_block_of, done[b]) norms the row in
// place: sum of squares, then res + scale * y * nw (the unfused rounding but for the sum's
// order: equal within float32 rounding). grid (row blocks, batch), blockDim as
// mul_mat_vec_q_* (NY = 1).
template <typename Q>
static __device__ __forceinline__ void mul_mat_vec_q_norm_add(
        const uint8_t * __restrict__ w, const uint8_t * __restrict__ xq, float * y,
        const int ncols, const int nrows, const long long row_bytes, const long long xq_stride,
        const float * __restrict__ nw, const float eps, const float * __restrict__ res,
        unsigned int * done, uint4 * smem, mmvq_tail_smem * tail) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int b = blockIdx.y;
    float acc[1];
    mmvq_sums<Q, 1>(w, xq, ncols, nrows, row_bytes, xq_stride, row, b, 1, smem, acc);
    mmv_store_tile(acc, y + (long long) b * nrows, row, nrows, 1, nullptr, nullptr);
    if (!last_block_of(done + b, gridDim.x, tail)) {
        return;
    }
    float * yr = y + (long long) b * nrows;
    const float * rr = res + (long long) b * nrows;
    const float scale = tail_rms_scale(yr, nrows, eps, tail);
    const int tid = threadIdx.y * WARP_SIZE + threadIdx.x, nt = blockDim.y * WARP_SIZE;
#pragma unroll 4  // several loads in flight: the tail is latency-bound
    for (int c = tid; c < nrows; c += nt) {
        st_global(yr + c, ld_global(rr + c) + scale * ld_other_block(yr + c) * ld_global(nw + c));
    }
}

// The kernels: mul_mat_vec_q_<type> (NY = 1) and mul_mat_vec_q_b<NY>_<type>, NY of
// table.MMV_TILES. MMVQ(tag, NY, name) defines `name` as mul_mat_vec_q<tag, NY>.
#define MMVQ(Q, NY, name)                                                                       \
    extern "C" __global__ void __launch_bounds__(MMVQ_ROWS * WARP_SIZE) name(                   \
            const uint8_t * w, const uint8_t * xq, float * y, const int ncols, const int nrows,  \
            const long long row_bytes, const long long xq_stride, const int batch,               \
            const float * bias, const float * res) {                                             \
        mul_mat_vec_q<Q, NY>(w, xq, y, ncols, nrows, row_bytes, xq_stride, batch, bias, res,    \
                             mmvq_smem_##NY());                                                 \
    }
MMVQ(t_q4_0, 1, mul_mat_vec_q_q4_0)
MMVQ(t_q4_0, 2, mul_mat_vec_q_b2_q4_0)
MMVQ(t_q4_0, 4, mul_mat_vec_q_b4_q4_0)
MMVQ(t_q4_0, 8, mul_mat_vec_q_b8_q4_0)
MMVQ(t_q4_1, 1, mul_mat_vec_q_q4_1)
MMVQ(t_q4_1, 2, mul_mat_vec_q_b2_q4_1)
MMVQ(t_q4_1, 4, mul_mat_vec_q_b4_q4_1)
MMVQ(t_q4_1, 8, mul_mat_vec_q_b8_q4_1)
MMVQ(t_q5_0, 1, mul_mat_vec_q_q5_0)
MMVQ(t_q5_0, 2, mul_mat_vec_q_b2_q5_0)
MMVQ(t_q5_0, 4, mul_mat_vec_q_b4_q5_0)
MMVQ(t_q5_0, 8, mul_mat_vec_q_b8_q5_0)
MMVQ(t_q5_1, 1, mul_mat_vec_q_q5_1)
MMVQ(t_q5_1, 2, mul_mat_vec_q_b2_q5_1)
MMVQ(t_q5_1, 4, mul_mat_vec_q_b4_q5_1)
MMVQ(t_q5_1, 8, mul_mat_vec_q_b8_q5_1)
MMVQ(t_q8_0, 1, mul_mat_vec_q_q8_0)
MMVQ(t_q8_0, 2, mul_mat_vec_q_b2_q8_0)
MMVQ(t_q8_0, 4, mul_mat_vec_q_b4_q8_0)
MMVQ(t_q8_0, 8, mul_mat_vec_q_b8_q8_0)
MMVQ(t_q2_k, 1, mul_mat_vec_q_q2_k)
MMVQ(t_q2_k, 2, mul_mat_vec_q_b2_q2_k)
MMVQ(t_q2_k, 4, mul_mat_vec_q_b4_q2_k)
MMVQ(t_q2_k, 8, mul_mat_vec_q_b8_q2_k)
MMVQ(t_q3_k, 1, mul_mat_vec_q_q3_k)
MMVQ(t_q3_k, 2, mul_mat_vec_q_b2_q3_k)
MMVQ(t_q3_k, 4, mul_mat_vec_q_b4_q3_k)
MMVQ(t_q3_k, 8, mul_mat_vec_q_b8_q3_k)
MMVQ(t_q4_k, 1, mul_mat_vec_q_q4_k)
MMVQ(t_q4_k, 2, mul_mat_vec_q_b2_q4_k)
MMVQ(t_q4_k, 4, mul_mat_vec_q_b4_q4_k)
MMVQ(t_q4_k, 8, mul_mat_vec_q_b8_q4_k)
MMVQ(t_q5_k, 1, mul_mat_vec_q_q5_k)
MMVQ(t_q5_k, 2, mul_mat_vec_q_b2_q5_k)
MMVQ(t_q5_k, 4, mul_mat_vec_q_b4_q5_k)
MMVQ(t_q5_k, 8, mul_mat_vec_q_b8_q5_k)
MMVQ(t_q6_k, 1, mul_mat_vec_q_q6_k)
MMVQ(t_q6_k, 2, mul_mat_vec_q_b2_q6_k)
MMVQ(t_q6_k, 4, mul_mat_vec_q_b4_q6_k)
MMVQ(t_q6_k, 8, mul_mat_vec_q_b8_q6_k)

// The kernels: mul_mat_vec_q_rope_kv_<type>_<cache> for a float32, float16 or bfloat16 KV
// cache. MMVQ_ROPE_KV(tag, T, name) defines `name` as mul_mat_vec_q_rope_kv<tag, T>.
#define MMVQ_ROPE_KV(Q, T, name)                                                                \
    extern "C" __global__ void __launch_bounds__(MMVQ_ROWS * WARP_SIZE) name(                   \
            const uint8_t * w, const uint8_t * xq, float * q_out, T * kc, T * vc,                \
            const int ncols, const long long row_bytes, const long long xq_stride,               \
            const float * bias, const int heads, const int kv_heads, const int head_dim,         \
            const long long stride_b, const long long stride_h, const long long stride_s,        \
            const int * pos, const int * kv_row, const float theta, const int neox,              \
            const float * freq_factors, const float * q_norm, const float * k_norm,              \
            const float eps, float * stage, unsigned int * done) {                               \
        mul_mat_vec_q_rope_kv<Q, T>(w, xq, q_out, kc, vc, ncols, row_bytes, xq_stride, bias,     \
                                    heads, kv_heads, head_dim, stride_b, stride_h, stride_s,     \
                                    pos, kv_row, theta, neox, freq_factors, q_norm, k_norm, eps, \
                                    stage, done, mmvq_smem_1(), mmvq_tail());                    \
    }
MMVQ_ROPE_KV(t_q4_0, float, mul_mat_vec_q_rope_kv_q4_0_f32)
MMVQ_ROPE_KV(t_q4_0, __half, mul_mat_vec_q_rope_kv_q4_0_f16)
MMVQ_ROPE_KV(t_q4_0, bf16_t, mul_mat_vec_q_rope_kv_q4_0_bf16)
MMVQ_ROPE_KV(t_q4_1, float, mul_mat_vec_q_rope_kv_q4_1_f32)
MMVQ_ROPE_KV(t_q4_1, __half, mul_mat_vec_q_rope_kv_q4_1_f16)
MMVQ_ROPE_KV(t_q4_1, bf16_t, mul_mat_vec_q_rope_kv_q4_1_bf16)
MMVQ_ROPE_KV(t_q5_0, float, mul_mat_vec_q_rope_kv_q5_0_f32)
MMVQ_ROPE_KV(t_q5_0, __half, mul_mat_vec_q_rope_kv_q5_0_f16)
MMVQ_ROPE_KV(t_q5_0, bf16_t, mul_mat_vec_q_rope_kv_q5_0_bf16)
MMVQ_ROPE_KV(t_q5_1, float, mul_mat_vec_q_rope_kv_q5_1_f32)
MMVQ_ROPE_KV(t_q5_1, __half, mul_mat_vec_q_rope_kv_q5_1_f16)
MMVQ_ROPE_KV(t_q5_1, bf16_t, mul_mat_vec_q_rope_kv_q5_1_bf16)
MMVQ_ROPE_KV(t_q8_0, float, mul_mat_vec_q_rope_kv_q8_0_f32)
MMVQ_ROPE_KV(t_q8_0, __half, mul_mat_vec_q_rope_kv_q8_0_f16)
MMVQ_ROPE_KV(t_q8_0, bf16_t, mul_mat_vec_q_rope_kv_q8_0_bf16)
MMVQ_ROPE_KV(t_q2_k, float, mul_mat_vec_q_rope_kv_q2_k_f32)
MMVQ_ROPE_KV(t_q2_k, __half, mul_mat_vec_q_rope_kv_q2_k_f16)
MMVQ_ROPE_KV(t_q2_k, bf16_t, mul_mat_vec_q_rope_kv_q2_k_bf16)
MMVQ_ROPE_KV(t_q3_k, float, mul_mat_vec_q_rope_kv_q3_k_f32)
MMVQ_ROPE_KV(t_q3_k, __half, mul_mat_vec_q_rope_kv_q3_k_f16)
MMVQ_ROPE_KV(t_q3_k, bf16_t, mul_mat_vec_q_rope_kv_q3_k_bf16)
MMVQ_ROPE_KV(t_q4_k, float, mul_mat_vec_q_rope_kv_q4_k_f32)
MMVQ_ROPE_KV(t_q4_k, __half, mul_mat_vec_q_rope_kv_q4_k_f16)
MMVQ_ROPE_KV(t_q4_k, bf16_t, mul_mat_vec_q_rope_kv_q4_k_bf16)
MMVQ_ROPE_KV(t_q5_k, float, mul_mat_vec_q_rope_kv_q5_k_f32)
MMVQ_ROPE_KV(t_q5_k, __half, mul_mat_vec_q_rope_kv_q5_k_f16)
MMVQ_ROPE_KV(t_q5_k, bf16_t, mul_mat_vec_q_rope_kv_q5_k_bf16)
MMVQ_ROPE_KV(t_q6_k, float, mul_mat_vec_q_rope_kv_q6_k_f32)
MMVQ_ROPE_KV(t_q6_k, __half, mul_mat_vec_q_rope_kv_q6_k_f16)
MMVQ_ROPE_KV(t_q6_k, bf16_t, mul_mat_vec_q_rope_kv_q6_k_bf16)

// The kernels: mul_mat_vec_q_norm_add_<type>. MMVQ_NORM_ADD(tag, name) defines `name` as
// mul_mat_vec_q_norm_add<tag>.
#define MMVQ_NORM_ADD(Q, name)                                                                  \
    extern "C" __global__ void __launch_bounds__(MMVQ_ROWS * WARP_SIZE) name(                   \
            const uint8_t * w, const uint8_t * xq, float * y, const int ncols, const int nrows,  \
            const long long row_bytes, const long long xq_stride, const float * nw,              \
            const float eps, const float * res, unsigned int * done) {                           \
        mul_mat_vec_q_norm_add<Q>(w, xq, y, ncols, nrows, row_bytes, xq_stride, nw, eps, res,    \
                                  done, mmvq_smem_1(), mmvq_tail());                             \
    }
MMVQ_NORM_ADD(t_q4_0, mul_mat_vec_q_norm_add_q4_0)
MMVQ_NORM_ADD(t_q4_1, mul_mat_vec_q_norm_add_q4_1)
MMVQ_NORM_ADD(t_q5_0, mul_mat_vec_q_norm_add_q5_0)
MMVQ_NORM_ADD(t_q5_1, mul_mat_vec_q_norm_add_q5_1)
MMVQ_NORM_ADD(t_q8_0, mul_mat_vec_q_norm_add_q8_0)
MMVQ_NORM_ADD(t_q2_k, mul_mat_vec_q_norm_add_q2_k)
MMVQ_NORM_ADD(t_q3_k, mul_mat_vec_q_norm_add_q3_k)
MMVQ_NORM_ADD(t_q4_k, mul_mat_vec_q_norm_add_q4_k)
MMVQ_NORM_ADD(t_q5_k, mul_mat_vec_q_norm_add_q5_k)
MMVQ_NORM_ADD(t_q6_k, mul_mat_vec_q_norm_add_q6_k)

// ---- 16-bit float weights (F16, BF16) ----------------------------------------------------
// A checkpoint's F16/BF16 weights stay 16-bit on the device: half the bytes of float32.
// One warp per output row, blockDim = (32, rows <= 8), grid (row blocks, batch). A warp
// step covers MMVH_COLS columns: lane l loads columns 4l..4l+3 as one 8-byte word of W and
// one float4 of x, so a warp's weight load is 256 contiguous bytes and its x load 512:
// whole 32-byte sectors (the float kernel above loads 2 bytes per lane per instruction).
// Products accumulate in float32. Needs ncols % 4 == 0 (rows 8-byte aligned) and W, x
// 16-byte aligned: ops.mul_mat_vec takes the float kernel otherwise.
// Batch tiles as in the float kernel: a block serves NY batch rows, each 8-byte weight word
// is loaded once and dotted with the float4 of x of each of them.
#define MMVH_COLS 128  // table.MMVH_COLS
template <typename Q, int NY>
static __device__ __forceinline__ void mul_mat_vec_h(
        const uint16_t * __restrict__ w, const float * __restrict__ x, float * __restrict__ y,
        const int ncols, const int nrows, const int batch, const float * __restrict__ bias,
        const float * __restrict__ res) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int b0 = blockIdx.y * NY, ny = min(NY, batch - b0);
    res = res ? res + (long long) b0 * nrows : nullptr;
    const float4 * x4 = (const float4 *) (x + (long long) b0 * ncols);
    y += (long long) b0 * nrows;

    float acc[NY];
#pragma unroll
    for (int b = 0; b < NY; ++b) {
        acc[b] = 0.0f;
    }
    if (row < nrows) {
        const uint2 * w4 = (const uint2 *) (w + (long long) row * ncols);
        for (int i = threadIdx.x; i < ncols / 4; i += MMVH_COLS / 4) {
            const uint2 wv = ld_global(w4 + i);
            const float w0 = Q::of(wv.x & 0xFFFFu), w1 = Q::of(wv.x >> 16);
            const float w2 = Q::of(wv.y & 0xFFFFu), w3 = Q::of(wv.y >> 16);
#pragma unroll
            for (int b = 0; b < NY; ++b) {
                if (b >= ny) {
                    break;
                }
                const float4 xv = ld_global(x4 + (long long) b * (ncols / 4) + i);
                acc[b] += w0 * xv.x + w1 * xv.y + w2 * xv.z + w3 * xv.w;
            }
        }
    }
    mmv_store_tile(acc, y, row, nrows, ny, bias, res);
}

// block = (32, rows per block <= 8): see plan.plan_mul_mat_vec. mul_mat_vec_h_<type> (NY = 1)
// and mul_mat_vec_h_b<NY>_<type>.
// MMVH(tag, NY, name) defines `name` as mul_mat_vec_h<tag, NY>.
#define MMVH(Q, NY, name)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) name(                                     \
            const uint16_t * w, const float * x, float * y, const int ncols, const int nrows,    \
            const int batch, const float * bias, const float * res) {                            \
        mul_mat_vec_h<Q, NY>(w, x, y, ncols, nrows, batch, bias, res);                           \
    }
MMVH(t_f16, 1, mul_mat_vec_h_f16)
MMVH(t_f16, 2, mul_mat_vec_h_b2_f16)
MMVH(t_f16, 4, mul_mat_vec_h_b4_f16)
MMVH(t_f16, 8, mul_mat_vec_h_b8_f16)
MMVH(t_bf16, 1, mul_mat_vec_h_bf16)
MMVH(t_bf16, 2, mul_mat_vec_h_b2_bf16)
MMVH(t_bf16, 4, mul_mat_vec_h_b4_bf16)
MMVH(t_bf16, 8, mul_mat_vec_h_b8_bf16)
