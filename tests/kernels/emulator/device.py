"""The host emulator as a device (:class:`EmulatedDevice`) for the kernel tests.

The same .cu sources as on a GPU, built with g++ against cuda_emu.h (build.py) and launched
through ctypes (module.py); arrays are NumPy buffers standing in for device memory, and
``xp`` is numpy. It implements kernels/cuda/device.py's :class:`Device` interface, so the CUDA
backend and its ops run on it unchanged.
"""

from __future__ import annotations

import ctypes
import mmap
import weakref
from typing import Any

import numpy as np

from kernels.cuda.blas import GemmEx
from kernels.cuda.device import MODULES, Device, Graph, PendingRead, TransferLog, source_path
from kernels.cuda.plan import Launch
from tests.kernels.emulator import module as emu
from tests.kernels.emulator.cublas import emulate_gemm_ex
from tests.kernels.emulator.module import EmulatedModule, EmulatorError


class RecordedGraph(Graph):
    """The emulator's graph: the launch list recorded at capture, replayed through the same
    checked path (guards, race checks) as an eager launch."""

    def __init__(self, dev: Device, keep: list[Any],
                 launches: list[tuple[str, str, Launch, tuple[Any, ...]]]) -> None:
        super().__init__(dev, keep)
        self.launches = launches

    def _replay(self) -> None:
        for module, name, launch, args in self.launches:
            self.dev._run(module, name, launch, args)




