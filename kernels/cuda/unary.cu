// Elementwise activations; one thread per element, 1-D grid (see plan.plan_elementwise).
#include "common.cuh"

// y = silu(gate) * up, the gated MLP of Llama-family models.
extern "C" __global__ void __launch_bounds__(256) silu_mul_f32(
        const float * __restrict__ gate, const float * __restrict__ up, float * __restrict__ y,
        const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// y = gelu_tanh(gate) * up, Gemma's gated MLP: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
extern "C" __global__ void __launch_bounds__(256) gelu_tanh_mul_f32(
        const float * __restrict__ gate, const float * __restrict__ up, float * __restrict__ y,
        const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
        y[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
    }
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
