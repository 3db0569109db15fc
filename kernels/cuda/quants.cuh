// GGML block formats, one tag struct per type. The constants mirror kernels/cuda/table.py
// (a test reads them back through the type_info kernel):
//   QK    elements per block,
//   BYTES bytes per block,
//   EPT   elements one thread dequantizes: the whole block for the 32-element types, one
//         16-element sub-block for K-quants (their scales cover 16 or 32 elements, so a
//         16-element slice always has a single scale), one element for F32/F16.
// dq(b, sub, y) writes elements [sub*EPT, (sub+1)*EPT) of the block at b into y.
// Types with DP4A = true also have vdot(b, g, xb): the dot product of their 32-element group
// g (0 .. QK/32-1) with the q8_1 block xb (q8_1.cuh), integer products by __dp4a and the float
// scales applied once at the end. b and xb point to shared memory (mmv.cu stages them).
// Blocks are only 2-byte aligned (18, 22, 34, 110, 210 bytes): quants load as half-words.
#pragma once

#include "half.cuh"
#include "q8_1.cuh"

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

// Four weight bytes as one int, from an address 2- or 4-byte aligned.
static __device__ __forceinline__ int int_b2(const uint8_t * p) {
    return ld_global((const uint16_t *) p) | ((int) ld_global((const uint16_t *) p + 1) << 16);
}
static __device__ __forceinline__ int int_b4(const uint8_t * p) {
    return ld_global((const int *) p);
}

// Bits 0..3 of t spread to bit 4 of each byte (the fifth bit of 5-bit quants).
static __device__ __forceinline__ int spread4(const uint32_t t) {
    return ((t & 1) << 4) | ((t & 2) << 11) | ((t & 4) << 18) | ((t & 8) << 25);
}

// Integer dot of a 32-element block of the legacy 4/5-bit types with a q8_1 block: v holds
// the 16 nibble bytes (low nibbles are elements 0-15, high nibbles 16-31), bit j of qh is
// element j's fifth bit (0 for 4-bit types).
static __device__ __forceinline__ int dot_nibbles(const int (&v)[4], const uint32_t qh,
                                                  const q8_1 & x) {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        sumi = __dp4a((v[i] & 0x0F0F0F0F) | spread4(qh >> (4 * i)), x.u[i], sumi);
        sumi = __dp4a(((v[i] >> 4) & 0x0F0F0F0F) | spread4(qh >> (4 * i + 16)), x.u[i + 4], sumi);
    }
    return sumi;
}

struct t_f32 {
    static constexpr int QK = 1, BYTES = 4, EPT = 1;
    static constexpr bool DP4A = false;
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        y[0] = ld_global((const float *) b);
    }
};

// The 16-bit float types: `of` widens one element's bits (the 16-bit mat-vec, mmv.cu).
struct t_f16 {
    static constexpr int QK = 1, BYTES = 2, EPT = 1;
    static constexpr bool DP4A = false;
    static __device__ __forceinline__ float of(const uint32_t bits) {
        return __half2float(__ushort_as_half((unsigned short) bits));
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) { y[0] = load_f16(b); }
};

// BF16: the high 16 bits of a float32 (exact widening).
struct t_bf16 {
    static constexpr int QK = 1, BYTES = 2, EPT = 1;
    static constexpr bool DP4A = false;
    static __device__ __forceinline__ float of(const uint32_t bits) {
        return __uint_as_float(bits << 16);
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        y[0] = of(ld_global((const uint16_t *) b));
    }
};

static __device__ __forceinline__ uint32_t load_u32_b2(const uint8_t * p) {  // 2-aligned
    return ld_global((const uint16_t *) p) | ((uint32_t) ld_global((const uint16_t *) p + 1) << 16);
}

