// Matrix-vector product for decode, every weight type: y[b, r] = sum_c W[r, c] * x[b, c].
// W rows hold GGML blocks (row_bytes apart); x and y are float32, batch rows on grid.y.
#include "quants.cuh"

// One warp per output row. Lane l takes the row's thread slices l, l+32, ... (EPT elements
// each, see quants.cuh), so neighbouring lanes read neighbouring bytes of W and x; a warp
// reduction finishes the row. No __syncthreads: a warp past the last row still joins its
// own reduction and simply stores nothing.
template <typename Q>
static __device__ __forceinline__ void mul_mat_vec(
        const uint8_t * __restrict__ w, const float * __restrict__ x, float * __restrict__ y,
        const int ncols, const int nrows, const long long row_bytes) {
    static_assert(Q::EPT == 1 || Q::EPT % 4 == 0, "x is read as float4 or single floats");
    constexpr int per_block = Q::QK / Q::EPT;
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    x += (long long) blockIdx.y * ncols;
    y += (long long) blockIdx.y * nrows;

    float acc = 0.0f;
    if (row < nrows) {
        const uint8_t * wr = w + row * row_bytes;
        const int nslices = ncols / Q::EPT;
        for (int i = threadIdx.x; i < nslices; i += WARP_SIZE) {
            float v[Q::EPT];
            Q::dq(wr + (i / per_block) * Q::BYTES, i % per_block, v);
            const float * xs = x + i * Q::EPT;
            if constexpr (Q::EPT % 4 == 0) {  // x rows are 16-byte aligned: ncols % 32 == 0
#pragma unroll
                for (int j = 0; j < Q::EPT; j += 4) {
                    const float4 xv = load_float4(xs + j);
                    acc += v[j] * xv.x + v[j + 1] * xv.y + v[j + 2] * xv.z + v[j + 3] * xv.w;
                }
            } else {
                acc += v[0] * xs[0];  // F32/F16: one element per slice
            }
        }
    }
    acc = warp_reduce_sum(acc);
    if (row < nrows && threadIdx.x == 0) {
        y[row] = acc;
    }
}

// block = (32, rows per block <= 8): see plan.plan_mul_mat_vec.
#define MMV_KERNEL(Q, name)                                                                     \
    extern "C" __global__ void __launch_bounds__(256) mul_mat_vec_##name(                       \
            const uint8_t * w, const float * x, float * y, const int ncols, const int nrows,     \
            const long long row_bytes) {                                                         \
        mul_mat_vec<Q>(w, x, y, ncols, nrows, row_bytes);                                        \
    }
FOR_EACH_TYPE(MMV_KERNEL)
