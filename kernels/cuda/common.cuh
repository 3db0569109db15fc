// Shared by every kernel: integer types, warp/block reductions.
// Compiles three ways: nvcc, NVRTC (CuPy RawModule) and g++ with the host emulator.
// Needs no CUDA header: a module that uses half includes half.cuh, the only file that
// pulls in cuda_fp16.h (which NVRTC finds only with the toolkit headers installed).
#pragma once

#if defined(INFERDESK_EMULATOR)
// tests/kernels/emulator/cuda_emu.h is force-included before this file.
#elif defined(__CUDACC_RTC__)
// NVRTC has no libc headers.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;
#else
#include <stdint.h>
#endif

#if defined(INFERDESK_EMULATOR)
#define CHECK_ALIGNED(p, n) emu_check_aligned((const void *) (p), (n))
// The caller's source position names the access site for the emulator's memory model.
#define EMU_SITE_PARAM , const unsigned emu_site = __builtin_LINE() + 7919u * \
    (unsigned) ((uintptr_t) __builtin_FILE() % 65521u)
#define EMU_ACCESS(p, n, store) emu_access((const void *) (p), (n), (store), emu_site)
#else
#define CHECK_ALIGNED(p, n) ((void) 0)
#define EMU_SITE_PARAM
#define EMU_ACCESS(p, n, store) ((void) 0)
#endif

// Typed global loads and stores. On a GPU a plain access; in the emulator each is checked
// for natural alignment (sizeof(T)) and, when the memory model is on, logged as one lane's
// part of a warp-level transaction (tests/kernels/emulator/traffic.py counts 32-byte sectors).
template <typename T>
static __device__ __forceinline__ T ld_global(const T * p EMU_SITE_PARAM) {
    EMU_ACCESS(p, sizeof(T), false);
    return *p;
}
template <typename T>
static __device__ __forceinline__ void st_global(T * p, const T v EMU_SITE_PARAM) {
    EMU_ACCESS(p, sizeof(T), true);
    *p = v;
}

// A loaded value as float32 (half.cuh adds the overload for half): kernels templated on a
// storage type accumulate in float32 whatever they read.
static __device__ __forceinline__ float to_f32(const float v) { return v; }
// A 32-bit word loaded from a T buffer as its 4 / sizeof(T) float32 values, in memory order
// (the pointer only picks the overload; half.cuh and bf16.cuh add theirs).
static __device__ __forceinline__ void widen_word(const float *, const uint32_t w, float * out) {
    out[0] = __uint_as_float(w);
}
// Store a float32 value as the buffer's element type (half.cuh: rounded to nearest even).
static __device__ __forceinline__ void store_f32(float * p, const float v) { st_global(p, v); }

// The block's dynamic shared memory (Launch.shared_bytes) as a float array. Declared with
// float's alignment: a 16-byte one would pad every kernel's static shared memory to 16 in
// a translation unit holding several modules (nvcc_check's).
#if defined(INFERDESK_EMULATOR)
#define DYN_SHARED_F32(name) float * name = (float *) EMU_DYN_SMEM
#else
#define DYN_SHARED_F32(name) extern __shared__ float name[]
#endif

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // NVRTC has no INFINITY macro

// Reduction operators: one warp/block reduction serves sum and max.
struct op_sum {
    static __device__ __forceinline__ float identity() { return 0.0f; }
    static __device__ __forceinline__ float apply(float a, float b) { return a + b; }
};
struct op_max {
    static __device__ __forceinline__ float identity() { return NEG_INF; }
    static __device__ __forceinline__ float apply(float a, float b) { return fmaxf(a, b); }
};

template <typename Op>
static __device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        v = Op::apply(v, __shfl_xor_sync(FULL_MASK, v, offset, WARP_SIZE));
    }
    return v;
}

// Reduce over the blockDim.x threads of one row (threadIdx.y picks the row).
// `s` is a __shared__ float[32] owned by the caller: blockDim.x*blockDim.y <= 1024 means at
// most 32 warps. The leading barrier lets a kernel call this twice with the same `s`.
// blockDim.x is a multiple of 32 (planners guarantee it), so every row owns whole warps.
template <typename Op>
static __device__ __forceinline__ float block_reduce(float v, float * s) {
    v = warp_reduce<Op>(v);
    if (blockDim.x > WARP_SIZE) {
        const int warps_per_row = blockDim.x / WARP_SIZE;
        const int warp = threadIdx.x / WARP_SIZE;
        const int lane = threadIdx.x % WARP_SIZE;
        const int base = threadIdx.y * warps_per_row;
        __syncthreads();
        if (lane == 0) {
            s[base + warp] = v;
        }
        __syncthreads();
        v = lane < warps_per_row ? s[base + lane] : Op::identity();
        v = warp_reduce<Op>(v);
    }
    return v;
}

static __device__ __forceinline__ float warp_reduce_sum(float v) { return warp_reduce<op_sum>(v); }
static __device__ __forceinline__ float warp_reduce_max(float v) { return warp_reduce<op_max>(v); }
static __device__ __forceinline__ float block_reduce_sum(float v, float * s) {
    return block_reduce<op_sum>(v, s);
}
static __device__ __forceinline__ float block_reduce_max(float v, float * s) {
    return block_reduce<op_max>(v, s);
}

// 16-byte aligned vector load of 4 floats.
static __device__ __forceinline__ float4 load_float4(const float * p) {
    return ld_global((const float4 *) p);
}

// 16 consecutive bytes at a 2-aligned address as 8 half-word loads: GGML blocks are only
// 2-byte aligned (18, 22, 34, 110, 210 bytes), and byte loads would double the loads.
struct bytes16 {
    uint16_t h[8];
    __device__ __forceinline__ int operator[](const int i) const { return (h[i >> 1] >> (8 * (i & 1))) & 0xFF; }
};

static __device__ __forceinline__ bytes16 load_bytes16(const uint8_t * p) {
    bytes16 r;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        r.h[i] = ld_global((const uint16_t *) p + i);
    }
    return r;
}
