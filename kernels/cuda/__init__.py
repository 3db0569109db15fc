"""CUDA kernels and the pure-Python rules that launch them.

    *.cu, *.cuh   kernels (CUDA C, extern "C"), loaded by cupy.RawModule or the emulator
    table.py      every per-type constant (block geometry, threads, budgets)
    plan.py       launch planners: (shape, type, device limits) -> grid, block, shared bytes
    ops.py        checked entry points: dtype/layout checks, plan, launch
    device.py     the device interface: CuPy on a GPU, the host emulator in tests

The host emulator, the nvcc build check and the occupancy table are test tools:
tests/kernels/emulator/, tests/kernels/nvcc_check.py, tests/kernels/occupancy.py.
"""
