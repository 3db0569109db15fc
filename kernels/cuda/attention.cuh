// The body of the attention kernels (attention.cu: float32 K/V; kv_f16.cu: half K/V),
// templated on the cache's element type T. Scores, softmax and the accumulator are float32
// whatever T is: K/V values are widened with to_f32 as they are read (common.cuh for float,
// half.cuh for half), so a half cache halves the bytes read and nothing else changes.
#pragma once

#include "common.cuh"

#define ATTN_MAX_D 256    // head_dim limit: 8 accumulator values per lane
#define ATTN_TILE 32      // keys per shared-memory tile: one key per lane when scoring
#define ATTN_MAX_ROWS 8   // query rows per block (one per warp): blockDim.y limit

// Block (32, rows <= 8), grid (row tiles, batch * kv_heads, splits). Warp w owns query row
// blockIdx.x * blockDim.y + w. Per tile of 32 keys: the block stages K in shared memory
// (rows padded by one float, so lane j reading key j's row hits 32 distinct banks); lane j
// scores key j against its warp's query; the warp updates its running max m and sum l and
// rescales its accumulator (head_dim split across lanes) by exp(m_old - m_new); then adds
// p_j * V[j], reading V rows straight from global memory, coalesced across the lanes.
template <typename T>
static __device__ __forceinline__ void attn_block(
        const float * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,
        float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,
        const int head_dim, const int rows, const int nq, const int n_kv, const int kv_heads,
        const long long kv_stride_b, const long long kv_stride_h, const long long kv_stride_s,
        const float scale, const float softcap, const int causal_offset, const int window,
        const float * __restrict__ key_mask, const long long mask_stride) {
    __shared__ float s_k[ATTN_TILE * (ATTN_MAX_D + 1)];
    __shared__ float s_q[ATTN_MAX_ROWS * ATTN_MAX_D];
    __shared__ float s_p[ATTN_MAX_ROWS * ATTN_TILE];
    constexpr int PER_LANE = ATTN_MAX_D / WARP_SIZE;

    const int lane = threadIdx.x, warp = threadIdx.y, nwarps = blockDim.y;
    const int tid = warp * WARP_SIZE + lane, nthreads = nwarps * WARP_SIZE;
    const int bk = blockIdx.y, b = bk / kv_heads, kvh = bk % kv_heads;
    const int r0 = blockIdx.x * nwarps, row = r0 + warp;
    const bool valid = row < rows;
    const int ld = head_dim + 1;
    const T * kb = k + b * kv_stride_b + kvh * kv_stride_h;
    const T * vb = v + b * kv_stride_b + kvh * kv_stride_h;
    const float * mask = key_mask ? key_mask + b * mask_stride : nullptr;

    // This row's visible keys [first, lim].
    const int pos = row % nq;
    const int raw_lim = causal_offset >= 0 ? causal_offset + pos : n_kv - 1;
    const int lim = min(raw_lim, n_kv - 1);
    const int first = window > 0 ? raw_lim - window + 1 : 0;

    // The block's keys [lo, hi]: the union of its rows' ranges (rows of two query heads
    // span every position), then this split's share in whole tiles.
    const int r_last = min(r0 + nwarps, rows) - 1;
    const bool one_head = r0 / nq == r_last / nq;
    const int p_lo = one_head ? r0 % nq : 0, p_hi = one_head ? r_last % nq : nq - 1;
    const int hi = causal_offset >= 0 ? min(n_kv - 1, causal_offset + p_hi) : n_kv - 1;
    const int lo = window > 0 ? max(0, causal_offset + p_lo - window + 1) : 0;
    const int ntiles = hi >= lo ? (hi - lo) / ATTN_TILE + 1 : 0;
    const int per_split = (ntiles + gridDim.z - 1) / gridDim.z;
    const int t_begin = blockIdx.z * per_split, t_end = min(ntiles, t_begin + per_split);

    for (int d = lane; d < head_dim; d += WARP_SIZE) {
        s_q[warp * ATTN_MAX_D + d] = valid ? q[((long long) bk * rows + row) * head_dim + d] : 0.0f;
    }
    float acc[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        acc[t] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;

    for (int tile = t_begin; tile < t_end; ++tile) {
        const int j0 = lo + tile * ATTN_TILE;
        __syncthreads();  // every warp is done with the previous tile (and s_q is written)
        for (int i = tid; i < ATTN_TILE * head_dim; i += nthreads) {
            const int jj = i / head_dim, d = i - jj * head_dim;
            s_k[jj * ld + d] = j0 + jj <= hi ? to_f32(ld_global(kb + (j0 + jj) * kv_stride_s + d)) : 0.0f;
        }
        __syncthreads();

        const int j = j0 + lane;
        const bool seen = valid && j >= first && j <= lim && (!mask || mask[j] != 0.0f);
        float s = NEG_INF;
        if (seen) {
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) {
                dot += s_q[warp * ATTN_MAX_D + d] * s_k[lane * ld + d];
            }
            s = dot * scale;
            if (softcap > 0.0f) {
                s = softcap * tanhf(s / softcap);
            }
        }
        const float m_new = fmaxf(m, warp_reduce_max(s));
        const float p = seen ? expf(s - m_new) : 0.0f;
        const float corr = m == NEG_INF ? 0.0f : expf(m - m_new);
        l = l * corr + warp_reduce_sum(p);
        m = m_new;
        s_p[warp * ATTN_TILE + lane] = p;
        __syncwarp();
#pragma unroll
        for (int t = 0; t < PER_LANE; ++t) {
            acc[t] *= corr;
        }
        for (int jj = 0; jj < ATTN_TILE; ++jj) {
            const float pj = s_p[warp * ATTN_TILE + jj];
            if (pj == 0.0f) {  // hidden (or underflowed) key; uniform across the warp
                continue;
            }
            const T * vj = vb + (j0 + jj) * kv_stride_s;
#pragma unroll
            for (int t = 0; t < PER_LANE; ++t) {
                const int d = lane + t * WARP_SIZE;
                if (d < head_dim) {
                    acc[t] += pj * to_f32(ld_global(vj + d));
                }
            }
        }
    }

    if (!valid) {
        return;
    }
    const long long pr = ((long long) bk * gridDim.z + blockIdx.z) * rows + row;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float * dst = gridDim.z == 1 ? out + ((long long) bk * rows + row) * head_dim : part + pr * head_dim;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const int d = lane + t * WARP_SIZE;
        if (d < head_dim) {
            dst[d] = gridDim.z == 1 ? acc[t] * inv : acc[t];
        }
    }
    if (gridDim.z > 1 && lane == 0) {
        part_ml[2 * pr] = m;
        part_ml[2 * pr + 1] = l;
    }
}


