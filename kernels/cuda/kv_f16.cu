// The float16 KV cache mode (CudaBackend.kv_dtype = float16): attention over half K/V and
// the captured decode step's row write into a half cache. The kernels are attention.cu's
// and step.cu's with half storage; everything they compute is float32 (attention.cuh widens
// each K/V value as it is read), so a half cache halves the KV bytes stored and read, and
// adds only the rounding of K and V to half (relative 2^-11, docs/cuda.md states parity).
// A module of its own so attention.cu keeps compiling with NVRTC alone (no cuda_fp16.h).
#include "half.cuh"
#include "attention.cuh"

// attn_f32 over a half cache: the same arguments, strides in elements.
extern "C" __global__ void __launch_bounds__(256) attn_kv_f16(
        const float * __restrict__ q, const __half * __restrict__ k, const __half * __restrict__ v,
        float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,
        const int head_dim, const int rows, const int nq, const int n_kv, const int kv_heads,
        const long long kv_stride_b, const long long kv_stride_h, const long long kv_stride_s,
        const float scale, const float softcap, const int causal_offset, const int window,
        const float * __restrict__ key_mask, const long long mask_stride) {
    attn_block(q, k, v, out, part, part_ml, head_dim, rows, nq, n_kv, kv_heads, kv_stride_b,
               kv_stride_h, kv_stride_s, scale, softcap, causal_offset, window, key_mask,
               mask_stride);
}

// attn_f32_pos over a half cache (a captured decode step; the position is read at *pos).
extern "C" __global__ void __launch_bounds__(256) attn_kv_f16_pos(
        const float * __restrict__ q, const __half * __restrict__ k, const __half * __restrict__ v,
        float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,
        const int head_dim, const int rows, const int nq, const int * __restrict__ pos,
        const int kv_heads, const long long kv_stride_b, const long long kv_stride_h,
        const long long kv_stride_s, const float scale, const float softcap, const int window) {
    const int p = *pos;
    attn_block(q, k, v, out, part, part_ml, head_dim, rows, nq, p + nq, kv_heads, kv_stride_b,
               kv_stride_h, kv_stride_s, scale, softcap, p, window, nullptr, 0);
}

// kv_store_f32 into a half cache: src (batch, heads, 1, head_dim) float32 contiguous, rounded
// to nearest even (as NumPy's and CuPy's astype(float16) round, so eager and captured steps
// store the same bits). One thread per element; 1-D grid (plan.plan_elementwise).
extern "C" __global__ void __launch_bounds__(256) kv_store_f16(
        const float * __restrict__ src, __half * __restrict__ dst, const int heads,
        const int head_dim, const long long stride_b, const long long stride_h,
        const long long stride_s, const int * __restrict__ pos, const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const int d = (int) (i % head_dim);
    const long long bh = i / head_dim;
    const long long h = bh % heads, b = bh / heads;
    st_global(dst + b * stride_b + h * stride_h + (long long) *pos * stride_s + d,
              __float2half_rn(ld_global(src + i)));
}
