"""numba's import, less two modules it imports for paths a run rarely takes.

numba's import (~170 ms of a fresh process) imports ``yaml``, which ``numba.core.config``
reads only when the working folder holds a ``.numba_config.yaml``, and
``importlib.metadata``, which ``numba.core.entrypoints`` reads only when it scans the
installed packages for numba extensions (before a compile: a cached kernel of ours loads
without it, see ``inference.backends.cpu.kernel_load``): 15-19 ms together. While
:func:`import_numba` imports numba, an import of either that is not imported yet and
exists gets a :class:`StandIn`, which imports the module itself at the first read of a
name the module defines: then the module replaces the stand-in in ``sys.modules`` (and as
its package's attribute), and the stand-in takes on its names. Code that imported neither
before numba sees no difference but the time; nothing else is deferred.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

DEFERRED = ("yaml", "importlib.metadata")
_importing = threading.Lock()  # numba's import with the finder in place
_resolving = threading.Lock()  # a stand-in's module imported


class StandIn(types.ModuleType):
    """A deferred module until a name is read from it (see the module's description)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_import_for(self), name)

    @property  # type: ignore[override]
    def __path__(self) -> Any:
        """None while the import system sets the stand-in up (it asks, then sets only what
        the spec names); then the module's own, imported for it."""
        if self.__dict__.get("_deferred_setting_up"):
            return None
        return _import_for(self).__path__


def _import_for(stand_in: StandIn) -> types.ModuleType:
    """The module ``stand_in`` stands for, imported now (once), its names copied in."""
    with _resolving:
        real = stand_in.__dict__.get("_deferred_module")
        if real is None:
            key = stand_in.__spec__.name
            if sys.modules.get(key) is stand_in:
                del sys.modules[key]
            _FINDER.imported.add(key)  # never stood in for again
            real = importlib.import_module(key)
            vars(stand_in).update(vars(real))
            stand_in.__dict__["_deferred_module"] = real
        return real


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> StandIn:
        module = StandIn(spec.name)
        module.__dict__["_deferred_setting_up"] = True
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.pop("_deferred_setting_up", None)


class _Finder(importlib.abc.MetaPathFinder):
    """Stand-ins for :data:`DEFERRED` modules while :attr:`active` (those that exist)."""

    def __init__(self) -> None:
        self.active = False
        self.imported: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not self.active or fullname not in DEFERRED or fullname in self.imported:
            return None
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        if found is None:  # not installed: the import fails as it would have
            return None
        return importlib.util.spec_from_loader(fullname, _Loader(), origin=found.origin)


_FINDER = _Finder()


def import_numba() -> types.ModuleType:
    """``import numba``, with :data:`DEFERRED` modules imported at their first use (a no-op
    once numba is imported; ImportError where numba is not installed)."""
    numba = sys.modules.get("numba")
    if numba is not None:
        return numba
    with _importing:
        sys.meta_path.insert(0, _FINDER)
        _FINDER.active = True
        try:
            import numba
        finally:
            _FINDER.active = False
            sys.meta_path.remove(_FINDER)
            for name in DEFERRED:  # a later import of either is an ordinary one
                stand_in = sys.modules.get(name)
                if isinstance(stand_in, StandIn):
                    del sys.modules[name]
                    parent, _, child = name.rpartition(".")
                    if parent and getattr(sys.modules.get(parent), child, None) is stand_in:
                        delattr(sys.modules[parent], child)
    return numba