_GUARD = 64  # canary bytes before every emulated allocation (and in the slack after it)
_CANARY = 0xA5
_PAGE = mmap.PAGESIZE  # guard page: PROT_NONE (0)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _guarded(nbytes: int) -> tuple[np.ndarray, int]:
    """(pages, data offset): the data ends at most 15 bytes before a PROT_NONE page, so a
    kernel running past it faults at once (the emulator reports the fault); canaries fill
    the 64 bytes before the data and the alignment slack after it."""
    body = -(-(nbytes + _GUARD + 16) // _PAGE) * _PAGE
    mm = mmap.mmap(-1, body + _PAGE)
    pages = np.frombuffer(mm, np.uint8, count=body)  # the guard page is in no array
    if _libc.mprotect(pages.ctypes.data + body, _PAGE, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    start = (body - nbytes) & ~15
    pages[start - _GUARD:start] = _CANARY
    pages[start + nbytes:body] = _CANARY
    return pages, start


class DeviceArray(np.ndarray):
    """An emulated device buffer: a NumPy array whose host reads are logged.

    On a GPU, float(), int(), bool(), .item(), .tolist(), .get() and printing of a CuPy
    array each copy it to the host and wait for the device; here each records a d2h event
    labelled "implicit ..." in the owning device's transfer log, so a test of what a token
    loop moves sees them too. Results of NumPy operations on device arrays stay device
    arrays, and indexing one element gives a 0-d device array, as CuPy does.
    Not caught: np.asarray() of a device array (CuPy refuses it outright).
    """

    _log: TransferLog | None = None
    on_device = True  # a NumPy array by type, device memory by role (as a CuPy array)

    def __array_finalize__(self, obj: Any) -> None:
        self._log = getattr(obj, "_log", None)

    def __array_wrap__(self, arr: np.ndarray, context: Any = None,
                       return_scalar: bool = False) -> DeviceArray:
        out = arr.view(DeviceArray)  # 0-d, never a NumPy scalar: reductions stay on device
        out._log = self._log
        return out

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        r = super().__array_function__(func, types, args, kwargs)  # concatenate, where, ...
        if isinstance(r, np.ndarray) and not isinstance(r, DeviceArray):
            r = r.view(DeviceArray)
            r._log = self._log
        return r

    def __getitem__(self, key: Any) -> Any:
        r = super().__getitem__(key)
        if isinstance(r, np.ndarray):
            return r
        out = np.array(r).view(DeviceArray)
        out._log = self._log
        return out

    def _read(self, what: str) -> np.ndarray:
        if self._log is not None:
            self._log.record("d2h", self.nbytes, f"implicit {what}")
        return self.view(np.ndarray)

    def __float__(self) -> float:
        return float(self._read("float()"))

    def __int__(self) -> int:
        return int(self._read("int()"))

    def __bool__(self) -> bool:
        return bool(self._read("bool()"))

    def item(self, *args: Any) -> Any:
        return self._read("item()").item(*args)

    def tolist(self) -> Any:
        return self._read("tolist()").tolist()

    def get(self) -> np.ndarray:
        """CuPy's copy to the host."""
        return np.array(self._read("get()"), copy=True)

    def __repr__(self) -> str:
        return repr(self._read("repr()"))

    def __str__(self) -> str:
        return str(self._read("str()"))


class EmulatedDevice(Device):
    """The host emulator as a device: NumPy buffers are device memory.

    - New buffers are poisoned (NaN bytes), so an element no thread writes shows up.
    - Every buffer has canaries around it, checked after each launch: a kernel that writes
      past its output (a wrong block size or grid) is an error, not silent corruption.
    - ``check_races=True`` runs each launch twice on copies of its buffers: threads
      first-to-last between barriers with blocks in grid order, then threads last-to-first
      with the blocks shuffled; it fails if the results differ. That is what a missing
      __syncthreads or __syncwarp does, or a block reading what another block writes.
    """

    name = "cuda-emulator"
    device_name = "CUDA emulator (host)"
    xp = np

    def __init__(self, check_races: bool = False) -> None:
        super().__init__()
        self.check_races = check_races
        self._guarded: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self._spans: dict[int, tuple[int, int]] = {}
        self.allocations: list[int] = []  # bytes of every buffer allocated, in order
        self._recording: list[tuple[str, str, Launch, tuple[Any, ...]]] | None = None

    supports_graphs = True

    def begin_capture(self) -> None:
        self._recording, self._keep = [], []

    def end_capture(self) -> Graph:
        graph = RecordedGraph(self, self._keep or [], self._recording or [])
        self._recording = self._keep = None
        return graph

    def abort_capture(self) -> None:
        self._recording = self._keep = None

    def _gemm_ex(self, g: GemmEx, a: Any, b: Any, c: Any) -> None:
        emulate_gemm_ex(g, a, b, c)  # cuBLAS's contract on the host buffers
        self._check_guards("gemm_ex", (a, b, c))

    def _load(self, module: str) -> Any:
        return EmulatedModule(source_path(module))

    @staticmethod
    def prebuild(modules: tuple[str, ...] = MODULES) -> None:
        """Compile (or find cached) every module, one g++ per core, before the first launch."""
        EmulatedDevice().load_all(modules)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.allocations.append(n)
        raw, start = _guarded(n)
        raw[start:start + n] = 0xFF  # NaN as float and half: unwritten outputs show
        self._guarded[id(raw)] = raw
        self._spans[id(raw)] = (start, n)
        out = raw[start:start + n].view(dtype).reshape(shape).view(DeviceArray)
        out._log = self.transfers
        return self._kept(out)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        a = self.empty(shape, dtype)
        a[...] = 0
        return a

    def to_device(self, a: np.ndarray, label: str = "") -> np.ndarray:
        a = np.asarray(a)
        self.transfers.record("h2d", a.nbytes, label)
        out = self.empty(a.shape, a.dtype)
        out[...] = a
        return out

    def to_host(self, a: np.ndarray, label: str = "") -> np.ndarray:
        self.transfers.record("d2h", a.nbytes, label)
        return np.array(a, copy=True, subok=False)

    def write(self, dst: np.ndarray, a: np.ndarray, label: str = "") -> None:
        self.transfers.record("h2d", a.nbytes, label)
        dst[...] = a.reshape(dst.shape)

    def read_later(self, a: np.ndarray, label: str = "") -> PendingRead:
        # Launches complete in order here, so the value is final when the copy is queued.
        return PendingRead(self.transfers, np.array(a, copy=True, subok=False), label)

    def memory(self) -> tuple[int | None, int | None, int | None]:
        return None, None, None

    @staticmethod
    def _root(a: np.ndarray) -> np.ndarray:
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    def _check_guards(self, name: str, args: tuple[Any, ...]) -> None:
        for a in args:
            if not isinstance(a, np.ndarray):
                continue
            root = self._root(a)
            if self._guarded.get(id(root)) is not root:
                continue
            start, n = self._spans[id(root)]
            if (root[start - _GUARD:start] != _CANARY).any() or (root[start + n:] != _CANARY).any():
                raise EmulatorError(f"{name}: a thread wrote outside a {a.dtype} buffer "
                                        f"of shape {a.shape} (grid or block too large?)")

    def _run(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        if self._recording is not None:  # capturing: recorded now, run at each replay
            self._recording.append((module, name, launch, args))
            return
        if not self.check_races:
            super()._run(module, name, launch, args)
            self._check_guards(name, args)
            return
        roots = {id(r): r for r in (self._root(a) for a in args if isinstance(a, np.ndarray))}
        before = {k: r.copy() for k, r in roots.items()}
        saved = emu.schedule, emu.block_seed
        try:
            emu.schedule, emu.block_seed = "forward", 0
            super()._run(module, name, launch, args)
            forward = {k: r.copy() for k, r in roots.items()}
            for k, r in roots.items():
                r[...] = before[k]
            emu.schedule, emu.block_seed = "reverse", self.launches  # a new order per launch
            super()._run(module, name, launch, args)
        finally:
            emu.schedule, emu.block_seed = saved
        self._check_guards(name, args)
        for k, r in roots.items():
            if not np.array_equal(r.view(np.uint8), forward[k].view(np.uint8)):
                raise EmulatorError(
                    f"{name}: results depend on the order threads run between barriers or "
                    "blocks run in the grid (a missing __syncthreads/__syncwarp, or a race on "
                    "shared or global memory)")
