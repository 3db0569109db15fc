// GGML block formats, one tag struct per type. The constants mirror kernels/cuda/table.py
// (a test reads them back through the type_info kernel):
//   QK    elements per block,
//   BYTES bytes per block,
//   EPT   elements one thread dequantizes: the whole block for the 32-element types, one
//         16-element sub-block for K-quants (their scales cover 16 or 32 elements, so a
//         16-element slice always has a single scale), one element for F32/F16.
// dq(b, sub, y) writes elements [sub*EPT, (sub+1)*EPT) of the block at b into y.
// Blocks are only 2-byte aligned (18, 22, 34, 110, 210 bytes): quants load as half-words.
#pragma once
#include "half.cuh"

struct t_f32 {
    static constexpr int QK = 1, BYTES = 4, EPT = 1;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) { y[0] = *(const float *) b; }
};

struct t_f16 {
    static constexpr int QK = 1, BYTES = 2, EPT = 1;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) { y[0] = load_f16(b); }
};

// Q4_0: d, 16 bytes of nibbles; low nibbles are elements 0-15, high nibbles 16-31.
struct t_q4_0 {
    static constexpr int QK = 32, BYTES = 18, EPT = 32;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b);
        const bytes16 qs = load_bytes16(b + 2);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = ((qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((qs[j] >> 4) - 8) * d;
        }
    }
};

// Q4_1: d, m, nibbles; x = q*d + m.
struct t_q4_1 {
    static constexpr int QK = 32, BYTES = 20, EPT = 32;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b), m = load_f16(b + 2);
        const bytes16 qs = load_bytes16(b + 4);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = (qs[j] & 0xF) * d + m;
            y[j + 16] = (qs[j] >> 4) * d + m;
        }
    }
};

static __device__ __forceinline__ uint32_t load_u32_b2(const uint8_t * p) {  // 2-aligned
    CHECK_ALIGNED(p, 2);
    return ((const uint16_t *) p)[0] | ((uint32_t) ((const uint16_t *) p)[1] << 16);
}

// Q5_0: d, 32 high bits (bit j is element j's fifth bit), nibbles; x = (q - 16)*d.
struct t_q5_0 {
    static constexpr int QK = 32, BYTES = 22, EPT = 32;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b);
        const uint32_t qh = load_u32_b2(b + 2);
        const bytes16 qs = load_bytes16(b + 6);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = ((int) ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16) * d;
            y[j + 16] = ((int) ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16) * d;
        }
    }
};

// Q5_1: d, m, high bits, nibbles; x = q*d + m.
struct t_q5_1 {
    static constexpr int QK = 32, BYTES = 24, EPT = 32;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b), m = load_f16(b + 2);
        const uint32_t qh = load_u32_b2(b + 4);
        const bytes16 qs = load_bytes16(b + 8);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) * d + m;
            y[j + 16] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) * d + m;
        }
    }
};

// Q8_0: d, 32 int8.
struct t_q8_0 {
    static constexpr int QK = 32, BYTES = 34, EPT = 32;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b);
        const bytes16 lo = load_bytes16(b + 2), hi = load_bytes16(b + 18);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = (int8_t) lo[j] * d;
            y[j + 16] = (int8_t) hi[j] * d;
        }
    }
};

// ---- K-quants: 256-element super-blocks; `sub` (0..15) picks 16 elements -----------------
// Within a 128-element half h, element e sits in byte (e % 32) of that half's 32 quant bytes,
// at bit shift 2*((e % 128) / 32) (2-bit types) or nibble (e % 64) / 32 (4-bit types).

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
struct t_q2_k {
    static constexpr int QK = 256, BYTES = 84, EPT = 16;
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b + 80), dmin = load_f16(b + 82);
        const int sc = b[sub];
        const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
        const bytes16 q = load_bytes16(b + 16 + (sub / 8) * 32 + (sub % 2) * 16);
        const int shift = 2 * ((sub % 8) / 2);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            y[l] = dl * ((q[l] >> shift) & 3) - ml;
        }
    }
};

