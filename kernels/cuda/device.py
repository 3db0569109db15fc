"""The thin device interface the CUDA backend runs on, and its GPU implementation.

- :class:`CupyDevice`: a real NVIDIA GPU; kernels through cupy.RawModule (NVRTC), arrays are
  CuPy arrays, ``xp`` is cupy (its elementwise ops and cuBLAS matmul run on the device).
- the host emulator of the tests (tests/kernels/emulator/device.py): the same .cu sources
  built with g++, arrays are NumPy buffers standing in for device memory, ``xp`` is numpy.

Both count every host<->device copy and every kernel launch in :attr:`Device.transfers`, so
tests can assert what a token loop moves, and when. Launch configurations come from
kernels/cuda/plan.py only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernels.cuda.blas import CUBLAS_GEMM_DEFAULT, GemmEx
from kernels.cuda.plan import DEFAULT_LIMITS, DeviceLimits, Launch
from kernels.errors import KernelLoadError

CUDA_DIR = Path(__file__).resolve().parent
# Slowest to compile first (NVRTC to sm_89 cubins: mmv ~10 s, dequant ~5 s, attention ~1 s,
# the rest < 0.3 s each), so load_all's parallel compile ends with the short ones.
MODULES = ("mmv", "dequant", "attention", "norm", "softmax", "rope", "kv_f16", "kv_bf16", "unary",
           "argmax", "step", "selftest")


def source_path(module: str) -> Path:
    return CUDA_DIR / f"{module}.cu"


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def kernel_source(module: str) -> str:
    """The module's source with our own headers inlined (each once, like #pragma once).

    CuPy keys its on-disk kernel cache by the source text it is given, not by the headers
    that text includes; inlining them makes a header edit recompile the kernels.
    """
    seen: set[Path] = set()

    def expand(path: Path) -> str:
        def repl(m: re.Match[str]) -> str:
            inc = (path.parent / m.group(1)).resolve()
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(inc)

        return _INCLUDE.sub(repl, path.read_text().replace("#pragma once", ""))

    return expand(source_path(module))


@dataclass
class TransferLog:
    """Every host<->device copy: (direction, bytes, label) in ``events``, and in ``at`` the
    number of kernels launched before it (where the copy sits in the launch order).
    ``launches`` counts the device's kernel launches and is never cleared."""

    events: list[tuple[str, int, str]] = field(default_factory=list)
    at: list[int] = field(default_factory=list)
    launches: int = 0

    def record(self, direction: str, nbytes: int, label: str) -> None:
        self.events.append((direction, int(nbytes), label))
        self.at.append(self.launches)

    def count(self, direction: str | None = None) -> int:
        return sum(1 for d, _, _ in self.events if direction in (None, d))

    def nbytes(self, direction: str | None = None) -> int:
        return sum(n for d, n, _ in self.events if direction in (None, d))

    def clear(self) -> None:
        self.events.clear()
        self.at.clear()


class PendingRead:
    """A device->host copy queued behind the work that computes its source.

    :meth:`result` waits for that copy alone, not for work queued after it, so the host can
    queue the next step before it reads this one's result; the transfer is logged when the
    host reads it (that is when the host waits)."""

    def __init__(self, log: TransferLog, host: np.ndarray, label: str,
                 wait: Any = None) -> None:
        self._log, self._host, self._label, self._wait = log, host, label, wait
        self._read = False

    def result(self) -> np.ndarray:
        if not self._read:
            if self._wait is not None:
                self._wait()
            self._log.record("d2h", self._host.nbytes, self._label)
            self._read = True
        return self._host


class Graph:
    """A captured sequence of launches: :meth:`launch` runs all of them, in order, as one
    Python-level launch. It keeps the buffers allocated during capture alive."""

    def __init__(self, dev: Device, keep: list[Any]) -> None:
        self.dev, self.keep = dev, keep

    def launch(self) -> None:
        self.dev.transfers.launches += 1
        self._replay()

    def _replay(self) -> None:
        raise NotImplementedError


