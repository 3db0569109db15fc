// Attention over the device KV cache, prefill and decode alike, with an online softmax
// (flash-attention): no score matrix is ever stored, so scratch does not grow with t^2.
//
// Queries: q and out are (batch * kv_heads, rows, head_dim) contiguous, where the rows of
// kv head g are its `group` query heads' nq positions each (row = head_in_group * nq + i):
// exactly a contiguous (batch, heads, nq, head_dim) array, since query head h reads kv
// head h / group (GQA). Keys and values are (batch, kv_heads, n_kv, head_dim) with any
// strides over batch/head/position and contiguous head_dim, so a narrowed view of a
// preallocated cache needs no copy. Here K/V are float32; kv_f16.cu has the same kernels
// (attention.cuh) over a half cache, sharing attn_combine_f32.
//
// Query i may see key j iff
//   j <= causal_offset + i          (when causal_offset >= 0)
//   j > causal_offset + i - window  (when window > 0: sliding-window layers)
//   key_mask[batch, j] != 0         (when a mask is given: padding)
// A row with no visible key becomes zeros. Scores are s = q.k * scale, then
// softcap * tanh(s / softcap) when softcap > 0 (Gemma 2).
//
// Split-K (flash-decoding): grid.z splits each block's keys into gridDim.z ranges of whole
// tiles. With one split the kernel writes the normalised output; with several it writes
// each range's unnormalised accumulator and its (max, sum) to `part`/`part_ml`, and
// attn_combine_f32 merges them. That is what fills a GPU at batch 1, where the blocks of
// one token (kv_heads of them) would leave most SMs idle.
#include "attention.cuh"

ATTN_KERNELS(float, attn_f32, attn_f32_pos, attn_f32_slot)  // see attention.cuh
// Decode (at most 8 query rows a block), head_dim up to 64, 128, 256: see attention.cuh
ATTN_VEC_KERNELS(float, 2, attn_vec_f32_e2, attn_vec_f32_e2_pos, attn_vec_f32_e2_slot)
ATTN_VEC_KERNELS(float, 4, attn_vec_f32_e4, attn_vec_f32_e4_pos, attn_vec_f32_e4_slot)
ATTN_VEC_KERNELS(float, 8, attn_vec_f32_e8, attn_vec_f32_e8_pos, attn_vec_f32_e8_slot)

// Merge the splits of attn_f32: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M),
// M = max_s m_s; a split that saw no key has m_s = -inf and weighs nothing. With xq, the
// rows go out as o_proj's q8_1 row instead (attn_q8_1_block, attention.cuh).
// Block (32, rows <= 8), grid (row tiles, batch * kv_heads); warp w owns one row.
extern "C" __global__ void __launch_bounds__(256) attn_combine_f32(
        const float * __restrict__ part, const float * __restrict__ part_ml,
        float * __restrict__ out, const int head_dim, const int rows, const int nsplit,
        const int kv_heads, uint8_t * __restrict__ xq, const long long xq_stride) {
    const int row = blockIdx.x * blockDim.y + threadIdx.y, bk = blockIdx.y;
    if (row >= rows) {
        return;  // the whole warp
    }
    const float * ml = part_ml + 2 * ((long long) bk * nsplit * rows + row);
    const long long split_stride = (long long) rows;  // in rows of part / part_ml
    float mx = NEG_INF;
    for (int s = 0; s < nsplit; ++s) {
        mx = fmaxf(mx, ml[2 * s * split_stride]);
    }
    float total = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ms = ml[2 * s * split_stride];
        total += ms == NEG_INF ? 0.0f : ml[2 * s * split_stride + 1] * expf(ms - mx);
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const float * src = part + ((long long) bk * nsplit * rows + row) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += WARP_SIZE) {
        float o = 0.0f;
        for (int s = 0; s < nsplit; ++s) {
            const float ms = ml[2 * s * split_stride];
            o += ms == NEG_INF ? 0.0f : src[s * split_stride * head_dim + d] * expf(ms - mx);
        }
        if (xq) {  // uniform: head_dim % 32 == 0
            store_q8_1_block(o * inv, attn_q8_1_block(xq, xq_stride, bk, kv_heads, rows, row,
                                                      head_dim, d - threadIdx.x));
        } else {
            out[((long long) bk * rows + row) * head_dim + d] = o * inv;
        }
    }
}
