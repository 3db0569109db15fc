// The rotation of RoPE (rope.cu), shared by the kernels that rotate as they store: the
// decode step's rope_kv_* (kv_store.cuh) rotates q and k as it writes q and the KV cache row.
#pragma once

#include "common.cuh"

// Pair i of a head_dim-wide head vector at position pos turns by pos * theta^(-2i/D) / ff[i]
// (ff: the optional freq_factors, scaled RoPE; null means 1): (a, b) <- (a c - b s, a s + b c).
static __device__ __forceinline__ void rope_rotate(
        float & a, float & b, const int pos, const int i, const int head_dim, const float theta,
        const float * __restrict__ freq_factors) {
    const float ff = freq_factors ? freq_factors[i] : 1.0f;
    const float freq = powf(theta, -2.0f * i / head_dim) / ff;
    float s, c;
    sincosf(pos * freq, &s, &c);
    const float a0 = a;
    a = a0 * c - b * s;
    b = a0 * s + b * c;
}
