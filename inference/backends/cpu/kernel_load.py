"""Cached kernels loaded without refreshing numba's registries.

numba's ``Cache.load_overload`` refreshes the target context before it loads a kernel from
its cache: the first refresh in a process installs every typing and lowering registry
numba has (0.10-0.15 s of one core, measured on the bundled model's load), which only
compiling needs. numba refreshes on its own before any compile (``CompilerBase``) and at a
lowering lookup that misses (``BaseContext.get_function``). A cached kernel needs only the
runtime it links against (NRT), which :func:`_load_overload` initializes. Kernels that
:mod:`.kernel_cache`'s locators do not find (anything outside this repository) keep
numba's own load.

Not part of :mod:`.kernel_cache`: every kernel's cache stamp covers that file (and this
one changes nothing a kernel's machine code holds).
"""

from __future__ import annotations

from typing import Any

from numba.core import caching
from numba.core.runtime import rtsys

from inference.backends.cpu.kernel_cache import LOCATORS

_numba_load_overload = caching.Cache.load_overload


def _load_overload(self: caching.Cache, sig: Any, target_context: Any) -> Any:
    """numba's ``Cache.load_overload`` less its refresh, for kernels our locators found."""
    if not isinstance(self._impl.locator, LOCATORS):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)
    return None  # the guard swallowed an I/O error: a miss, as in numba's own


def install() -> None:
    """Load our cached kernels through :func:`_load_overload` from now on (where numba's
    cache has the methods it wraps; otherwise numba's own load stays)."""
    if all(hasattr(caching.Cache, a) for a in ("_guard_against_spurious_io_errors",
                                                "_load_overload")):
        caching.Cache.load_overload = _load_overload
