// The probe's kernel: one small launch whose result proves, before any weight moves, that
// NVRTC compiles our sources, cuda_fp16.h is found, and the device runs a warp correctly.
//   y[i] = float(half(x[i])) * 2 + i + (sum over the warp of 1)
#include "half.cuh"

extern "C" __global__ void __launch_bounds__(32) selftest_f16(
        const float * __restrict__ x, float * __restrict__ y, const int n) {
    const int i = threadIdx.x;
    const float v = i < n ? __half2float(__float2half(x[i])) : 0.0f;
    const float lanes = warp_reduce_sum(1.0f);  // every lane joins: 32
    if (i < n) {
        y[i] = v * 2.0f + (float) i + lanes;
    }
}