// Q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, d; x = d*(sc-32)*(q2 - (high bit ? 0 : 4)).
struct t_q3_k {
    static constexpr int QK = 256, BYTES = 110, EPT = 16;
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const uint8_t * hmask = b;
        const uint8_t * raw = b + 96;
        const float d = load_f16(b + 108);
        const int lo = sub < 8 ? (raw[sub] & 0xF) : (raw[sub - 8] >> 4);
        const int hi = (raw[8 + sub % 4] >> (2 * (sub / 4))) & 3;
        const float dl = d * ((lo | (hi << 4)) - 32);
        const int h = sub / 8, j = (sub % 8) / 2, t0 = (sub % 2) * 16;
        const bytes16 q = load_bytes16(b + 32 + h * 32 + t0);
        const bytes16 hm = load_bytes16(hmask + t0);
        const int m = 1 << (h * 4 + j);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            y[l] = dl * ((int) ((q[l] >> (2 * j)) & 3) - ((hm[l] & m) ? 0 : 4));
        }
    }
};

// 6-bit scale and min number j (0..7) of Q4_K/Q5_K, packed in 12 bytes.
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t * q, int & sc, int & mn) {
    if (j < 4) {
        sc = q[j] & 63;
        mn = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K: d, dmin, scales[12], qs[128]; x = d*sc*q - dmin*m over 32-element groups.
struct t_q4_k {
    static constexpr int QK = 256, BYTES = 144, EPT = 16;
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b), dmin = load_f16(b + 2);
        int sc, mn;
        scale_min_k4(sub / 2, b + 4, sc, mn);
        const float dl = d * sc, ml = dmin * mn;
        const bytes16 q = load_bytes16(b + 16 + (sub / 4) * 32 + (sub % 2) * 16);
        const int shift = 4 * ((sub % 4) / 2);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            y[l] = dl * ((q[l] >> shift) & 0xF) - ml;
        }
    }
};

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of group g/nibble n is bit 2g+n.
struct t_q5_k {
    static constexpr int QK = 256, BYTES = 176, EPT = 16;
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b), dmin = load_f16(b + 2);
        int sc, mn;
        scale_min_k4(sub / 2, b + 4, sc, mn);
        const float dl = d * sc, ml = dmin * mn;
        const int g = sub / 4, nib = (sub % 4) / 2, l0 = (sub % 2) * 16;
        const bytes16 qh = load_bytes16(b + 16 + l0);
        const bytes16 q = load_bytes16(b + 48 + g * 32 + l0);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            const int v = ((q[l] >> (4 * nib)) & 0xF) | (((qh[l] >> (2 * g + nib)) & 1) << 4);
            y[l] = dl * v - ml;
        }
    }
};

// Q6_K: ql[128], qh[64], int8 scales[16], d; x = d*sc*(q6 - 32).
struct t_q6_k {
    static constexpr int QK = 256, BYTES = 210, EPT = 16;
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b + 208);
        const float dl = d * ((const int8_t *) (b + 192))[sub];
        const int n = sub / 8, k = (sub % 8) / 2, l0 = (sub % 2) * 16;
        const bytes16 ql = load_bytes16(b + n * 64 + l0 + 32 * (k & 1));
        const bytes16 qh = load_bytes16(b + 128 + n * 32 + l0);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            const int v = ((ql[l] >> (4 * (k >> 1))) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
            y[l] = dl * (v - 32);
        }
    }
};

// X(tag, name): every type the kernels are instantiated for.
#define FOR_EACH_TYPE(X) \
    X(t_f32, f32)        \
    X(t_f16, f16)        \
    X(t_q4_0, q4_0)      \
    X(t_q4_1, q4_1)      \
    X(t_q5_0, q5_0)      \
    X(t_q5_1, q5_1)      \
    X(t_q8_0, q8_0)      \
    X(t_q2_k, q2_k)      \
    X(t_q3_k, q3_k)      \
    X(t_q4_k, q4_k)      \
    X(t_q5_k, q5_k)      \
    X(t_q6_k, q6_k)