// The legacy 4/5-bit types, one row each (ggml's block_q4_0 .. block_q5_1): a half scale d
// at byte 0, then a half min m (M > 0: its offset), 32 fifth bits qh (QH > 0: their
// offset; bit j is element j's fifth bit), and 16 bytes of nibbles at QS (low nibbles are
// elements 0-15, high nibbles 16-31). A code q stands for (q - OFF) * d without a min,
// q * d + m with one. Blocks of a 4-multiple size load 4 bytes at a time.
//   type   BYTES  M  QH  QS  OFF
//   Q4_0      18  0   0   2    8
//   Q4_1      20  2   0   4    0
//   Q5_0      22  0   2   6   16
//   Q5_1      24  2   4   8    0
template <int BYTES_, int M, int QH, int QS, int OFF>
struct t_legacy {
    static constexpr int QK = 32, BYTES = BYTES_, EPT = 32;
    static constexpr bool DP4A = true;
    static __device__ __forceinline__ int word(const uint8_t * p) {
        return BYTES % 4 == 0 ? int_b4(p) : int_b2(p);
    }
    static __device__ __forceinline__ uint32_t high_bits(const uint8_t * b) {
        return QH == 0 ? 0u : (BYTES % 4 == 0 ? (uint32_t) int_b4(b + QH) : load_u32_b2(b + QH));
    }
    // sum (q - OFF) * d * xq * dx = d * (dx * sum(q * xq) - OFF * s);
    // sum (q * d + m) * xq * dx = d * dx * sum(q * xq) + m * s
    // The integer sum is an operand of the expression, not a variable computed before d is
    // read: ptxas then keeps Q4_1's 4-row mat-vec at 32 registers on sm_90 (38 otherwise,
    // 48 warps an SM instead of 64), the other kernels as they are.
    static __device__ __forceinline__ float vdot(const uint8_t * b, int, const uint8_t * xb) {
        const q8_1 x = q8_1::read(xb);
        const int v[4] = {word(b + QS), word(b + QS + 4), word(b + QS + 8), word(b + QS + 12)};
        if constexpr (M > 0) {
            return load_f16(b) * x.d * dot_nibbles(v, high_bits(b), x) + load_f16(b + M) * x.s;
        } else {
            return load_f16(b) * (x.d * dot_nibbles(v, high_bits(b), x) - (float) OFF * x.s);
        }
    }
    static __device__ __forceinline__ float value(const int q, const float d, const float m) {
        if constexpr (M > 0) {
            return q * d + m;
        } else {
            return (q - OFF) * d;
        }
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int, float * y) {
        const float d = load_f16(b), m = M > 0 ? load_f16(b + M) : 0.0f;
        const uint32_t qh = QH == 0 ? 0u : load_u32_b2(b + QH);
        const bytes16 qs = load_bytes16(b + QS);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            y[j]      = value((qs[j] & 0xF) | (((qh >> j) & 1) << 4), d, m);
            y[j + 16] = value((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4), d, m);
        }
    }
};
using t_q4_0 = t_legacy<18, 0, 0, 2, 8>;
using t_q4_1 = t_legacy<20, 2, 0, 4, 0>;
using t_q5_0 = t_legacy<22, 0, 2, 6, 16>;
using t_q5_1 = t_legacy<24, 2, 4, 8, 0>;

// Q8_0: d, 32 int8.
struct t_q8_0 {
    static constexpr int QK = 32, BYTES = 34, EPT = 32;
    static constexpr bool DP4A = true;
    static __device__ __forceinline__ float vdot(const uint8_t * b, int, const uint8_t * xb) {
        const q8_1 x = q8_1::read(xb);
        int sumi = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            sumi = __dp4a(int_b2(b + 2 + 4 * i), x.u[i], sumi);
        }
        return load_f16(b) * x.d * sumi;
    }
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

// A 32-element group whose two 16-element halves have a scale each (Q2_K, Q6_K): the
// integer sums per half of codes q (8 words of 4 codes) times x, sum[h], and of x alone,
// sx[h] (__dp4a with ones: for a min or a code offset).
static __device__ __forceinline__ void dot_halves(const int (&q)[8], const q8_1 & x,
                                                  int (&sum)[2], int (&sx)[2]) {
    sum[0] = sum[1] = sx[0] = sx[1] = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        sum[i / 4] = __dp4a(q[i], x.u[i], sum[i / 4]);
        sx[i / 4] = __dp4a(0x01010101, x.u[i], sx[i / 4]);
    }
}

