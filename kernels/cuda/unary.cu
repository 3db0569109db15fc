// Elementwise activations; one thread per element, 1-D grid (see plan.plan_elementwise),
// and the gated ones ending in the down projection's q8_1 row.
#include "q8_1.cuh"

// The gated activations act(gate) * up, one value.
struct silu_mul_op {
    static __device__ __forceinline__ float of(const float g, const float u) {
        return g / (1.0f + expf(-g)) * u;
    }
};
// gelu_tanh(gate) * up: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up.
struct gelu_tanh_mul_op {
    static __device__ __forceinline__ float of(const float g, const float u) {
        const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
        return 0.5f * g * (1.0f + tanhf(inner)) * u;
    }
};

template <typename Act>
static __device__ __forceinline__ void gated(
        const float * __restrict__ gate, const float * __restrict__ up, float * __restrict__ y,
        const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = Act::of(gate[i], up[i]);
    }
}

// act(gate) * up as the q8_1 row the down projection reads (ncols % 32 == 0): one warp per
// q8_1 block, blockDim (32, <= 8), grid (block groups, batch), as quantize_q8_1
// (plan.plan_quantize_q8_1); the bytes equal quantize_q8_1 of the float kernel's output.
// gate and up are (batch, ncols) rows ld apart (the halves of one gate/up mat-vec: ld =
// 2 * ncols, up = gate + ncols).
template <typename Act>
static __device__ __forceinline__ void gated_q8_1(
        const float * __restrict__ gate, const float * __restrict__ up, uint8_t * __restrict__ xq,
        const int ncols, const long long ld, const long long xq_stride) {
    const int blk = blockIdx.x * blockDim.y + threadIdx.y;
    if (blk >= ncols / 32) {
        return;  // the whole warp
    }
    const long long i = blockIdx.y * ld + blk * 32 + threadIdx.x;
    store_q8_1_block(Act::of(ld_global(gate + i), ld_global(up + i)),
                     xq + blockIdx.y * xq_stride + blk * Q8_1_BYTES);
}

// y = silu(gate) * up, the gated MLP of Llama-family models.
extern "C" __global__ void __launch_bounds__(256) silu_mul_f32(
        const float * __restrict__ gate, const float * __restrict__ up, float * __restrict__ y,
        const long long n) {
    gated<silu_mul_op>(gate, up, y, n);
}

// y = gelu_tanh(gate) * up, Gemma's gated MLP.
extern "C" __global__ void __launch_bounds__(256) gelu_tanh_mul_f32(
        const float * __restrict__ gate, const float * __restrict__ up, float * __restrict__ y,
        const long long n) {
    gated<gelu_tanh_mul_op>(gate, up, y, n);
}

extern "C" __global__ void __launch_bounds__(256) silu_mul_q8_1(
        const float * __restrict__ gate, const float * __restrict__ up, uint8_t * __restrict__ xq,
        const int ncols, const long long ld, const long long xq_stride) {
    gated_q8_1<silu_mul_op>(gate, up, xq, ncols, ld, xq_stride);
}

extern "C" __global__ void __launch_bounds__(256) gelu_tanh_mul_q8_1(
        const float * __restrict__ gate, const float * __restrict__ up, uint8_t * __restrict__ xq,
        const int ncols, const long long ld, const long long xq_stride) {
    gated_q8_1<gelu_tanh_mul_op>(gate, up, xq, ncols, ld, xq_stride);
}

// y = 0.5 x (1 + erf(x / sqrt 2)): BERT's exact GELU, not the tanh approximation.
extern "C" __global__ void __launch_bounds__(256) gelu_f32(
        const float * __restrict__ x, float * __restrict__ y, const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
}
