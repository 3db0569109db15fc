// The captured decode step's KV row write (step.cu: float32 cache; kv_f16.cu: half), for
// a cache of element type T: src (batch, heads, 1, head_dim) float32 contiguous, dst
// (batch, heads, capacity, head_dim) with strides in elements, row *pos (read on the
// device). One thread per element; 1-D grid (plan.plan_elementwise). A half cache stores
// src rounded to nearest even, as the eager step's astype(float16) does. A batched step's
// graph passes `slot` (else nullptr): two int64 in device memory, the cache's address and
// stride_h, which replace dst and stride_h (each sequence's own buffer, written before
// each replay, so the graph serves whichever sequences fill its rows).
#pragma once

#include "rope.cuh"

#define KV_STORE_KERNEL(T, name)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) name(                                        \
            const float * __restrict__ src, T * __restrict__ dst, const int heads,                 \
            const int head_dim, const long long stride_b, const long long stride_h,                \
            const long long stride_s, const int * __restrict__ pos, const long long n,             \
            const long long * __restrict__ slot) {                                                 \
        const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;                     \
        if (i >= n) {                                                                              \
            return;                                                                                \
        }                                                                                          \
        T * base = slot != nullptr ? (T *) slot[0] : dst;                                          \
        const long long sh = slot != nullptr ? slot[1] : stride_h;                                 \
        const int d = (int) (i % head_dim);                                                        \
        const long long bh = i / head_dim;                                                         \
        const long long h = bh % heads, b = bh / heads;                                            \
        store_f32(base + b * stride_b + h * sh + (long long) *pos * stride_s + d,                  \
                  ld_global(src + i));                                                             \
    }

// Pair (i0, i1) of head h (of heads q heads, then kv_heads k heads, then kv_heads v heads)
// of batch row b's q/k/v values: q and k pairs rotated at position *pos (pair index i,
// rope.cuh), then q stored into q_out (batch, heads, head_dim) and k, v into row *row of
// the caches as T (a half or bfloat16 cache rounds to nearest even). *row is *pos but for a
// sliding layer's ring (the position past the layer's start). The end of rope_kv_* below
// and of the q/k/v mat-vec's epilogue (mmv.cu mul_mat_vec_q_rope_kv).
template <typename T>
static __device__ __forceinline__ void store_qkv_pair(
        float x0, float x1, const int b, const int h, const int i, const int i0, const int i1,
        float * __restrict__ q_out, T * __restrict__ kc, T * __restrict__ vc, const int heads,
        const int kv_heads, const int head_dim, const long long stride_b,
        const long long stride_h, const long long stride_s, const int * __restrict__ pos,
        const int * __restrict__ row, const float theta, const float * __restrict__ freq_factors) {
    if (h < heads + kv_heads) {
        rope_rotate(x0, x1, *pos, i, head_dim, theta, freq_factors);
    }
    if (h < heads) {
        float * o = q_out + ((long long) b * heads + h) * head_dim;
        st_global(o + i0, x0);
        st_global(o + i1, x1);
        return;
    }
    const int kh = h < heads + kv_heads ? h - heads : h - heads - kv_heads;
    T * c = (h < heads + kv_heads ? kc : vc) + b * stride_b + kh * stride_h +
            (long long) *row * stride_s;
    store_f32(c + i0, x0);
    store_f32(c + i1, x1);
}

// RoPE fused into the KV-cache write, for one new token of each of `batch` sequences (a
// decode step; grid.y = batch): qkv is the q/k/v mat-vec's output, rows of (heads + 2 *
// kv_heads) * head_dim floats, q heads then k heads then v heads (bias already added by
// the mat-vec's epilogue). One thread per pair of a row (rope.cu's pairing: neox (i, i +
// D/2) or normal (2i, 2i + 1)), stored by store_qkv_pair. Replaces two ropes and two KV
// row writes (4 launches) with one; q, k and the cache rows are bit for bit those of
// rope_f32 and kv_store_*. 1-D grid over a row's (heads + 2 * kv_heads) * head_dim / 2
// pairs (plan.plan_rope_kv).
template <typename T>
static __device__ __forceinline__ void rope_kv_row(
        const float * __restrict__ qkv, float * __restrict__ q_out, T * __restrict__ kc,
        T * __restrict__ vc, const int heads, const int kv_heads, const int head_dim,
        const long long stride_b, const long long stride_h, const long long stride_s,
        const int * __restrict__ pos, const int * __restrict__ row, const float theta,
        const int neox, const float * __restrict__ freq_factors) {
    const int half = head_dim / 2;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= (heads + 2 * kv_heads) * half) {
        return;
    }
    const int b = blockIdx.y, h = p / half, i = p % half;
    const int i0 = neox ? i : 2 * i, i1 = i0 + (neox ? half : 1);
    const float * src = qkv + (long long) b * (heads + 2 * kv_heads) * head_dim + h * head_dim;
    store_qkv_pair<T>(ld_global(src + i0), ld_global(src + i1), b, h, i, i0, i1, q_out, kc, vc,
                      heads, kv_heads, head_dim, stride_b, stride_h, stride_s, pos, row, theta,
                      freq_factors);
}

#define ROPE_KV_KERNEL(T, name)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) name(                                        \
            const float * __restrict__ qkv, float * __restrict__ q_out, T * __restrict__ kc,       \
            T * __restrict__ vc, const int heads, const int kv_heads, const int head_dim,          \
            const long long stride_b, const long long stride_h, const long long stride_s,          \
            const int * __restrict__ pos, const int * __restrict__ row, const float theta,         \
            const int neox, const float * __restrict__ freq_factors) {                             \
        rope_kv_row<T>(qkv, q_out, kc, vc, heads, kv_heads, head_dim, stride_b, stride_h,          \
                       stride_s, pos, row, theta, neox, freq_factors);                             \
    }

// Every kernel of a KV cache mode over element type T (kv_f16.cu, kv_bf16.cu), each name
// written out by the caller, which includes attention.cuh: attention (the tiled kernel,
// then the decode kernel for E = 2, 4, 8, each as name, name_pos and name_slot), the
// captured step's row write and RoPE fused into the row write.
#define KV_MODE_KERNELS(T, attn, attn_pos, attn_slot, e2, e2_pos, e2_slot, e4, e4_pos, e4_slot,    \
                        e8, e8_pos, e8_slot, store, rope_kv)                                       \
    ATTN_KERNELS(T, attn, attn_pos, attn_slot)                                                     \
    ATTN_VEC_KERNELS(T, 2, e2, e2_pos, e2_slot)                                                    \
    ATTN_VEC_KERNELS(T, 4, e4, e4_pos, e4_slot)                                                    \
    ATTN_VEC_KERNELS(T, 8, e8, e8_pos, e8_slot)                                                    \
    KV_STORE_KERNEL(T, store)                                                                      \
    ROPE_KV_KERNEL(T, rope_kv)