// vdot of such a type Q: Q::codes(b, g, i) is word i of group g's codes (4 codes of 0..63),
// Q::scaled(b, g, dx, sum, sx) applies the block's and the halves' scales.
template <typename Q>
static __device__ __forceinline__ float vdot_halves(const uint8_t * b, const int g,
                                                    const uint8_t * xb) {
    const q8_1 x = q8_1::read(xb);
    int q[8], sum[2], sx[2];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        q[i] = Q::codes(b, g, i);
    }
    dot_halves(q, x, sum, sx);
    return Q::scaled(b, g, x.d, sum, sx);
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
struct t_q2_k {
    static constexpr int QK = 256, BYTES = 84, EPT = 16;
    static constexpr bool DP4A = true;
    // group g = 4h + j: elements 128h + 32j + l, the 2-bit code at shift 2j of qs[32h + l];
    // a scale and a min per 16 of them, so two integer sums and two x sums (__dp4a with
    // ones): x = d*sc*q - dmin*m. Blocks are 84 bytes, so qs is 4-byte aligned in the stage.
    static __device__ __forceinline__ int codes(const uint8_t * b, const int g, const int i) {
        return (int_b4(b + 16 + 32 * (g / 4) + 4 * i) >> (2 * (g % 4))) & 0x03030303;
    }
    static __device__ __forceinline__ float scaled(const uint8_t * b, const int g, const float dx,
                                                   const int (&sum)[2], const int (&sx)[2]) {
        const int s0 = ld_global(b + 2 * g), s1 = ld_global(b + 2 * g + 1);
        return dx * (load_f16(b + 80) * (float) ((s0 & 0xF) * sum[0] + (s1 & 0xF) * sum[1]) -
                     load_f16(b + 82) * (float) ((s0 >> 4) * sx[0] + (s1 >> 4) * sx[1]));
    }
    static __device__ __forceinline__ float vdot(const uint8_t * b, int g, const uint8_t * xb) {
        return vdot_halves<t_q2_k>(b, g, xb);
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b + 80), dmin = load_f16(b + 82);
        const int sc = ld_global(b + sub);
        const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
        const bytes16 q = load_bytes16(b + 16 + (sub / 8) * 32 + (sub % 2) * 16);
        const int shift = 2 * ((sub % 8) / 2);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            y[l] = dl * ((q[l] >> shift) & 3) - ml;
        }
    }
};

