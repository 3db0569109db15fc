// Row softmax of attention scores with the scale and the masks computed on the device.
// Rows are (batch, heads, q) flattened, columns are keys. Query i of a row may see key j iff
//   j <= causal_offset + i   (when causal_offset >= 0)  and  key_mask[batch, j] != 0 (if any)
//   and j > causal_offset + i - window   (when window > 0: sliding-window layers),
// so no mask tensor crosses from the host. A row with no visible key becomes zeros.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(1024) softmax_f32(
        const float * __restrict__ x, float * __restrict__ y, const int ncols, const int nrows,
        const int rows_per_batch, const int nq, const float scale, const int causal_offset,
        const float * __restrict__ key_mask, const int window) {
    __shared__ float s_red[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool valid = row < nrows;
    const int limit = causal_offset >= 0 ? causal_offset + row % nq : ncols - 1;
    const int first = window > 0 ? limit - window + 1 : 0;  // lowest visible key
    const float * mask = key_mask ? key_mask + (long long) (row / rows_per_batch) * ncols : nullptr;
    x += (long long) row * ncols;
    y += (long long) row * ncols;

    float m = NEG_INF;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            if (col >= first && col <= limit && (!mask || mask[col] != 0.0f)) {
                m = fmaxf(m, x[col] * scale);
            }
        }
    }
    m = block_reduce_max(m, s_red);

    float sum = 0.0f;
    if (valid && m != NEG_INF) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            if (col >= first && col <= limit && (!mask || mask[col] != 0.0f)) {
                sum += expf(x[col] * scale - m);
            }
        }
    }
    sum = block_reduce_sum(sum, s_red);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            const bool seen = col >= first && col <= limit && (!mask || mask[col] != 0.0f);
            y[col] = seen ? expf(x[col] * scale - m) * inv : 0.0f;
        }
    }
}
