// bfloat16 storage: the high 16 bits of a float32 (float32's range, 8 mantissa bits), held
// as uint16 bit patterns (NumPy and CuPy have no bfloat16; ops.BF16). Used by the bfloat16
// KV cache (kv_bf16.cu) and the bfloat16 prefill scratch (dequant.cu). No CUDA header:
// widening is a shift and rounding is integer arithmetic, so NVRTC needs no -I.
#pragma once

#include "common.cuh"

struct bf16_t {
    uint16_t bits;
};

static __device__ __forceinline__ float to_f32(const bf16_t v) {
    return __uint_as_float((uint32_t) v.bits << 16);
}
static __device__ __forceinline__ void widen_word(const bf16_t *, const uint32_t w, float * out) {
    out[0] = __uint_as_float(w << 16);
    out[1] = __uint_as_float(w & 0xFFFF0000u);
}

// float32 -> bfloat16 bits, rounded to nearest even, overflow to inf, NaN to the quiet NaN
// 0x7FC0: ops.to_bf16_bits bit for bit.
static __device__ __forceinline__ uint32_t bf16_bits(const float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

static __device__ __forceinline__ void store_f32(bf16_t * p, const float v) {
    bf16_t out;
    out.bits = (uint16_t) bf16_bits(v);
    st_global(p, out);
}
