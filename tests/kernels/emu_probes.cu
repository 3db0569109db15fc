// Kernels that exercise the emulated CUDA surface itself (conversions, shuffles, atomics),
// compared with NumPy in test_emulator.py. Valid CUDA as well.
#include "common.cuh"
#ifndef INFERDESK_EMULATOR
#include <cuda_bf16.h>
#endif

extern "C" __global__ void convert_half(const float * x, uint16_t * h, float * back, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const __half v = __float2half_rn(x[i]);
        h[i] = __half_as_ushort(v);
        back[i] = __half2float(v);
    }
}

extern "C" __global__ void convert_bf16(const float * x, uint16_t * b, float * back, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const __nv_bfloat16 v = __float2bfloat16(x[i]);
        b[i] = *(const uint16_t *) &v;
        back[i] = __bfloat162float(v);
    }
}

// out[k*32 + lane] for k = shfl(src 5), up(3), down(3), xor(1, width 16), ballot(odd lanes).
extern "C" __global__ void shuffles(const float * x, float * out) {
    const int lane = threadIdx.x;
    const float v = x[lane];
    out[0 * 32 + lane] = __shfl_sync(FULL_MASK, v, 5, 32);
    out[1 * 32 + lane] = __shfl_up_sync(FULL_MASK, v, 3, 32);
    out[2 * 32 + lane] = __shfl_down_sync(FULL_MASK, v, 3, 32);
    out[3 * 32 + lane] = __shfl_xor_sync(FULL_MASK, v, 1, 16);
    out[4 * 32 + lane] = (float) __ballot_sync(FULL_MASK, lane & 1);
}

extern "C" __global__ void histogram(const int * x, int * hist, int * max_out, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        atomicAdd(&hist[x[i]], 1);
        atomicMax(max_out, x[i]);
    }
}

// Memory-model probes (test_traffic.py): y[i] = x[i * stride], one float per lane.
extern "C" __global__ void gather_stride(const float * x, float * y, const int stride, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        st_global(y + i, ld_global(x + (long long) i * stride));
    }
}

// A typed load `offset` bytes into x: misaligned unless offset % 4 == 0.
extern "C" __global__ void load_at(const uint8_t * x, float * y, const int offset) {
    st_global(y + threadIdx.x, ld_global((const float *) (x + offset) + threadIdx.x));
}

// out[i] = __dp4a(a[i], b[i], c[i]) signed, out[n + i] the unsigned variant (as unsigned bits).
extern "C" __global__ void dp4a(const int * a, const int * b, const int * c, int * out, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __dp4a(a[i], b[i], c[i]);
        out[n + i] = (int) __dp4a((unsigned) a[i], (unsigned) b[i], (unsigned) c[i]);
    }
}
