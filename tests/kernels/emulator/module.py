"""Load an emulated .cu module and launch its kernels like cupy.RawKernel does.

    mod = EmulatedModule(path_to_cu)
    mod.get_function("rms_norm_f32")((grid_x,), (128,), (x, w, y, np.int32(n), ...))

Pointer parameters take NumPy arrays (their buffers are the "device memory"), raw integer
addresses, or None. Scalar parameters must be NumPy scalars of exactly the kernel's type:
CuPy would pass a wrong-width scalar silently and the GPU would read garbage; here it is an
error.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.kernels.emulator.build import build


class EmulatorError(RuntimeError):
    """A launch the emulator refused or a kernel fault it detected (barrier misuse, ...)."""


class _Cfg(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("dyn_smem", ctypes.c_ulonglong),
        ("reverse", ctypes.c_int),
        ("max_threads", ctypes.c_int),
        ("block_seed", ctypes.c_ulonglong),
    ]


_SCALARS: dict[str, tuple[type, Any]] = {
    "i": (np.int32, ctypes.c_int32),
    "I": (np.uint32, ctypes.c_uint32),
    "l": (np.int64, ctypes.c_int64),
    "L": (np.uint64, ctypes.c_uint64),
    "f": (np.float32, ctypes.c_float),
    "d": (np.float64, ctypes.c_double),
}

# One emulated "device": blocks run on the calling thread and share static state per module.
_LOCK = threading.Lock()

# "forward" runs each block's threads first-to-last between barriers, "reverse" last-to-first.
schedule = "forward"
# 0 runs blocks in grid order (x fastest); any other value a permutation derived from it.
block_seed = 0
# When a list, every launch appends (kernel name, access log): the typed global loads and
# stores of its lanes (ACCESS_DTYPE records, see emu_access in cuda_emu.h), for the memory-
# transaction model in kernels/emulator/traffic.py.
access_log: list[tuple[str, np.ndarray]] | None = None

ACCESS_DTYPE = np.dtype([("addr", "<u8"), ("size", "<u4"), ("store", "<u4"), ("block", "<u4"),
                         ("warp", "<u4"), ("site", "<u4"), ("epoch", "<u4"), ("inst", "<u4"),
                         ("pad", "<u4")])


def _dim3(v: int | Sequence[int]) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, int) else tuple(int(i) for i in v)
    return tuple(t + (1,) * (3 - len(t)))  # type: ignore[return-value]


def pointer(a: Any) -> int | None:
    if a is None:
        return None
    if isinstance(a, np.ndarray):
        return a.ctypes.data
    if isinstance(a, int) and not isinstance(a, bool):
        return a
    ptr = getattr(a, "emu_ptr", None)
    if ptr is not None:
        return int(ptr)
    raise TypeError(f"expected a NumPy array, an address or None, got {type(a).__name__}")


class EmulatedKernel:
    def __init__(self, lib: ctypes.CDLL, name: str, max_threads: int):
        self.name = name
        self.max_threads = max_threads
        self._launch = getattr(lib, f"emu_launch_{name}")
        self._launch.argtypes = [ctypes.POINTER(_Cfg), ctypes.POINTER(ctypes.c_void_p)]
        self._launch.restype = ctypes.c_int
        sig = getattr(lib, f"emu_sig_{name}")
        sig.restype = ctypes.c_char_p
        self.signature: str = sig().decode()
        self._error = lib.emu_error
        self._error.restype = ctypes.c_char_p
        self._trace_start = lib.emu_trace_start
        self._trace_stop = lib.emu_trace_stop
        self._trace_stop.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._trace_stop.restype = ctypes.c_size_t

    def _pack(self, args: Sequence[Any]) -> list[Any]:
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        packed = []
        for i, (code, a) in enumerate(zip(self.signature, args, strict=True)):
            if code == "p":
                packed.append(ctypes.c_void_p(pointer(a)))
                continue
            if code not in _SCALARS:
                raise TypeError(f"{self.name}: parameter {i} has a type the emulator cannot pass")
            np_type, c_type = _SCALARS[code]
            if type(a) is not np_type:
                raise TypeError(f"{self.name}: argument {i} must be numpy.{np_type.__name__}, "
                                f"got {type(a).__name__} (a GPU would misread it)")
            packed.append(c_type(a.item()))
        return packed

    def __call__(self, grid: int | Sequence[int], block: int | Sequence[int],
                 args: Sequence[Any], *, shared_mem: int = 0) -> None:
        packed = self._pack(args)
        ptrs = (ctypes.c_void_p * max(1, len(packed)))(
            *[ctypes.addressof(p) for p in packed])
        cfg = _Cfg(_dim3(grid), _dim3(block), int(shared_mem), int(schedule == "reverse"),
                   self.max_threads, block_seed)
        with _LOCK:
            log = access_log
            if log is not None:
                self._trace_start()
            rc = self._launch(ctypes.byref(cfg), ptrs)
            if log is not None:
                ev = ctypes.c_void_p()
                n = self._trace_stop(ctypes.byref(ev))
                events = np.empty(0, ACCESS_DTYPE)
                if n:
                    buf = (ctypes.c_char * (n * ACCESS_DTYPE.itemsize)).from_address(ev.value)
                    events = np.frombuffer(buf, ACCESS_DTYPE, count=n).copy()
                log.append((self.name, events))
            if rc:
                raise EmulatorError(f"{self.name}: {self._error().decode()}")


class EmulatedModule:
    """The host build of one .cu file, with the kernel lookup of cupy.RawModule."""

    def __init__(self, source: str | Path):
        so, kernels = build(Path(source))
        self.path = Path(source)
        self._lib = ctypes.CDLL(str(so))
        self._bounds = kernels
        self._kernels: dict[str, EmulatedKernel] = {}

    def get_function(self, name: str) -> EmulatedKernel:
        if name not in self._bounds:
            raise AttributeError(f"{self.path.name} has no kernel {name!r}")
        if name not in self._kernels:
            self._kernels[name] = EmulatedKernel(self._lib, name, self._bounds[name])
        return self._kernels[name]
