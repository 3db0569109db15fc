"""Backend registry: probe what can run here, pick one at load, and say why."""

from __future__ import annotations

import ctypes
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inference.backends.base import Backend
from inference.errors import BackendUnavailableError, MissingOpError

# name -> module exposing probe() -> (available, reason) and create() -> Backend.
_MODULES = {
    "cuda": "inference.backends.cuda",
    "mlx": "inference.backends.mlx_backend",
    "cpu": "inference.backends.cpu",
    "numpy": "inference.backends.numpy_backend",
}

# auto order: an NVIDIA GPU, then Metal, then the CPU paths, fastest first. MLX on a CPU
# (Linux) is slower than our numba kernels and NumPy, so without Metal
# it goes last.
AUTO_ORDER_METAL = ("cuda", "mlx", "cpu", "numpy")
AUTO_ORDER_NO_METAL = ("cuda", "cpu", "numpy", "mlx")
ALWAYS_FLOAT = {"F32", "F16", "BF16"}

# (modules ready, modules, the module just ready or "" at the start): a backend that
# compiles kernels as it starts (cuda: NVRTC, the first run on a machine) reports them.
CompileProgress = Callable[[int, int, str], None]


@dataclass
class BackendProbe:
    name: str
    available: bool
    reason: str


def auto_order() -> tuple[str, ...]:
    if sys.platform != "darwin":  # Metal is Apple's: no need to import MLX to know
        return AUTO_ORDER_NO_METAL
    try:
        import mlx.core as mx

        metal = bool(mx.metal.is_available())
    except Exception:  # mlx absent or broken: no Metal either way
        metal = False
    return AUTO_ORDER_METAL if metal else AUTO_ORDER_NO_METAL


def probe(name: str) -> BackendProbe:
    if name not in _MODULES:
        known = ", ".join(_MODULES)
        raise BackendUnavailableError(f"Unknown backend '{name}'; choose one of: auto, {known}.")
    if name == "cuda" and sys.platform.startswith("linux") and not _loads("libcuda.so.1"):
        return BackendProbe(name, False, "no NVIDIA driver")  # not worth importing CuPy
    try:
        mod = importlib.import_module(_MODULES[name])
    except ImportError as e:
        return BackendProbe(name, False, f"not installed ({e.name or e})")
    probe_fn = getattr(mod, "probe", None)
    if probe_fn is None:
        return BackendProbe(name, True, "always available")
    ok, reason = probe_fn()
    return BackendProbe(name, ok, reason.removeprefix(f"{name}: "))


def _loads(library: str) -> bool:
    """Whether the dynamic loader finds ``library`` (milliseconds, where importing the
    backend that needs it costs a tenth of a second)."""
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def probe_all() -> list[BackendProbe]:
    return [probe(n) for n in _MODULES]


def create(name: str, compile_progress: CompileProgress | None = None) -> Backend:
    """A new backend ``name``; ``compile_progress(done, total, module)`` follows the kernel
    modules it compiles as it starts (cuda's NVRTC modules; others compile nothing)."""
    mod = importlib.import_module(_MODULES[name])
    if not hasattr(mod, "create"):
        return mod.NumpyBackend()
    if compile_progress is not None and "compile_progress" in inspect.signature(
            mod.create).parameters:
        return mod.create(compile_progress=compile_progress)
    return mod.create()


def missing_for(backend: Backend, ops: Iterable[str], qtypes: Iterable[str]) -> list[str]:
    """What the backend lacks for a model: op names and quant types, sorted."""
    lacks = sorted(set(ops) - backend.ops())
    lacks += sorted(set(qtypes) - ALWAYS_FLOAT - backend.quant_types())
    return lacks


def select_backend(requested: str, ops: Iterable[str], qtypes: Iterable[str],
                   arch: str = "model", compile_progress: CompileProgress | None = None
                   ) -> tuple[Backend, str]:
    """Pick a backend that has every op and quant type the model needs, before any
    weight moves. Returns the backend and a sentence saying why it was chosen.
    ``compile_progress``: see :func:`create`."""
    ops, qtypes = set(ops), set(qtypes)
    if requested != "auto":
        p = probe(requested)
        if not p.available:
            raise BackendUnavailableError(f"Backend '{requested}' is unavailable: {p.reason}.")
        b = create(requested, compile_progress)
        lacks = missing_for(b, ops, qtypes)
        if lacks:
            raise MissingOpError(
                f"Backend '{requested}' cannot run this {arch} model: it lacks {', '.join(lacks)}."
            )
        return b, f"{requested}: requested ({p.reason})"
    skipped: list[str] = []
    for name in auto_order():
        p = probe(name)
        if not p.available:
            skipped.append(f"{name}: {p.reason}")
            continue
        b = create(name, compile_progress)
        lacks = missing_for(b, ops, qtypes)
        if lacks:
            skipped.append(f"{name}: lacks {', '.join(lacks)}")
            continue
        why = f"{name}: {p.reason}"
        return b, why + (f" (skipped {'; '.join(skipped)})" if skipped else "")
    raise BackendUnavailableError("No backend can run this model: " + "; ".join(skipped) + ".")
