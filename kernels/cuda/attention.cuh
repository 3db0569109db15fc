// The body of the attention kernels (attention.cu: float32 K/V; kv_f16.cu: half K/V),
// templated on the cache's element type T. Scores, softmax and the accumulator are float32
// whatever T is: K/V values are widened with to_f32 as they are read (common.cuh for float,
// half.cuh for half), so a half cache halves the bytes read and nothing else changes.
#pragma once

#include "q8_1.cuh"

// Decode's output as the o_proj mat-vec's q8_1 row (xq not null; one query per row, nq =
// 1, head_dim % 32 == 0, ops checks): row r of kv-head block bk is query head
// (bk % kv_heads) * rows + r of sequence bk / kv_heads, so its values d0..d0 + 31 are one
// q8_1 block of that sequence's row (heads * head_dim values, xq_stride bytes apart). A
// warp writes it (store_q8_1_block: the bytes of quantize_q8_1 of the float row), which
// saves the quantize_q8_1 launch between attention and o_proj.
static __device__ __forceinline__ uint8_t * attn_q8_1_block(
        uint8_t * xq, const long long xq_stride, const int bk, const int kv_heads, const int rows,
        const int r, const int head_dim, const int d0) {
    return xq + (bk / kv_heads) * xq_stride +
           ((long long) ((bk % kv_heads) * rows + r) * head_dim + d0) / 32 * Q8_1_BYTES;
}

#define ATTN_MAX_D 256    // head_dim limit: 8 accumulator values per lane
#define ATTN_TILE 32      // keys per shared-memory tile: one key per lane when scoring
#define ATTN_MAX_ROWS 8   // query rows per block (one per warp): blockDim.y limit

// The parameters of the block functions below and of the kernels over a cache (`name` of
// ATTN_ENTRY_POINTS): ops.attention's arguments, strides in elements.
#define ATTN_BLOCK_PARAMS(T)                                                                       \
    const float * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,              \
    float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,             \
    const int head_dim, const int rows, const int nq, const int n_kv, const int kv_heads,          \
    const long long kv_stride_b, const long long kv_stride_h, const long long kv_stride_s,         \
    const float scale, const float softcap, const int causal_offset, const int window,             \
    const float * __restrict__ key_mask, const long long mask_stride,                              \
    uint8_t * __restrict__ xq, const long long xq_stride

// Block (32, rows <= 8), grid (row tiles, batch * kv_heads, splits). Warp w owns query row
// blockIdx.x * blockDim.y + w. Per tile of 32 keys: the block stages K in shared memory
// (rows padded by one float, so lane j reading key j's row hits 32 distinct banks); lane j
// scores key j against its warp's query; the warp updates its running max m and sum l and
// rescales its accumulator (head_dim split across lanes) by exp(m_old - m_new); then adds
// p_j * V[j], reading V rows straight from global memory, coalesced across the lanes.
template <typename T>
static __device__ __forceinline__ void attn_block(
        ATTN_BLOCK_PARAMS(T)) {
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
        if (d < head_dim && xq && gridDim.z == 1) {  // uniform: head_dim % 32 == 0
            store_q8_1_block(acc[t] * inv, attn_q8_1_block(xq, xq_stride, bk, kv_heads, rows,
                                                           row, head_dim, d - lane));
        } else if (d < head_dim) {
            dst[d] = gridDim.z == 1 ? acc[t] * inv : acc[t];
        }
    }
    if (gridDim.z > 1 && lane == 0) {
        part_ml[2 * pr] = m;
        part_ml[2 * pr + 1] = l;
    }
}


// The kernels over a cache of element type T: `name` (arguments as in ops.attention,
// strides in elements) and `name_pos`, the same for a captured decode step (CUDA
// graph): the new tokens' first position is read from the device (*pos, written before each
// replay), so one launch serves every step: causal_offset = *pos and n_kv = *pos + nq. The
// grid is planned for the largest n_kv the graph serves; splits past the keys see no tile
// and weigh nothing in attn_combine_f32.
//
// `name_slot`: `name_pos` for a batched step's graph, whose rows are whichever sequences
// fill them at a replay: the cache is read through `slot`, four int64 in device memory
// written before each replay (K's address, its stride over heads, V's address, the same
// stride), not passed. A kernel of its own, so the `_pos` kernels keep their registers.
#define ATTN_SLOT_PARAMS                                                                           \
    const float * __restrict__ q, const long long * __restrict__ slot, float * __restrict__ out,   \
    float * __restrict__ part, float * __restrict__ part_ml, const int head_dim, const int rows,   \
    const int nq, const int * __restrict__ pos, const int kv_heads, const long long kv_stride_b,   \
    const long long kv_stride_s, const float scale, const float softcap, const int window,         \
    uint8_t * __restrict__ xq, const long long xq_stride

