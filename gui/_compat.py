"""Work around a reference-count bug of PySide6/shiboken6 6.12 on CPython < 3.12.

shiboken6 6.12 returns ``None`` from every void method and ``True`` from ``Signal.emit``
without taking a reference. On CPython 3.12+ those singletons are immortal, so nothing
happens; on 3.11 each call drains one reference and the process aborts with
"Fatal Python error: none_dealloc" (or bool_dealloc) within seconds of painting graphs.
Here we give those singletons a reference count no program can drain (emulating 3.12's
immortality). The real fix is pinning ``PySide6-Essentials!=6.12.0``; this keeps the app
alive wherever that pin is missing.
"""

from __future__ import annotations

import ctypes
import sys

_BUMP = 1 << 60  # far below Py_ssize_t's limit; at a million drains a second, 36 000 years


def needs_patch(python: tuple[int, int], shiboken: tuple[int, int]) -> bool:
    return python < (3, 12) and shiboken == (6, 12)


def apply() -> bool:
    """Make None/True/False effectively immortal if this runtime has the bug."""
    if sys.implementation.name != "cpython":
        return False
    try:
        import shiboken6
    except ImportError:
        return False
    version = tuple(getattr(shiboken6, "__version_info__", (0, 0))[:2])
    if not needs_patch(sys.version_info[:2], version):
        return False
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt is the first field
        if refcnt.value < _BUMP:
            refcnt.value += _BUMP
    return True


PATCHED = apply()
