// RMSNorm and LayerNorm over the last axis, fused with the weight (and bias) multiply.
// Each row is reduced by blockDim.x threads; short rows get one warp each and several rows
// share a block (blockDim.y rows), long rows get up to 1024 threads (see plan.plan_rows).
#include "q8_1.cuh"

// 1 / sqrt(mean(x^2) + eps) of a row of x (row `valid`: the block reduction has barriers,
// so every thread of the block calls this).
static __device__ __forceinline__ float rms_scale(
        const float * __restrict__ x, const int ncols, const float eps, const bool valid,
        float * s_sum) {
    float sum = 0.0f;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            sum += x[col] * x[col];
        }
    }
    sum = block_reduce_sum(sum, s_sum);
    return rsqrtf(sum / ncols + eps);
}

// y = x / sqrt(mean(x^2) + eps) * w
extern "C" __global__ void __launch_bounds__(1024) rms_norm_f32(
        const float * __restrict__ x, const float * __restrict__ w, float * __restrict__ y,
        const int ncols, const int nrows, const float eps) {
    __shared__ float s_sum[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const bool valid = row < nrows;  // no early return: the block reduction has barriers
    x += (long long) row * ncols;
    y += (long long) row * ncols;
    const float scale = rms_scale(x, ncols, eps, valid, s_sum);
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            y[col] = scale * x[col] * w[col];
        }
    }
}

// rms_norm_f32 whose output is the next mat-vec's q8_1 row (ncols % 32 == 0) instead of
// floats: each warp of the row writes q8_1 blocks (warp k of the row: blocks k, k + warps,
// ...), of exactly the floats rms_norm_f32 stores, so the bytes equal quantize_q8_1 of its
// output and the decode step saves that launch and the float row's round trip. Same
// launch as rms_norm_f32 (plan.plan_rows); row r's blocks start at xq + r * xq_stride.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_q8_1(
        const float * __restrict__ x, const float * __restrict__ w, uint8_t * __restrict__ xq,
        const int ncols, const int nrows, const float eps, const long long xq_stride) {
    __shared__ float s_sum[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= nrows && blockDim.y == 1) {
        return;  // the whole block: nobody waits at the reduction's barriers
    }
    const bool valid = row < nrows;
    x += (long long) row * ncols;
    const float scale = rms_scale(x, ncols, eps, valid, s_sum);
    if (!valid) {
        return;  // whole warps: the row's threads are blockDim.x, a multiple of 32
    }
    const int lane = threadIdx.x % WARP_SIZE;
    for (int blk = threadIdx.x / WARP_SIZE; blk < ncols / 32; blk += blockDim.x / WARP_SIZE) {
        const int col = blk * 32 + lane;
        store_q8_1_block(scale * x[col] * w[col], xq + row * xq_stride + blk * Q8_1_BYTES);
    }
}

// res + rms_norm_f32's value (scale * y * w) with the separate launches' roundings: two
// products, then the add (add_f32), never contracted into an FMA.
static __device__ __forceinline__ float post_norm_add(const float res, const float y,
                                                      const float w, const float scale) {
    return __fadd_rn(res, __fmul_rn(__fmul_rn(scale, y), w));
}

// A norm after a projection, the residual, and the next norm as q8_1 rows, in one launch
// (Gemma 2/3 after attention: rms_norm_f32 of o_proj's output y with w_post, add_f32 of the
// residual res, rms_norm_q8_1 of that sum h with w_pre). Stores h (the MLP's residual) and
// the q8_1 rows; both are bit for bit those of the three launches under the same launch
// (plan.plan_rows): each sum of squares takes the same products in the same order as
// rms_scale's, and the q8_1 pass recomputes h as it was stored.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_add_rms_norm_q8_1(
        const float * __restrict__ y, const float * __restrict__ res,
        const float * __restrict__ w_post, const float * __restrict__ w_pre, float * __restrict__ h,
        uint8_t * __restrict__ xq, const int ncols, const int nrows, const float eps,
        const long long xq_stride) {
    __shared__ float s_sum[32];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= nrows && blockDim.y == 1) {
        return;  // the whole block: nobody waits at the reductions' barriers
    }
    const bool valid = row < nrows;
    y += (long long) row * ncols;
    res += (long long) row * ncols;
    h += (long long) row * ncols;
    const float post = rms_scale(y, ncols, eps, valid, s_sum);
    float sum = 0.0f;
    if (valid) {
        for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
            const float v = post_norm_add(res[col], y[col], w_post[col], post);
            h[col] = v;
            sum += v * v;
        }
    }
    const float pre = rsqrtf(block_reduce_sum(sum, s_sum) / ncols + eps);
    if (!valid) {
        return;  // whole warps: the row's threads are blockDim.x, a multiple of 32
    }
    const int lane = threadIdx.x % WARP_SIZE;
    for (int blk = threadIdx.x / WARP_SIZE; blk < ncols / 32; blk += blockDim.x / WARP_SIZE) {
        const int col = blk * 32 + lane;
        const float v = post_norm_add(res[col], y[col], w_post[col], post);
        store_q8_1_block(pre * v * w_pre[col], xq + row * xq_stride + blk * Q8_1_BYTES);
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