// The three entry points of one block function (`...`: attn_block<T> or
// attn_vec_block<T, E>) over a cache of element type T, with __launch_bounds__ BOUNDS.
#define ATTN_ENTRY_POINTS(BOUNDS, T, name, name_pos, name_slot, ...)                               \
    extern "C" __global__ void BOUNDS name(ATTN_BLOCK_PARAMS(T)) {                                 \
        __VA_ARGS__(q, k, v, out, part, part_ml, head_dim, rows, nq, n_kv, kv_heads, kv_stride_b,  \
                    kv_stride_h, kv_stride_s, scale, softcap, causal_offset, window, key_mask,     \
                    mask_stride, xq, xq_stride);                                                   \
    }                                                                                              \
    extern "C" __global__ void BOUNDS name_pos(                                                    \
            const float * __restrict__ q, const T * __restrict__ k, const T * __restrict__ v,      \
            float * __restrict__ out, float * __restrict__ part, float * __restrict__ part_ml,     \
            const int head_dim, const int rows, const int nq, const int * __restrict__ pos,        \
            const int kv_heads, const long long kv_stride_b, const long long kv_stride_h,          \
            const long long kv_stride_s, const float scale, const float softcap,                   \
            const int window, uint8_t * __restrict__ xq, const long long xq_stride) {              \
        const int p = *pos;                                                                        \
        __VA_ARGS__(q, k, v, out, part, part_ml, head_dim, rows, nq, p + nq, kv_heads,             \
                    kv_stride_b, kv_stride_h, kv_stride_s, scale, softcap, p, window, nullptr, 0,  \
                    xq, xq_stride);                                                                \
    }                                                                                              \
    extern "C" __global__ void BOUNDS name_slot(ATTN_SLOT_PARAMS) {                                \
        const int p = *pos;                                                                        \
        __VA_ARGS__(q, (const T *) slot[0], (const T *) slot[2], out, part, part_ml, head_dim,     \
                    rows, nq, p + nq, kv_heads, kv_stride_b, slot[1], kv_stride_s, scale,          \
                    softcap, p, window, nullptr, 0, xq, xq_stride);                                \
    }

#define ATTN_KERNELS(T, name, name_pos, name_slot)                                                 \
    ATTN_ENTRY_POINTS(__launch_bounds__(256), T, name, name_pos, name_slot, attn_block<T>)


// --- decode attention (flash-decoding): attn_vec_* -----------------------------------------
// For blocks of at most ATTN_MAX_ROWS query rows (decode: the query heads of one kv head),
// every row in one block. Block (32, W warps), grid (1, batch * kv_heads, splits). The
// split's keys go to the warps in chunks of KU keys, round robin, so a model without GQA
// (one row) still has W warps reading. Lane l owns E consecutive elements [l*E, l*E + E)
// of head_dim (E * 32 >= head_dim, head_dim % E == 0): a chunk is KU rows of K and of V,
// each lane loading its E elements of every row as 16-, 8- or 4-byte words, all 2 * KU
// loads issued before the first is used (KU * E = 32 values of K and of V in flight per
// lane). Scores: the lanes' partial dot products, summed across the warp by shuffles. Each
// warp keeps an online softmax (max m, sum l, accumulator) per row; at the end the warps
// merge theirs through shared memory, as attn_combine_f32 merges splits. Dynamic shared
// memory: the rows' queries (rows * head_dim floats) and the merge (W * rows * (head_dim
// + 2) floats), plan.plan_attention's shared_bytes.
#define ATTN_VEC_KEYS_IN_FLIGHT 32  // KU * E: values of K (and of V) each lane loads per chunk

// N consecutive T at p (N * sizeof(T) bytes: 4, 8, 16 or 32, naturally aligned to min(16,
// that)) as 32-bit words: one 4-, 8- or 16-byte load, or two 16-byte ones. Kept as loaded
// (a 16-bit cache's words hold two values each: half the registers of float32) and widened
// at use by widen (widen_word: common.cuh, half.cuh, bf16.cuh).
template <typename T, int N>
struct kv_words {
    static constexpr int BYTES = N * (int) sizeof(T), COUNT = BYTES / 4;
    uint32_t w[COUNT];
};

