// Dequantize whole rows of a GGML matrix to f32, f16 or bf16: the prefill path (dequantize
// into a reused scratch, then a cuBLAS GEMM; an F32 "matrix" is how prefill rounds its
// activations to the GEMM's 16-bit type) and the embedding gather (rows picked by token
// ids, from any table type).
#include "quants.cuh"
#include "bf16.cuh"

// Each thread dequantizes one slice (EPT elements, see quants.cuh) into registers; a
// block's slices are consecutive, and so is its output (rows are contiguous), so the block
// stages its values in shared memory and then stores them as 16-byte words by consecutive
// threads: whole sectors, 4 (float) or 8 (half) elements a store. A thread storing its own
// slice would write EPT elements 4 * EPT bytes from its neighbour's: 12.5% (float) or 6.2%
// (half) of each sector it touches for 32-element blocks (the memory model's count).
#define DQ_THREADS 256  // plan.plan_dequantize's block (table: dequant_threads)
#define DQ_MAX_EPT 32
// The weight stage: a block's quant blocks (at most 256 of the 32-element types, 34 bytes
// each for Q8_0: 544 words) in up to DQ_MAX_SEGS runs, each with up to 15 bytes on either
// side, in aligned 16-byte words: 544 + 2 * 16.
#define DQ_W_WORDS 576  // table.DQ_W_WORDS
#define DQ_MAX_SEGS 16  // table.DQ_MAX_SEGS: rows of a gather one block stages

// Stage index of element e: one pad float per 32, so that lanes writing their slices
// (stride EPT = 1, 16 or 32) and lanes reading 4 or 8 consecutive elements hit distinct
// banks; 4 and 8 consecutive elements from a multiple of 4 (8) stay contiguous.
static __device__ __forceinline__ int dq_slot(const int e) { return e + (e >> 5); }

static __device__ __forceinline__ float * dq_stage() {
    __shared__ float s[DQ_THREADS * DQ_MAX_EPT + DQ_THREADS * DQ_MAX_EPT / 32];
    return s;
}
static __device__ __forceinline__ uint4 * dq_wstage() {
    __shared__ uint4 s[DQ_W_WORDS];
    return s;
}
// Where each run (segment) of a block's quant blocks sits in the weight stage.
struct dq_segments {
    long long shift[DQ_MAX_SEGS];  // a 16-byte word of w minus its stage word, per segment
    int end[DQ_MAX_SEGS];  // stage word past each segment (prefix sums)
    int count;  // segments staged; 0: dq reads global memory
};
static __device__ __forceinline__ dq_segments & dq_segs() {
    __shared__ dq_segments s;
    return s;
}

// 16 bytes of output from stage elements e..e+3 (float) or e..e+7 (half, bfloat16).
static __device__ __forceinline__ void store_word(float * dst, const float * s, const int e) {
    const int p = dq_slot(e);
    st_global((float4 *) dst, float4{s[p], s[p + 1], s[p + 2], s[p + 3]});
}
static __device__ __forceinline__ void store_word(__half * dst, const float * s, const int e) {
    const int p = dq_slot(e);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        w[k] = __half_as_ushort(__float2half_rn(s[p + 2 * k])) |
               ((uint32_t) __half_as_ushort(__float2half_rn(s[p + 2 * k + 1])) << 16);
    }
    st_global((uint4 *) dst, uint4{w[0], w[1], w[2], w[3]});
}
static __device__ __forceinline__ void store_word(bf16_t * dst, const float * s, const int e) {
    const int p = dq_slot(e);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        w[k] = bf16_bits(s[p + 2 * k]) | (bf16_bits(s[p + 2 * k + 1]) << 16);
    }
    st_global((uint4 *) dst, uint4{w[0], w[1], w[2], w[3]});
}

