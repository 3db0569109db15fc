// Greedy sampling: the index of each row's maximum (the first one on ties, like NumPy), so
// only a 4-byte token id leaves the device. NaNs are skipped; with `checked`, a row holding
// a NaN or an infinity gives -1 instead (the sampler's "not finite" id, in the same launch).
// A warp that saw one hands NaN on as its maximum (a maximum is never NaN otherwise).
#include "common.cuh"

static __device__ __forceinline__ void better(float & v, int & i, const float ov, const int oi) {
    if (ov > v || (ov == v && oi < i)) {
        v = ov;
        i = oi;
    }
}

// One block per row, blockDim.x threads (see plan.plan_argmax).
extern "C" __global__ void __launch_bounds__(1024) argmax_f32(
        const float * __restrict__ x, int * __restrict__ out, const int ncols, const int checked) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    x += (long long) blockIdx.x * ncols;
    float v = NEG_INF;
    int idx = 0x7fffffff;
    bool bad = false;
    for (int col = threadIdx.x; col < ncols; col += blockDim.x) {
        const float xc = x[col];
        bad |= !isfinite(xc);
        better(v, idx, xc, col);  // NaN compares false and is skipped
    }
    bad = __any_sync(FULL_MASK, checked && bad);
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, offset, WARP_SIZE);
        const int oi = __shfl_xor_sync(FULL_MASK, idx, offset, WARP_SIZE);
        better(v, idx, ov, oi);
    }
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) {
        s_val[warp] = bad ? __int_as_float(0x7fc00000) : v;  // NaN: this warp saw one
        s_idx[warp] = idx;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < blockDim.x / WARP_SIZE ? s_val[lane] : NEG_INF;
        bad = __any_sync(FULL_MASK, isnan(v));
        v = bad ? NEG_INF : v;
        idx = lane < blockDim.x / WARP_SIZE ? s_idx[lane] : 0x7fffffff;
#pragma unroll
        for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, v, offset, WARP_SIZE);
            const int oi = __shfl_xor_sync(FULL_MASK, idx, offset, WARP_SIZE);
            better(v, idx, ov, oi);
        }
        if (lane == 0) {
            out[blockIdx.x] = bad ? -1 : idx == 0x7fffffff ? 0 : idx;
        }
    }
}
