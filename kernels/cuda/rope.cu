// Rotary position embedding. x is contiguous (..., seq, ..., head_dim); row r (one head
// vector) has position offset + (r / seq_div) % seq, so (B, H, S, D) uses seq_div = 1 and
// (B, S, H, D) uses seq_div = H. Pair i rotates by pos * theta^(-2i/D) / ff[i], where the
// optional freq_factors ff (D/2 floats; scaled RoPE such as Llama 3's) default to 1:
//   neox (Hugging Face): elements (i, i + D/2);  normal (GGML): elements (2i, 2i + 1).

#include "rope.cuh"

static __device__ __forceinline__ void rope_pair(
        const float * __restrict__ x, float * __restrict__ y, const int head_dim,
        const long long npairs, const int seq, const int seq_div, const int offset,
        const float theta, const int neox, const float * __restrict__ freq_factors) {
    const long long p = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= npairs) {
        return;
    }
    const int half = head_dim / 2;
    const long long row = p / half;
    const int i = (int) (p % half);
    const int pos = offset + (int) ((row / seq_div) % seq);
    const long long i0 = row * head_dim + (neox ? i : 2 * i);
    const long long i1 = i0 + (neox ? half : 1);
    float a = x[i0], b = x[i1];
    rope_rotate(a, b, pos, i, head_dim, theta, freq_factors);
    y[i0] = a;
    y[i1] = b;
}

// One thread per rotated pair; 1-D grid (see plan.plan_elementwise).
extern "C" __global__ void __launch_bounds__(256) rope_f32(
        const float * __restrict__ x, float * __restrict__ y, const int head_dim,
        const long long npairs, const int seq, const int seq_div, const int offset,
        const float theta, const int neox, const float * __restrict__ freq_factors) {
    rope_pair(x, y, head_dim, npairs, seq, seq_div, offset, theta, neox, freq_factors);
}

// rope_f32 for a captured decode step (CUDA graph): the offset is read from the device
// (*pos, written before each replay), so one launch serves every position.
extern "C" __global__ void __launch_bounds__(256) rope_f32_pos(
        const float * __restrict__ x, float * __restrict__ y, const int head_dim,
        const long long npairs, const int seq, const int seq_div, const int * __restrict__ pos,
        const float theta, const int neox, const float * __restrict__ freq_factors) {
    rope_pair(x, y, head_dim, npairs, seq, seq_div, *pos, theta, neox, freq_factors);
}
