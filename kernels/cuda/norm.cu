// RMSNorm and LayerNorm over the last axis, fused with the weight (and bias) multiply.
// Each row is reduced by blockDim.x threads; short rows get one warp each and several rows
// share a block (blockDim.y rows), long rows get up to 1024 threads (see plan.plan_rows).
#include "common.cuh"

// y = x / sqrt(mean(x^2) + eps) * w
extern "C" __global__ void __launch_bounds__(1024) rms_norm_f32(
        const float * __restrict__ x, const float * __restrict__ w, float * __restrict__ y,
        const int ncols, const int nrows, const float eps) {
    __shared__ float s_sum[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool valid = row < nrows;  // no early return: the block reduction has barriers
    x += (long long) row * ncols;
    y += (long long) row * ncols;

    float sum = 0.0f;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            sum += x[col] * x[col];
        }
    }
    sum = block_reduce_sum(sum, s_sum);
    const float scale = rsqrtf(sum / ncols + eps);

    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            y[col] = scale * x[col] * w[col];
        }
    }
}

// y = (x - mean) / sqrt(var + eps) * w + b; two passes (mean, then squared deviations) so
// rows with a large mean keep their precision. b may be null.
extern "C" __global__ void __launch_bounds__(1024) layer_norm_f32(
        const float * __restrict__ x, const float * __restrict__ w, const float * __restrict__ b,
        float * __restrict__ y, const int ncols, const int nrows, const float eps) {
    __shared__ float s_sum[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool valid = row < nrows;
    x += (long long) row * ncols;
    y += (long long) row * ncols;

    float sum = 0.0f;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            sum += x[col];
        }
    }
    const float mean = block_reduce_sum(sum, s_sum) / ncols;

    float var = 0.0f;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            const float d = x[col] - mean;
            var += d * d;
        }
    }
    const float inv_std = rsqrtf(block_reduce_sum(var, s_sum) / ncols + eps);

    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            const float v = (x[col] - mean) * inv_std * w[col];
            y[col] = b ? v + b[col] : v;
        }
    }
}
