"""Host emulator for kernels/cuda: the .cu sources built with g++ and cuda_emu.h, each CUDA
thread a fiber so barriers and warp shuffles hold, launched through ctypes (module.py)."""
