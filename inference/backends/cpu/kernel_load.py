"""Cached kernels loaded without refreshing numba's registries.

numba's ``Cache.load_overload`` refreshes the target context before it loads a kernel from
its cache: the first refresh in a process installs every typing and lowering registry
numba has (0.10-0.15 s of one core, measured on the bundled model's load), which only
compiling needs. numba refreshes on its own before any compile (``CompilerBase``) and at a
lowering lookup that misses (``BaseContext.get_function``). A cached kernel needs only the
runtime it links against (NRT), which :func:`_load_overload` initializes. Kernels that
:mod:`.kernel_cache`'s locators do not find (anything outside this repository) keep
numba's own load. Nor do the loads raise numba's "numba:llvm_lock" events: numba hangs
two Python callbacks on llvmlite's lock, run around each of the few hundred LLVM calls a
load makes, to time compiles (:func:`_quiet_llvm_lock`).

Not part of :mod:`.kernel_cache`: every kernel's cache stamp covers that file (and this
one changes nothing a kernel's machine code holds).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from llvmlite.binding import ffi
from numba.core import caching
from numba.core.runtime import rtsys

from inference.backends.cpu.kernel_cache import LOCATORS

_numba_load_overload = caching.Cache.load_overload


def _load_overload(self: caching.Cache, sig: Any, target_context: Any) -> Any:
    """numba's ``Cache.load_overload`` less its refresh, for kernels our locators found."""
    if not isinstance(self._impl.locator, LOCATORS):
        return _numba_load_overload(self, sig, target_context)
    with _quiet_llvm_lock():
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
    return None  # the guard swallowed an I/O error: a miss, as in numba's own


@contextlib.contextmanager
def _quiet_llvm_lock() -> Iterator[None]:
    """llvmlite's calls without the callbacks numba hangs on its lock: each of the few
    hundred LLVM calls a cached kernel's load makes would otherwise raise two numba events
    ("numba:llvm_lock", which only times compiles). Where llvmlite keeps its callbacks
    elsewhere, they stay."""
    lock = getattr(getattr(ffi, "lib", None), "_lock", None)
    callbacks = getattr(lock, "_cblist", None)
    held = getattr(lock, "_lock", None)  # the lock itself, without the callbacks
    if not isinstance(callbacks, list) or not callbacks or held is None:
        yield
        return
    with held:  # no LLVM call is between its two callbacks while the list changes
        kept = callbacks[:]
        callbacks.clear()
    try:
        yield
    finally:
        with held:
            callbacks[:0] = kept


def install() -> None:
    """Load our cached kernels through :func:`_load_overload` from now on (where numba's
    cache has the methods it wraps; otherwise numba's own load stays)."""
    if all(hasattr(caching.Cache, a) for a in ("_guard_against_spurious_io_errors",
                                                "_load_overload")):
        caching.Cache.load_overload = _load_overload