// Q3_K scale number sub (0..15): 6 bits packed in 12 bytes at raw, stored with +32.
static __device__ __forceinline__ int scale_k3(const uint8_t * raw, const int sub) {
    const int lo = sub < 8 ? (ld_global(raw + sub) & 0xF) : (ld_global(raw + sub - 8) >> 4);
    const int hi = (ld_global(raw + 8 + sub % 4) >> (2 * (sub / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Q3_K: hmask[32], qs[64], 12 bytes of 6-bit scales, d; x = d*(sc-32)*(q2 - (high bit ? 0 : 4)).
struct t_q3_k {
    static constexpr int QK = 256, BYTES = 110, EPT = 16;
    static constexpr bool DP4A = true;
    // group g = 4h + j: the 2-bit code at shift 2j of qs[32h + l] and high bit g of hmask[l];
    // a scale per 16 elements. q - 4 * (high bit clear) is summed as two __dp4a, one of the
    // codes and one of the clear-bit flags (0 or 1 per byte), so no byte ever goes negative.
    static __device__ __forceinline__ float vdot(const uint8_t * b, int g, const uint8_t * xb) {
        const q8_1 x = q8_1::read(xb);
        const int h = g / 4, j = g % 4;
        int sum[2] = {0, 0}, low[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int q = (int_b2(b + 32 + 32 * h + 4 * i) >> (2 * j)) & 0x03030303;
            const int clear = (int) ((~(uint32_t) int_b2(b + 4 * i) >> g) & 0x01010101u);
            sum[i / 4] = __dp4a(q, x.u[i], sum[i / 4]);
            low[i / 4] = __dp4a(clear, x.u[i], low[i / 4]);
        }
        const int s0 = scale_k3(b + 96, 2 * g), s1 = scale_k3(b + 96, 2 * g + 1);
        return load_f16(b + 108) * x.d *
               (float) (s0 * (sum[0] - 4 * low[0]) + s1 * (sum[1] - 4 * low[1]));
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const uint8_t * hmask = b;
        const float d = load_f16(b + 108);
        const float dl = d * scale_k3(b + 96, sub);
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
        sc = ld_global(q + j) & 63;
        mn = ld_global(q + j + 4) & 63;
    } else {
        sc = (ld_global(q + j + 4) & 0xF) | ((ld_global(q + j - 4) >> 6) << 4);
        mn = (ld_global(q + j + 4) >> 4) | ((ld_global(q + j) >> 6) << 4);
    }
}

// Q4_K/Q5_K group g against a q8_1 block: nibble g % 2 of qs[(g / 2) * 32 + l], and for Q5_K
// (qh not null) fifth bit g of qh[l]; x = d*sc*q - dmin*m.
static __device__ __forceinline__ float vdot_k4(const uint8_t * b, const uint8_t * qs,
                                                const uint8_t * qh, const int g,
                                                const uint8_t * xb) {
    const q8_1 x = q8_1::read(xb);
    int sc, mn;
    scale_min_k4(g, b + 4, sc, mn);
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int v = (int_b4(qs + (g / 2) * 32 + 4 * i) >> (4 * (g % 2))) & 0x0F0F0F0F;
        if (qh) {
            v |= ((int_b4(qh + 4 * i) >> g) & 0x01010101) << 4;
        }
        sumi = __dp4a(v, x.u[i], sumi);
    }
    return load_f16(b) * sc * x.d * sumi - load_f16(b + 2) * mn * x.s;
}

// Q4_K: d, dmin, scales[12], qs[128]; x = d*sc*q - dmin*m over 32-element groups.
struct t_q4_k {
    static constexpr int QK = 256, BYTES = 144, EPT = 16;
    static constexpr bool DP4A = true;
    static __device__ __forceinline__ float vdot(const uint8_t * b, int g, const uint8_t * xb) {
        return vdot_k4(b, b + 16, nullptr, g, xb);
    }
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
    static constexpr bool DP4A = true;
    static __device__ __forceinline__ float vdot(const uint8_t * b, int g, const uint8_t * xb) {
        return vdot_k4(b, b + 48, b + 16, g, xb);
    }
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
    static constexpr bool DP4A = true;
    // group g = 4n + k: elements 128n + 32k + l; a scale per 16 of them, so two integer sums
    // (q - 32 folded in as 32 * sum(xq), the x sums by __dp4a with ones).
    static __device__ __forceinline__ int codes(const uint8_t * b, const int g, const int i) {
        const int n = g / 4, k = g % 4;
        const int lo = int_b2(b + n * 64 + 32 * (k & 1) + 4 * i);
        const int hi = int_b2(b + 128 + n * 32 + 4 * i);
        return ((lo >> (4 * (k >> 1))) & 0x0F0F0F0F) | (((hi >> (2 * k)) & 0x03030303) << 4);
    }
    static __device__ __forceinline__ float scaled(const uint8_t * b, const int g, const float dx,
                                                   const int (&sum)[2], const int (&sx)[2]) {
        const int8_t * sc = (const int8_t *) (b + 192 + 2 * g);
        return load_f16(b + 208) * dx *
               (ld_global(sc) * (sum[0] - 32 * sx[0]) + ld_global(sc + 1) * (sum[1] - 32 * sx[1]));
    }
    static __device__ __forceinline__ float vdot(const uint8_t * b, int g, const uint8_t * xb) {
        return vdot_halves<t_q6_k>(b, g, xb);
    }
    static __device__ __forceinline__ void dq(const uint8_t * b, int sub, float * y) {
        const float d = load_f16(b + 208);
        const float dl = d * ld_global((const int8_t *) (b + 192) + sub);
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
    X(t_bf16, bf16)      \
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