// The kernels over a cache of element type T: attn_<name> (arguments as in ops.attention,
// strides in elements) and attn_<name>_pos, the same for a captured decode step (CUDA
// graph): the new tokens' first position is read from the device (*pos, written before each
// replay), so one launch serves every step: causal_offset = *pos and n_kv = *pos + nq. The
// grid is planned for the largest n_kv the graph serves; splits past the keys see no tile
// and weigh nothing in attn_combine_f32.
#define ATTN_KERNELS(T, name)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) attn_##name(                               \
            const float * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,     \
            float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,   \
            const int head_dim, const int rows, const int nq, const int n_kv, const int kv_heads, \
            const long long kv_stride_b, const long long kv_stride_h,                             \
            const long long kv_stride_s, const float scale, const float softcap,                  \
            const int causal_offset, const int window, const float * __restrict__ key_mask,       \
            const long long mask_stride) {                                                        \
        attn_block(q, k, v, out, part, part_ml, head_dim, rows, nq, n_kv, kv_heads, kv_stride_b, \
                   kv_stride_h, kv_stride_s, scale, softcap, causal_offset, window, key_mask,    \
                   mask_stride);                                                                  \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(256) attn_##name##_pos(                         \
            const float * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,     \
            float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,   \
            const int head_dim, const int rows, const int nq, const int * __restrict__ pos,       \
            const int kv_heads, const long long kv_stride_b, const long long kv_stride_h,         \
            const long long kv_stride_s, const float scale, const float softcap,                  \
            const int window) {                                                                   \
        const int p = *pos;                                                                       \
        attn_block(q, k, v, out, part, part_ml, head_dim, rows, nq, p + nq, kv_heads,            \
                   kv_stride_b, kv_stride_h, kv_stride_s, scale, softcap, p, window, nullptr, 0); \
    }