template <typename T, int N>
static __device__ __forceinline__ void load_words(const T * p, kv_words<T, N> & out) {
    constexpr int BYTES = kv_words<T, N>::BYTES;
    if constexpr (BYTES >= 16) {
#pragma unroll
        for (int c = 0; c < BYTES / 16; ++c) {
            const uint4 u = ld_global((const uint4 *) p + c);
            out.w[4 * c] = u.x, out.w[4 * c + 1] = u.y, out.w[4 * c + 2] = u.z, out.w[4 * c + 3] = u.w;
        }
    } else if constexpr (BYTES == 8) {
        const uint2 u = ld_global((const uint2 *) p);
        out.w[0] = u.x, out.w[1] = u.y;
    } else {
        static_assert(BYTES == 4, "a K/V slice of 4, 8, 16 or 32 bytes");
        out.w[0] = ld_global((const uint32_t *) p);
    }
}

template <typename T, int N>
static __device__ __forceinline__ void widen(const kv_words<T, N> & in, float * out) {
    constexpr int PER_WORD = 4 / (int) sizeof(T);
#pragma unroll
    for (int i = 0; i < kv_words<T, N>::COUNT; ++i) {
        widen_word((const T *) nullptr, in.w[i], out + i * PER_WORD);
    }
}

template <typename T, int E>
static __device__ __forceinline__ void attn_vec_block(
        ATTN_BLOCK_PARAMS(T)) {
    constexpr int KU = ATTN_VEC_KEYS_IN_FLIGHT / E;  // keys per chunk
    DYN_SHARED_F32(s_q);  // rows * head_dim, then the merge: W * rows * (head_dim + 2)
    float * s_red = s_q + rows * head_dim;

    const int lane = threadIdx.x, warp = threadIdx.y, nwarps = blockDim.y;
    const int bk = blockIdx.y, b = bk / kv_heads, kvh = bk % kv_heads;
    const T * kb = k + b * kv_stride_b + kvh * kv_stride_h;
    const T * vb = v + b * kv_stride_b + kvh * kv_stride_h;
    const float * mask = key_mask ? key_mask + b * mask_stride : nullptr;
    const int d0 = lane * E;
    const bool owns = d0 < head_dim;  // head_dim % E == 0: a lane owns all E or none

    // The block's keys [lo, hi] (all its rows' ranges), this split's share in whole tiles.
    const int hi = causal_offset >= 0 ? min(n_kv - 1, causal_offset + nq - 1) : n_kv - 1;
    const int lo = window > 0 ? max(0, causal_offset - window + 1) : 0;
    const int ntiles = hi >= lo ? (hi - lo) / ATTN_TILE + 1 : 0;
    const int per_split = (ntiles + gridDim.z - 1) / gridDim.z;
    const int t_begin = blockIdx.z * per_split, t_end = min(ntiles, t_begin + per_split);
    const int k_begin = lo + t_begin * ATTN_TILE, k_end = min(hi + 1, lo + t_end * ATTN_TILE);

    // Row r's running state in warp w's slot of the merge area, s_red + (w * rows + r) *
    // (head_dim + 2): the accumulator (lane l's E values at l * E), then m and l. Every lane
    // computes the same m and l (butterfly sums are equal on every lane); lane 0 stores them.
    const int ld = head_dim + 2;
    float * mine = s_red + warp * rows * ld;
    for (int i = warp * WARP_SIZE + lane; i < rows * head_dim; i += nwarps * WARP_SIZE) {
        s_q[i] = ld_global(q + (long long) bk * rows * head_dim + i);
    }
    for (int i = lane; i < rows * ld; i += WARP_SIZE) {
        const int c = i % ld;
        mine[i] = c == head_dim ? NEG_INF : 0.0f;
    }
    __syncthreads();

    for (int j0 = k_begin + warp * KU; j0 < k_end; j0 += nwarps * KU) {
        kv_words<T, E> kx[KU], vx[KU];
#pragma unroll
        for (int u = 0; u < KU; ++u) {  // every load of the chunk before any use
            if (owns && j0 + u < k_end) {
                load_words(kb + (j0 + u) * kv_stride_s + d0, kx[u]);
                load_words(vb + (j0 + u) * kv_stride_s + d0, vx[u]);
            } else {  // zero bits: 0.0 in every type
#pragma unroll
                for (int i = 0; i < kv_words<T, E>::COUNT; ++i) {
                    kx[u].w[i] = vx[u].w[i] = 0u;
                }
            }
        }
        bool key_on[KU];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            key_on[u] = j0 + u < k_end && (!mask || ld_global(mask + j0 + u) != 0.0f);
        }
#pragma unroll 1
        for (int r = 0; r < rows; ++r) {
            // Row r's visible keys [first, lim] (positions run along the row's nq queries).
            const int pos = r % nq;
            const int raw_lim = causal_offset >= 0 ? causal_offset + pos : n_kv - 1;
            const int lim = min(raw_lim, n_kv - 1);
            const int first = window > 0 ? raw_lim - window + 1 : 0;
            float qr[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                qr[e] = owns ? s_q[r * head_dim + d0 + e] : 0.0f;
            }
            float s[KU];
            float s_max = NEG_INF;
#pragma unroll
            for (int u = 0; u < KU; ++u) {
                float kf[E];
                widen(kx[u], kf);
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    dot += qr[e] * kf[e];
                }
                dot = warp_reduce_sum(dot) * scale;
                if (softcap > 0.0f) {
                    dot = softcap * tanhf(dot / softcap);
                }
                const int j = j0 + u;
                s[u] = key_on[u] && j >= first && j <= lim ? dot : NEG_INF;
                s_max = fmaxf(s_max, s[u]);
            }
            float * st = mine + r * ld;
            const float m_old = st[head_dim], m_new = fmaxf(m_old, s_max);
            if (m_new == NEG_INF) {  // nothing visible yet: uniform across the warp
                continue;
            }
            const float corr = m_old == NEG_INF ? 0.0f : expf(m_old - m_new);
            float l_new = st[head_dim + 1] * corr;
            float a[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                a[e] = owns ? st[d0 + e] * corr : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < KU; ++u) {
                const float p = s[u] == NEG_INF ? 0.0f : expf(s[u] - m_new);
                l_new += p;
                float vf[E];
                widen(vx[u], vf);
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    a[e] += p * vf[e];
                }
            }
            if (owns) {
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    st[d0 + e] = a[e];
                }
            }
            __syncwarp();  // every lane has read m and l
            if (lane == 0) {
                st[head_dim] = m_new;
                st[head_dim + 1] = l_new;
            }
            __syncwarp();
        }
    }
    __syncthreads();  // every warp's state is final
    for (int r = warp; r < rows; r += nwarps) {
        float mx = NEG_INF;
        for (int w = 0; w < nwarps; ++w) {
            mx = fmaxf(mx, s_red[(w * rows + r) * ld + head_dim]);
        }
        float total = 0.0f;
        for (int w = 0; w < nwarps; ++w) {
            const float * src = s_red + (w * rows + r) * ld;
            total += src[head_dim] == NEG_INF ? 0.0f : src[head_dim + 1] * expf(src[head_dim] - mx);
        }
        const long long pr = ((long long) bk * gridDim.z + blockIdx.z) * rows + r;
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        float * o = gridDim.z == 1 ? out + ((long long) bk * rows + r) * head_dim : part + pr * head_dim;
        for (int d = lane; d < head_dim; d += WARP_SIZE) {
            float sum = 0.0f;
            for (int w = 0; w < nwarps; ++w) {
                const float * src = s_red + (w * rows + r) * ld;
                sum += src[head_dim] == NEG_INF ? 0.0f : src[d] * expf(src[head_dim] - mx);
            }
            if (xq && gridDim.z == 1) {  // uniform: head_dim % 32 == 0
                store_q8_1_block(sum * inv, attn_q8_1_block(xq, xq_stride, bk, kv_heads, rows, r,
                                                            head_dim, d - lane));
            } else {
                st_global(o + d, gridDim.z == 1 ? sum * inv : sum);
            }
        }
        if (gridDim.z > 1 && lane == 0) {
            st_global(part_ml + 2 * pr, mx);
            st_global(part_ml + 2 * pr + 1, total);
        }
    }
}

// attn_vec kernels over a cache of element type T, E head_dim elements per lane (head_dim
// up to 32 * E): `name` for ops.attention's arguments, `name_pos` for a captured decode
// step and `name_slot` for a batched step's (as attn_<name>_pos and _slot above). The
// names are spelled out where this is used.
#define ATTN_VEC_KERNELS(T, E, name, name_pos, name_slot)                                          \
    ATTN_ENTRY_POINTS(__launch_bounds__(128, 4), T, name, name_pos, name_slot,                     \
                      attn_vec_block<T, E>)