class CupyGraph(Graph):
    """A CUDA graph (cupy.cuda.Graph), replayed on the current stream: in order with the
    work queued there before it (its inputs) and after it (what reads its outputs)."""

    def __init__(self, dev: Device, keep: list[Any], graph: Any) -> None:
        super().__init__(dev, keep)
        self.graph = graph

    def _replay(self) -> None:
        self.graph.launch()


class Device:
    name = "device"
    xp: Any = np
    limits: DeviceLimits = DEFAULT_LIMITS

    def __init__(self) -> None:
        self.transfers = TransferLog()
        self._functions: dict[tuple[str, str], Any] = {}
        self._module_cache: dict[str, Any] = {}
        self._keep: list[Any] | None = None  # buffers allocated while capturing

    @property
    def launches(self) -> int:
        """Kernels launched through :meth:`launch` so far (CuPy's own ops not counted)."""
        return self.transfers.launches

    # --- kernels -------------------------------------------------------------------
    def _load(self, module: str) -> Any:
        raise NotImplementedError

    def _module(self, module: str) -> Any:
        if module not in self._module_cache:
            self._module_cache[module] = self._compiled(module)
        return self._module_cache[module]

    def _compiled(self, module: str) -> Any:
        try:
            return self._load(module)
        except Exception as e:
            raise KernelLoadError(f"the {module} kernels do not compile or load "
                                  f"({first_line(e)})") from e

    def load_all(self, modules: tuple[str, ...] = MODULES,
                 progress: Callable[[int, int, str], None] | None = None,
                 workers: int | None = None) -> None:
        """Compile (or take from the compiler's cache) every module now, so a missing NVRTC
        or header fails here, before any weight moves, not at a kernel's first launch.

        Modules compile in parallel, ``workers`` at once (default: one per core; NVRTC and
        g++ run without Python's lock), the slowest first (:data:`MODULES`' order).
        ``progress(done, total, module)`` is called on the calling thread: once with
        ``(already loaded, total, "")`` at the start, then as each module is ready, with
        ``done`` counting the ready ones; the last call has ``done == total``. The first
        module that fails raises :class:`KernelLoadError` and cancels those not started."""
        todo = [m for m in modules if m not in self._module_cache]
        done, total = len(modules) - len(todo), len(modules)
        if progress is not None:
            progress(done, total, "")
        if not todo:
            return
        n = max(1, min(len(todo), workers or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="kernel-compile") as pool:
            futures = {pool.submit(self._compiled, m): m for m in todo}
            try:
                for f in as_completed(futures):
                    m = futures[f]
                    self._module_cache[m] = f.result()
                    done += 1
                    if progress is not None:
                        progress(done, total, m)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def function(self, module: str, name: str) -> Any:
        key = (module, name)
        if key not in self._functions:
            self._functions[key] = self._module(module).get_function(name)
        return self._functions[key]

    def launch(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        """One Python-level launch (counted): run now, or record it while capturing."""
        launch.check(self.limits)
        self.transfers.launches += 1
        self._run(module, name, launch, args)

    def _run(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        self.function(module, name)(launch.grid, launch.block, args, shared_mem=launch.shared_bytes)

    def gemm_ex(self, g: GemmEx, a: Any, b: Any, c: Any) -> None:
        """cublasGemmEx with ``g``'s arguments on buffers a, b, c (kernels/cuda/blas.py):
        one Python-level launch, counted like a kernel. Not while capturing."""
        if self._keep is not None:
            raise RuntimeError("a GEMM cannot be captured here")
        self.transfers.launches += 1
        self._gemm_ex(g, a, b, c)

    def _gemm_ex(self, g: GemmEx, a: Any, b: Any, c: Any) -> None:
        raise NotImplementedError

    # --- graphs (one Python-level launch for a captured sequence of kernels) ---------------
    supports_graphs = False

    def begin_capture(self) -> None:
        """Launches from here on are captured, not run, until :meth:`end_capture`; buffers
        allocated meanwhile are kept alive by the graph (its kernels write them)."""
        raise NotImplementedError

    def end_capture(self) -> Graph:
        raise NotImplementedError

    def abort_capture(self) -> None:
        """Stop capturing and drop what was captured (nothing of it ran)."""
        raise NotImplementedError

    # --- memory ----------------------------------------------------------------------
    @staticmethod
    def address(a: Any) -> int:
        """Device address of an array's first element."""
        return int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._kept(self.xp.empty(shape, dtype))

    def _kept(self, a: Any) -> Any:
        if self._keep is not None:  # capturing: the graph's kernels own this buffer
            self._keep.append(a)
        return a

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.xp.zeros(shape, dtype)

    def to_device(self, a: np.ndarray, label: str = "") -> Any:
        raise NotImplementedError

    def to_host(self, a: Any, label: str = "") -> np.ndarray:
        raise NotImplementedError

    def write(self, dst: Any, a: np.ndarray, label: str = "") -> None:
        """Copy the host array ``a`` into the device buffer ``dst`` (same size), queued
        behind the work already queued; ``a`` may be rewritten as soon as this returns."""
        raise NotImplementedError

    def read_later(self, a: Any, label: str = "") -> PendingRead:
        """Queue a copy of ``a`` to the host behind the work already queued; see
        :class:`PendingRead`."""
        raise NotImplementedError

    def synchronize(self) -> None:
        pass

    def memory(self) -> tuple[int | None, int | None, int | None]:
        """(used, total, peak) bytes of device memory, None where unknown."""
        return None, None, None

    def release(self) -> None:
        """Give memory no live array holds back to the driver (the pool's cached blocks)."""


class CupyDevice(Device):
    """A real GPU through CuPy. Construct only after :func:`cuda_unavailable_reason` is None."""

    name = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        super().__init__()
        import cupy

        self.xp = cupy
        self._cupy = cupy
        cupy.cuda.Device(device_id).use()
        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        name = props.get("name", b"NVIDIA GPU")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        d = DEFAULT_LIMITS
        grid = props.get("maxGridSize", (d.max_grid_x, d.max_grid_yz, d.max_grid_yz))
        self.limits = DeviceLimits(
            max_threads_per_block=int(props.get("maxThreadsPerBlock", d.max_threads_per_block)),
            max_shared_per_block=int(props.get("sharedMemPerBlock", d.max_shared_per_block)),
            max_grid_x=int(grid[0]),
            max_grid_yz=int(min(grid[1], grid[2])),
            sm_count=int(props.get("multiProcessorCount", d.sm_count)),
        )
        self.properties = props
        self._device_id = device_id
        self._graph_stream: Any = None
        self._prev_stream: Any = None
        self._peak = 0
        self._total: int | None = None

    def _load(self, module: str) -> Any:
        # RawModule compiles lazily at the first get_function; compile() makes it happen at
        # load. CuPy keeps the cubin in its on-disk kernel cache (~/.cupy/kernel_cache), keyed
        # by the source, so later runs skip NVRTC. load_all calls this from worker threads:
        # the device is per thread in CuPy, and the cubin is built for its architecture.
        mod = self._cupy.RawModule(code=kernel_source(module), options=("-std=c++17",))
        with self._cupy.cuda.Device(self._device_id):
            mod.compile()
        return mod

    def _run(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        # CuPy has no None for pointer parameters; an 8-byte zero is the null pointer.
        super()._run(module, name, launch, tuple(np.uint64(0) if a is None else a for a in args))

    def _gemm_ex(self, g: GemmEx, a: Any, b: Any, c: Any) -> None:
        # CuPy's wrapper binds the handle to the current stream, so the GEMM is queued in
        # order with our kernels. alpha and beta are host float32s (COMPUTE_32F's scalar
        # type, the handle's default host pointer mode).
        from cupy.cuda import cublas, device

        one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        cublas.gemmEx(device.get_cublas_handle(), g.transa, g.transb, g.m, g.n, g.k,
                      one.ctypes.data, a.data.ptr, g.a_type, g.lda, b.data.ptr, g.b_type, g.ldb,
                      zero.ctypes.data, c.data.ptr, g.c_type, g.ldc, g.compute,
                      CUBLAS_GEMM_DEFAULT)

    @property
    def supports_graphs(self) -> bool:  # type: ignore[override]
        return not self._cupy.cuda.runtime.is_hip

    def begin_capture(self) -> None:
        # The legacy default stream cannot be captured: capture on a stream of our own,
        # non-blocking so that nothing on the default stream joins the capture. Capturing
        # runs nothing, so no ordering is needed here; replays run on the current stream.
        if self._graph_stream is None:
            self._graph_stream = self._cupy.cuda.Stream(non_blocking=True)
        self._prev_stream = self._cupy.cuda.get_current_stream()
        self._graph_stream.use()
        self._keep = []
        self._graph_stream.begin_capture()

    def _stop_capture(self) -> tuple[Any, list[Any]]:
        keep, self._keep = self._keep or [], None
        try:
            return self._graph_stream.end_capture(), keep
        finally:
            self._prev_stream.use()

    def end_capture(self) -> Graph:
        graph, keep = self._stop_capture()
        return CupyGraph(self, keep, graph)

    def abort_capture(self) -> None:
        if self._keep is None:  # end_capture already stopped it (and raised)
            return
        try:
            self._stop_capture()
        except Exception:  # a capture the runtime already invalidated: nothing to keep
            pass

    def to_device(self, a: np.ndarray, label: str = "") -> Any:
        self.transfers.record("h2d", a.nbytes, label)
        return self._cupy.asarray(a)

    def to_host(self, a: Any, label: str = "") -> np.ndarray:
        self.transfers.record("d2h", a.nbytes, label)
        return self._cupy.asnumpy(a)

    def write(self, dst: Any, a: np.ndarray, label: str = "") -> None:
        # From pageable memory: cudaMemcpyAsync stages ``a`` before it returns, and the
        # copy runs in stream order (after the replay still reading ``dst``).
        self.transfers.record("h2d", a.nbytes, label)
        dst.set(a, stream=self._cupy.cuda.get_current_stream())

    def read_later(self, a: Any, label: str = "") -> PendingRead:
        # Into page-locked memory, so the copy is asynchronous; the event marks its end on
        # the stream, and waiting for it does not wait for kernels queued after the copy.
        import cupyx

        host = cupyx.empty_pinned(a.shape, a.dtype)
        self._cupy.asnumpy(a, out=host, blocking=False)
        done = self._cupy.cuda.get_current_stream().record()
        return PendingRead(self.transfers, host, label, done.synchronize)

    def synchronize(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()

    def memory(self) -> tuple[int | None, int | None, int | None]:
        # Used = bytes of CuPy's pool that live arrays hold (its cached free blocks are
        # reusable and :meth:`release` returns them); total = the device's memory as NVML
        # reports it (nvidia-smi's figure), falling back to the runtime when NVML is missing.
        used = int(self._cupy.get_default_memory_pool().used_bytes())
        self._peak = max(self._peak, used)
        return used, self._total_memory(), self._peak

    def release(self) -> None:
        self.synchronize()  # blocks freed by queued work are free only once it has run
        self._cupy.get_default_memory_pool().free_all_blocks()
        self._cupy.get_default_pinned_memory_pool().free_all_blocks()

    def _total_memory(self) -> int:
        if self._total is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                handle = pynvml.nvmlDeviceGetHandleByIndex(self._device_id)
                self._total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except Exception:  # nvidia-ml-py absent or NVML unusable: ask the runtime
                self._total = int(self._cupy.cuda.runtime.memGetInfo()[1])
        return self._total


def first_line(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def cuda_unavailable_reason() -> str | None:
    """None if CuPy sees an NVIDIA GPU, else one sentence why not. Never raises."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising at import
        return f"cuda: CuPy is not installed ({type(e).__name__})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        text = str(e)
        if "NoDevice" in text:
            return "cuda: no NVIDIA GPU found"
        if "InsufficientDriver" in text or "driver" in text.lower():
            return "cuda: no NVIDIA driver"
        return f"cuda: CUDA runtime unusable ({text.splitlines()[0][:120]})"
    if n < 1:
        return "cuda: no NVIDIA GPU found"
    return None