// One thread per slice of an output row; 1-D grid of DQ_THREADS-thread blocks. Output row
// r is source row ids[r] (or r when ids is null); an id outside [0, nsrc) yields a NaN row
// instead of a read out of bounds. y must be 16-byte aligned (ops.dequantize checks).
//
// Weight loads: a thread's dq reads its quant block 2 bytes at a time, 18-210 bytes from
// its neighbour's (6-51% of each sector used). So the block first copies its quant blocks
// into shared memory as aligned 16-byte words by consecutive threads (whole sectors, as
// the integer mat-vec does) and dq reads them there. They lie in runs (segments) that are
// contiguous in w: without ids one run (rows are contiguous, row_bytes = blocks per row *
// BYTES); a gather has one run per output row, ids[row]'s blocks, and stages when the
// block's slices span at most DQ_MAX_SEGS rows (rows of 16+ slices: 512+ columns of a
// 32-element type, every K-quant width); wider spans read global memory directly. Each
// run's copy covers the aligned words around its bytes: up to 15 bytes of neighbouring
// blocks or rows, never outside the buffer when it starts 16-byte aligned (its end is
// inside an aligned word), so an unaligned w also reads directly. F32/F16/BF16 (one element
// a thread) are coalesced as they are.
template <typename Q, typename T>
static __device__ __forceinline__ void dequantize_rows(
        const uint8_t * __restrict__ w, const int * __restrict__ ids, T * __restrict__ y,
        const int ncols, const int nrows, const int nsrc, const long long row_bytes) {
    static_assert(Q::EPT == 1 || Q::EPT == 16 || Q::EPT == 32, "the stage's bank layout");
    constexpr int per_block = Q::QK / Q::EPT;
    constexpr int WORD = 16 / sizeof(T);  // elements per 16-byte store
    const int per_row = ncols / Q::EPT;
    const long long total = (long long) nrows * per_row;  // slices
    const long long i0 = (long long) blockIdx.x * blockDim.x;
    const long long i = i0 + threadIdx.x;
    const long long r0 = i0 / per_row;  // the block's first output row
    float * stage = dq_stage();
    dq_segments & sg = dq_segs();
    int staged = 0;  // segments in the stage: byte `off` of segment g is off - 16 * shift[g]
    if constexpr (Q::QK > 1) {
        static_assert((DQ_THREADS / per_block * Q::BYTES + 15) / 16 + 2 * DQ_MAX_SEGS <= DQ_W_WORDS,
                      "a block's weight bytes fit the stage");
        const long long last = min(total, i0 + (long long) blockDim.x) - 1;
        const int segs = ids ? (int) (last / per_row - r0 + 1) : 1;
        if (((uintptr_t) w & 15) == 0 && segs <= DQ_MAX_SEGS) {  // the same for the whole block
            const int g = threadIdx.x;
            if (g < segs) {  // slices a..b, rows r0 + g (with ids) or all (without)
                const long long a = ids ? max(i0, (r0 + g) * per_row) : i0;
                const long long b = ids ? min(last, (r0 + g + 1) * per_row - 1) : last;
                // slice j of row r starts at byte j / per_block * BYTES + (src - r) * row_bytes
                const int src = ids ? ld_global(ids + r0 + g) : 0;
                const bool ok = !ids || (src >= 0 && src < nsrc);
                const long long d = ids ? (src - (r0 + g)) * row_bytes : 0;
                const long long lo = a / per_block * Q::BYTES + d;
                const long long hi = (b / per_block + 1) * Q::BYTES + d;
                sg.shift[g] = ok ? lo >> 4 : 0;
                sg.end[g] = ok ? (int) (((hi + 15) >> 4) - (lo >> 4)) : 0;
            }
            __syncthreads();
            if (threadIdx.x == 0) {  // word counts -> prefix sums; shift = w word - stage word
                int e = 0;
                for (int k = 0; k < segs; ++k) {
                    sg.shift[k] -= e;
                    e += sg.end[k];
                    sg.end[k] = e;
                }
                sg.count = e <= DQ_W_WORDS ? segs : 0;
            }
            __syncthreads();
            staged = sg.count;
            if (staged) {
                uint4 * ws = dq_wstage();
                const int words = sg.end[staged - 1];
                for (int k = threadIdx.x; k < words; k += blockDim.x) {
                    int s = 0;
                    while (k >= sg.end[s]) {
                        ++s;
                    }
                    ws[k] = ld_global((const uint4 *) w + (k + sg.shift[s]));
                }
                __syncthreads();
            }
        }
    }
    if (i < total) {
        const int row = (int) (i / per_row);
        const int s = (int) (i % per_row);
        const int src = ids ? ld_global(ids + row) : row;
        // A slice's slots are contiguous (it lies within one 32-element group of the
        // stage), so dq writes straight into shared memory.
        float * v = stage + dq_slot(threadIdx.x * Q::EPT);
        if (src >= 0 && src < nsrc) {
            const long long off = src * row_bytes + (s / per_block) * Q::BYTES;
            if (staged) {  // two calls, so that each reads one address space
                const long long shift = sg.shift[ids ? (int) (row - r0) : 0];
                Q::dq((const uint8_t *) dq_wstage() + (off - 16 * shift), s % per_block, v);
            } else {
                Q::dq(w + off, s % per_block, v);
            }
        } else {
#pragma unroll
            for (int j = 0; j < Q::EPT; ++j) {
                v[j] = __int_as_float(0x7fc00000);
            }
        }
    }
    __syncthreads();
    // The block's elements of y: [i0 * EPT, i0 * EPT + n), contiguous; i0 * EPT * sizeof(T)
    // is a multiple of 16 (DQ_THREADS * sizeof(T) is), so the words are aligned.
    const int n = (int) (min(total - i0, (long long) blockDim.x) * Q::EPT);
    T * out = y + i0 * Q::EPT;
    for (int e = threadIdx.x * WORD; e + WORD <= n; e += blockDim.x * WORD) {
        store_word(out + e, stage, e);
    }
    for (int e = n / WORD * WORD + threadIdx.x; e < n; e += blockDim.x) {  // the last < 16 bytes
        store_f32(out + e, stage[dq_slot(e)]);
    }
}

