// q8_1: the activation blocks of the integer mat-vec (mmv.cu mul_mat_vec_q_*; quants.cuh
// reads them).
// 32 consecutive x values as int8 q[i] = round(x[i] / d), d = max|x| / 127, with two halves
// in front: d and s = d * sum(q). 36 bytes, 4-byte aligned. Written by quantize_q8_1
// (mmv.cu) and by the kernels that end in it instead of a float row: rms_norm_q8_1
// (norm.cu), silu_mul_q8_1 and gelu_tanh_mul_q8_1 (unary.cu). A q8_1 row of ncols values is
// ncols / 32 blocks, padded to 16 bytes (table.q8_1_row_bytes).
#pragma once
// No cuda_fp16.h: norm.cu and unary.cu compile with NVRTC alone (the scales' half bits are
// made by f16_bits below); quants.cuh reads the blocks.
#include "common.cuh"

#define Q8_1_BYTES 36

// float32 -> IEEE half bits, rounded to nearest even (as CUDA's float-to-half): overflow to inf,
// subnormal halves exact, NaN to a quiet NaN.
static __device__ __forceinline__ uint32_t f16_bits(const float f) {
    const uint32_t x = __float_as_uint(f);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {
        return sign | 0x7FFFu;
    }
    if (a >= 0x477FF000u) {  // >= 65520: rounds past 65504, the largest half
        return sign | 0x7C00u;
    }
    if (a >= 0x38800000u) {  // a normal half: drop 13 mantissa bits, rebias 127 -> 15
        const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
        return sign | ((r >> 13) - (112u << 10));
    }
    // a subnormal half (or zero): whole units of 2^-24; the scaling by 2^24 is exact
    return sign | (uint32_t) rintf(__uint_as_float(a) * 16777216.0f);
}

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
        st_global((uint32_t *) out, f16_bits(d) | (f16_bits(d * sum) << 16));
    }
}
