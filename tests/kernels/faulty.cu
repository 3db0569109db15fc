// Kernels with deliberate launch and synchronisation mistakes, for the emulator's own tests.
#include "common.cuh"

// Block sum of x[0 .. blockDim.x) into out[0]; with_sync = 0 drops the barrier between the
// per-warp partial sums and reading them back.
extern "C" __global__ void block_sum(const float * x, float * out, const int with_sync) {
    __shared__ float s[32];
    float v = warp_reduce_sum(x[threadIdx.x]);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (lane == 0) {
        s[warp] = v;
    }
    if (with_sync) {
        __syncthreads();
    }
    if (warp == 0) {
        v = lane < blockDim.x / WARP_SIZE ? s[lane] : 0.0f;
        v = warp_reduce_sum(v);
        if (lane == 0) {
            out[0] = v;
        }
    }
}

// The seed bug's shape: a kernel written for exactly 64 threads per 256-element super-block
// (4 elements per thread), so any other block size leaves holes or writes past the end.
extern "C" __global__ void scale_superblocks_64(const float * x, float * y, const float a) {
    const int base = blockIdx.x * 256 + threadIdx.x * 4;
    for (int i = 0; i < 4; ++i) {
        y[base + i] = a * x[base + i];
    }
}

// Returns early on half the block, then synchronises the rest.
extern "C" __global__ void divergent_barrier(float * y) {
    if (threadIdx.x < 16) {
        return;
    }
    __syncthreads();
    y[threadIdx.x] = 1.0f;
}

// A full-mask warp reduction, wrong for a block that is not whole warps.
extern "C" __global__ void warp_sum(const float * x, float * y) {
    const float v = warp_reduce_sum(x[threadIdx.x]);
    if (threadIdx.x == 0) {
        y[0] = v;
    }
}

extern "C" __global__ void __launch_bounds__(128) bounded(float * y) {
    y[threadIdx.x] = 1.0f;
}

// Reads shared memory nobody wrote.
extern "C" __global__ void read_unwritten_shared(float * y) {
    __shared__ float s[64];
    y[threadIdx.x] = s[threadIdx.x];
}

extern "C" __global__ void takes_int(float * y, const int n) {
    if ((int) threadIdx.x < n) {
        y[threadIdx.x] = (float) n;
    }
}

// Lane 0 waits for its warp at __syncwarp while the other lanes return.
extern "C" __global__ void lone_syncwarp(float * y) {
    if (threadIdx.x == 0) {
        __syncwarp();
    }
    y[threadIdx.x] = 1.0f;
}

// A float4 load at x + offset: misaligned unless offset % 4 == 0.
extern "C" __global__ void vector_load(const float * x, float * y, const int offset) {
    const float4 v = load_float4(x + offset + 4 * threadIdx.x);
    y[threadIdx.x] = v.x + v.y + v.z + v.w;
}

// Block b reads what block b - 1 wrote: right only if blocks run in grid order, which CUDA
// does not promise (an inter-block race).
extern "C" __global__ void chain_across_blocks(float * y) {
    if (threadIdx.x == 0) {
        y[blockIdx.x] = blockIdx.x == 0 ? 1.0f : y[blockIdx.x - 1] + 1.0f;
    }
}

// Each block writes its own linear index into its own slot (no race in any order).
extern "C" __global__ void block_ids(float * y) {
    if (threadIdx.x == 0) {
        y[(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] =
            (float) ((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
    }
}
