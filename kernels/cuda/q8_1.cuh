// q8_1: the activation blocks of the integer mat-vec (mmv.cu mul_mat_vec_q_*).
// 32 consecutive x values as int8 q[i] = round(x[i] / d), d = max|x| / 127, with two halves
// in front: d and s = d * sum(q). 36 bytes, 4-byte aligned. Written by quantize_q8_1
// (mmv.cu) and by the kernels that end in it instead of a float row: rms_norm_q8_1
// (norm.cu), silu_mul_q8_1 and gelu_tanh_mul_q8_1 (unary.cu). A q8_1 row of ncols values is
// ncols / 32 blocks, padded to 16 bytes (table.q8_1_row_bytes).
#pragma once
#include "half.cuh"

#define Q8_1_BYTES 36

struct q8_1 {  // a staged q8_1 block: scales and the 8 ints of packed quants
    float d, s;
    int u[8];
    static __device__ __forceinline__ q8_1 read(const uint8_t * xb) {
        q8_1 r;
        r.d = load_f16(xb);
        r.s = load_f16(xb + 2);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            r.u[i] = ld_global((const int *) (xb + 4) + i);
        }
        return r;
    }
};

// The whole warp writes one q8_1 block at out: lane l holds value l of the 32. Every lane
// must call it (shuffles); the values are the float32 a float kernel would have stored, so
// a fused kernel's block equals quantize_q8_1 of that kernel's float output, bit for bit.
static __device__ __forceinline__ void store_q8_1_block(const float v, uint8_t * out) {
    const float amax = warp_reduce_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int) roundf(v / d);
    const float sum = warp_reduce_sum((float) q);  // |sum| <= 4064: exact in float
    st_global((int8_t *) out + 4 + threadIdx.x % WARP_SIZE, (int8_t) q);
    if (threadIdx.x % WARP_SIZE == 0) {
        const uint32_t ds = __half_as_ushort(__float2half_rn(d)) |
                            ((uint32_t) __half_as_ushort(__float2half_rn(d * sum)) << 16);
        st_global((uint32_t *) out, ds);
    }
}