// The kernels: dequantize_<type>_<out>, out f32, f16 or bf16; block = DQ_THREADS threads
// (plan.plan_dequantize). DEQUANT(tag, T, name) defines `name` as dequantize_rows<tag, T>.
#define DEQUANT(Q, T, name)                                                                     \
    extern "C" __global__ void __launch_bounds__(256) name(                                     \
            const uint8_t * w, const int * ids, T * y, const int ncols, const int nrows,         \
            const int nsrc, const long long row_bytes) {                                         \
        dequantize_rows<Q, T>(w, ids, y, ncols, nrows, nsrc, row_bytes);                         \
    }
DEQUANT(t_f32, float, dequantize_f32_f32)
DEQUANT(t_f32, __half, dequantize_f32_f16)
DEQUANT(t_f32, bf16_t, dequantize_f32_bf16)
DEQUANT(t_f16, float, dequantize_f16_f32)
DEQUANT(t_f16, __half, dequantize_f16_f16)
DEQUANT(t_f16, bf16_t, dequantize_f16_bf16)
DEQUANT(t_bf16, float, dequantize_bf16_f32)
DEQUANT(t_bf16, __half, dequantize_bf16_f16)
DEQUANT(t_bf16, bf16_t, dequantize_bf16_bf16)
DEQUANT(t_q4_0, float, dequantize_q4_0_f32)
DEQUANT(t_q4_0, __half, dequantize_q4_0_f16)
DEQUANT(t_q4_0, bf16_t, dequantize_q4_0_bf16)
DEQUANT(t_q4_1, float, dequantize_q4_1_f32)
DEQUANT(t_q4_1, __half, dequantize_q4_1_f16)
DEQUANT(t_q4_1, bf16_t, dequantize_q4_1_bf16)
DEQUANT(t_q5_0, float, dequantize_q5_0_f32)
DEQUANT(t_q5_0, __half, dequantize_q5_0_f16)
DEQUANT(t_q5_0, bf16_t, dequantize_q5_0_bf16)
DEQUANT(t_q5_1, float, dequantize_q5_1_f32)
DEQUANT(t_q5_1, __half, dequantize_q5_1_f16)
DEQUANT(t_q5_1, bf16_t, dequantize_q5_1_bf16)
DEQUANT(t_q8_0, float, dequantize_q8_0_f32)
DEQUANT(t_q8_0, __half, dequantize_q8_0_f16)
DEQUANT(t_q8_0, bf16_t, dequantize_q8_0_bf16)
DEQUANT(t_q2_k, float, dequantize_q2_k_f32)
DEQUANT(t_q2_k, __half, dequantize_q2_k_f16)
DEQUANT(t_q2_k, bf16_t, dequantize_q2_k_bf16)
DEQUANT(t_q3_k, float, dequantize_q3_k_f32)
DEQUANT(t_q3_k, __half, dequantize_q3_k_f16)
DEQUANT(t_q3_k, bf16_t, dequantize_q3_k_bf16)
DEQUANT(t_q4_k, float, dequantize_q4_k_f32)
DEQUANT(t_q4_k, __half, dequantize_q4_k_f16)
DEQUANT(t_q4_k, bf16_t, dequantize_q4_k_bf16)
DEQUANT(t_q5_k, float, dequantize_q5_k_f32)
DEQUANT(t_q5_k, __half, dequantize_q5_k_f16)
DEQUANT(t_q5_k, bf16_t, dequantize_q5_k_bf16)
DEQUANT(t_q6_k, float, dequantize_q6_k_f32)
DEQUANT(t_q6_k, __half, dequantize_q6_k_f16)
DEQUANT(t_q6_k, bf16_t, dequantize_q6_k_bf16)

// The per-type constants as the kernels see them, for the test against table.py:
// out[4*i + {0,1,2,3}] = QK, BYTES, EPT, DP4A of the i-th type of FOR_EACH_TYPE.
#define TYPE_INFO(Q, name)                                                                 \
    if (threadIdx.x == n) {                                                                \
        out[4 * n] = Q::QK; out[4 * n + 1] = Q::BYTES; out[4 * n + 2] = Q::EPT;            \
        out[4 * n + 3] = Q::DP4A;                                                          \
    }                                                                                      \
    ++n;
extern "C" __global__ void type_info(int * out) {
    int n = 0;
    FOR_EACH_TYPE(TYPE_INFO)
}
