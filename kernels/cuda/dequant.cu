// Dequantize whole rows of a GGML matrix to f32 or f16: the prefill path (dequantize, then a
// cuBLAS GEMM) and the embedding gather (rows picked by token ids, from any table type).
#include "quants.cuh"

static __device__ __forceinline__ void store(float * p, const float v) { *p = v; }
static __device__ __forceinline__ void store(__half * p, const float v) { *p = __float2half(v); }

// One thread per thread slice (EPT elements, see quants.cuh) of an output row; 1-D grid.
// Output row r is source row ids[r] (or r when ids is null); an id outside [0, nsrc) yields
// a NaN row instead of a read out of bounds.
template <typename Q, typename T>
static __device__ __forceinline__ void dequantize_rows(
        const uint8_t * __restrict__ w, const int * __restrict__ ids, T * __restrict__ y,
        const int ncols, const int nrows, const int nsrc, const long long row_bytes) {
    constexpr int per_block = Q::QK / Q::EPT;
    const int per_row = ncols / Q::EPT;
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long) nrows * per_row) {
        return;
    }
    const int row = (int) (i / per_row);
    const int s = (int) (i % per_row);
    const int src = ids ? ids[row] : row;
    float v[Q::EPT];
    if (src >= 0 && src < nsrc) {
        Q::dq(w + src * row_bytes + (s / per_block) * Q::BYTES, s % per_block, v);
    } else {
#pragma unroll
        for (int j = 0; j < Q::EPT; ++j) {
            v[j] = __int_as_float(0x7fc00000);
        }
    }
    T * out = y + (long long) row * ncols + s * Q::EPT;
#pragma unroll
    for (int j = 0; j < Q::EPT; ++j) {
        store(out + j, v[j]);
    }
}

// block = 256 threads: see plan.plan_dequantize.
#define DEQUANT_KERNELS(Q, name)                                                                \
    extern "C" __global__ void __launch_bounds__(256) dequantize_##name##_f32(                  \
            const uint8_t * w, const int * ids, float * y, const int ncols, const int nrows,     \
            const int nsrc, const long long row_bytes) {                                         \
        dequantize_rows<Q, float>(w, ids, y, ncols, nrows, nsrc, row_bytes);                     \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) dequantize_##name##_f16(                  \
            const uint8_t * w, const int * ids, __half * y, const int ncols, const int nrows,    \
            const int nsrc, const long long row_bytes) {                                         \
        dequantize_rows<Q, __half>(w, ids, y, ncols, nrows, nsrc, row_bytes);                    \
    }
FOR_EACH_TYPE(DEQUANT_KERNELS)

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
