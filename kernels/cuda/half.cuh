// Half-precision loads and stores, for the modules that read or write half (the GGML block
// scales, F16 weights, float16 outputs). The only header that includes cuda_fp16.h.
#pragma once

#include "common.cuh"

#if !defined(INFERDESK_EMULATOR)
#include <cuda_fp16.h>
#endif

static __device__ __forceinline__ float load_f16(const uint8_t * p) {
    return __half2float(__ushort_as_half(ld_global((const uint16_t *) p)));
}

static __device__ __forceinline__ float to_f32(const __half v) { return __half2float(v); }
static __device__ __forceinline__ void widen_word(const __half *, const uint32_t w, float * out) {
    out[0] = __half2float(__ushort_as_half((unsigned short) (w & 0xFFFFu)));
    out[1] = __half2float(__ushort_as_half((unsigned short) (w >> 16)));
}
static __device__ __forceinline__ void store_f32(__half * p, const float v) {
    st_global(p, __float2half_rn(v));
}
