"""Host emulator for kernels/cuda, used by the tests only: the .cu sources built with g++ and
cuda_emu.h, each CUDA thread a fiber so barriers and warp shuffles hold, launched through
ctypes (module.py); device.py wraps it as a Device, traffic.py models memory transactions."""
