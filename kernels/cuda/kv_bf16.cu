// The bfloat16 KV cache mode (CudaBackend(kv_dtype="bfloat16")): attention over bfloat16
// K/V and the captured decode step's row write, as kv_f16.cu does for half. bfloat16 is the
// high 16 bits of a float32 (quants.cuh reads BF16 weights the same way): float32's range,
// 8 bits of mantissa (relative rounding 2^-9, four times half's). The host stores it as
// uint16 bit patterns (ops.KV_BF16). No CUDA header is needed: widening is a shift.
#include "common.cuh"

struct kv_bf16 {
    uint16_t bits;
};

static __device__ __forceinline__ float to_f32(const kv_bf16 v) {
    return __uint_as_float((uint32_t) v.bits << 16);
}

// Rounded to nearest even, NaN to the quiet NaN 0x7FC0: ops.to_bf16_bits bit for bit.
static __device__ __forceinline__ void store_f32(kv_bf16 * p, const float v) {
    const uint32_t u = __float_as_uint(v);
    const uint32_t r = (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FC0u
                                                         : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    kv_bf16 out;
    out.bits = (uint16_t) r;
    st_global(p, out);
}

#include "attention.cuh"
#include "kv_store.cuh"

ATTN_KERNELS(kv_bf16, kv_bf16)  // attn_kv_bf16, attn_kv_bf16_pos: see attention.cuh
KV_STORE_KERNEL(kv_bf16, bf16)  // kv_store_bf16: see kv_store.cuh
