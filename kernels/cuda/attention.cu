// Decode attention over the device KV cache: one query token per (head, batch) block.
// K and V are (batch, kv_heads, positions, head_dim) with arbitrary strides, so a narrowed
// view of a preallocated cache needs no copy; query head h reads kv head h / group (GQA).
// Prefill (many queries) goes through cuBLAS GEMMs and softmax.cu instead.
#include "common.cuh"

#define ATTN_MAX_D 256     // head_dim limit: 8 values per lane
#define ATTN_MAX_WARPS 8   // blockDim.y limit, sizes the combine buffers (8 KB)

// Each warp walks keys warp, warp + nwarps, ... with an online softmax (running max m, sum l,
// accumulator acc over head_dim split across lanes); the block then merges the warps' partial
// results through shared memory. Key j is visible iff j <= causal_limit and key_mask[j] != 0.
extern "C" __global__ void __launch_bounds__(256) attn_decode_f32(
        const float * __restrict__ q, const float * __restrict__ k, const float * __restrict__ v,
        float * __restrict__ out, const int head_dim, const int n_kv, const int n_heads,
        const int group, const long long kv_stride_b, const long long kv_stride_h,
        const long long kv_stride_s, const float scale, const int causal_limit,
        const float * __restrict__ key_mask, const long long mask_stride) {
    __shared__ float s_m[ATTN_MAX_WARPS];
    __shared__ float s_l[ATTN_MAX_WARPS];
    __shared__ float s_acc[ATTN_MAX_WARPS * ATTN_MAX_D];
    constexpr int PER_LANE = ATTN_MAX_D / WARP_SIZE;

    const int h = blockIdx.x, b = blockIdx.y;
    const int lane = threadIdx.x, warp = threadIdx.y, nwarps = blockDim.y;
    const long long kv_off = b * kv_stride_b + (h / group) * kv_stride_h;
    q += ((long long) b * n_heads + h) * head_dim;
    out += ((long long) b * n_heads + h) * head_dim;
    const float * mask = key_mask ? key_mask + b * mask_stride : nullptr;

    float qv[PER_LANE], acc[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const int d = lane + t * WARP_SIZE;
        qv[t] = d < head_dim ? q[d] * scale : 0.0f;
        acc[t] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    const int n = min(n_kv, causal_limit + 1);
    for (int j = warp; j < n; j += nwarps) {  // j is uniform across the warp
        if (mask && mask[j] == 0.0f) {
            continue;
        }
        const float * kj = k + kv_off + j * kv_stride_s;
        const float * vj = v + kv_off + j * kv_stride_s;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < PER_LANE; ++t) {
            const int d = lane + t * WARP_SIZE;
            s += d < head_dim ? qv[t] * kj[d] : 0.0f;
        }
        s = warp_reduce_sum(s);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int t = 0; t < PER_LANE; ++t) {
            const int d = lane + t * WARP_SIZE;
            acc[t] = acc[t] * corr + (d < head_dim ? p * vj[d] : 0.0f);
        }
        m = m_new;
    }

    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const int d = lane + t * WARP_SIZE;
        if (d < head_dim) {
            s_acc[warp * ATTN_MAX_D + d] = acc[t];
        }
    }
    __syncthreads();

    float mx = NEG_INF;
    for (int w = 0; w < nwarps; ++w) {
        mx = fmaxf(mx, s_m[w]);
    }
    float total = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
        total += s_m[w] == NEG_INF ? 0.0f : s_l[w] * expf(s_m[w] - mx);
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int d = warp * WARP_SIZE + lane; d < head_dim; d += nwarps * WARP_SIZE) {
        float o = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            o += s_m[w] == NEG_INF ? 0.0f : s_acc[w * ATTN_MAX_D + d] * expf(s_m[w] - mx);
        }
        out[d] = o * inv;
    }
}
