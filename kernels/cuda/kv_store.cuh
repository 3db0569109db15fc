// The captured decode step's KV row write (step.cu: float32 cache; kv_f16.cu: half), for
// a cache of element type T: src (batch, heads, 1, head_dim) float32 contiguous, dst
// (batch, heads, capacity, head_dim) with strides in elements, row *pos (read on the
// device). One thread per element; 1-D grid (plan.plan_elementwise). A half cache stores
// src rounded to nearest even, as the eager step's astype(float16) does.
#pragma once

#include "common.cuh"

#define KV_STORE_KERNEL(T, name)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) name(                                        \
            const float * __restrict__ src, T * __restrict__ dst, const int heads,                 \
            const int head_dim, const long long stride_b, const long long stride_h,                \
            const long long stride_s, const int * __restrict__ pos, const long long n) {           \
        const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;                     \
        if (i >= n) {                                                                              \
            return;                                                                                \
        }                                                                                          \
        const int d = (int) (i % head_dim);                                                        \
        const long long bh = i / head_dim;                                                         \
        const long long h = bh % heads, b = bh / heads;                                            \
        store_f32(dst + b * stride_b + h * stride_h + (long long) *pos * stride_s + d,             \
                  ld_global(src + i));                                                             \
    }
