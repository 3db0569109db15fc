// The few kernels a decode step needs to be captured in a CUDA graph: everything that
// changes between steps (the input id, the position) is written to device memory by one
// launch before each replay, and what the eager step does with CuPy operators (the KV row
// write, the residual and bias adds, the embedding scale, the final soft-cap) is a kernel
// whose arguments do not change between replays.
#include "kv_store.cuh"

// Before a replay: the sampled id (still on the device) becomes the step's input, and the
// step's position (a kernel argument, not a copy) is written where the kernels read it.
// One thread.
extern "C" __global__ void __launch_bounds__(32) step_inputs_i32(
        const int * __restrict__ tok, int * __restrict__ ids, int * __restrict__ pos,
        const int position) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        ids[0] = tok[0];
        pos[0] = position;
    }
}

// Before a batched step's first kernel, inside its graph: row r's input id is the token its
// sequence sampled (still on the device) at the address tok[r], which the step's one copy
// before each replay wrote with the rows' positions and KV slots. One warp.
extern "C" __global__ void __launch_bounds__(32) step_ids_i32(
        const long long * __restrict__ tok, int * __restrict__ ids, const int rows) {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        ids[r] = *(const int *) tok[r];
    }
}

KV_STORE_KERNEL(float, kv_store_f32)  // see kv_store.cuh
ROPE_KV_KERNEL(float, rope_kv_f32)  // see kv_store.cuh: RoPE fused into the KV-cache write

// y = a + b[i % period], float32: the residual adds (period = n) and a bias added to each
// row of a projection (period = the row's width).
extern "C" __global__ void __launch_bounds__(256) add_f32(
        const float * __restrict__ a, const float * __restrict__ b, float * __restrict__ y,
        const long long n, const long long period) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a[i] + b[i % period];
    }
}

// y = x * s: a scale by a constant (Gemma's embedding scale), float32.
extern "C" __global__ void __launch_bounds__(256) scale_f32(
        const float * __restrict__ x, float * __restrict__ y, const float s, const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = x[i] * s;
    }
}

// y = cap * tanh(x / cap): Gemma 2's final-logit soft-capping, float32.
extern "C" __global__ void __launch_bounds__(256) softcap_f32(
        const float * __restrict__ x, float * __restrict__ y, const float cap, const long long n) {
    const long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = cap * tanhf(x[i] / cap);
    }
}
