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
load makes, to time compiles (:func:`_quiet_llvm_lock`). Nor do they parse the LLVM bitcode
numba keeps beside each kernel's machine code (a third of a load's time): only a compile
that links the kernel into another reads it (:func:`_module_for_linking`), and the symbols
the bitcode would name are read from the machine code's symbol table (:func:`_unserialize`).
Nor does a load import the numba modules whose compiled library functions a kernel links
in (NumPy's ``dtype`` and ``searchsorted`` lowerings in the parallel attention kernel:
``numba.np.npyimpl``, which fills numba's whole ufunc table as it is imported, and
``numba.np.arraymath``, 50-60 ms): numba rebuilds each such function's environment from
its module's globals, which only object-mode code reads (:func:`_rebuild_env`).
Nor does the first load compile numba's runtime (NRT: its atomic reference counts and
memory-info accessors, an LLVM module of its own, ~20 ms at every process's first kernel):
its machine code is kept beside the packed weights, keyed by numba's and llvmlite's
versions and the CPU numba compiles for, and loaded as a kernel's is
(:func:`_compile_nrt_functions`).
Nor does the first call of a kernel import ``numpy.ma`` (13 ms): numba types an array
argument it has not seen the like of through ``typeof``, whose check that it is no masked
array reads ``np.ma``; an array whose class is ``ndarray`` itself is none
(:func:`_typeof_ndarray`).
Nor does a kernel's first call scan the installed packages for numba extensions (6-8 ms:
numba's dispatch hook runs ``entrypoints.init_all`` before it types the arguments): the
target context's refresh, which numba runs before any compile, loads them, and a cached
kernel of ours types only arrays and numbers (:func:`_extensions_at_compile`).
Nor does decorating a kernel of ours open its cache: numba's ``enable_caching`` builds a
``FunctionCache`` (the locators' checks of the cache folders, the source stamp, the index
names) for every ``cache=True`` kernel as its module is imported, ~0.4 ms each for the
92 kernels, where a process runs a few dozen of them; :func:`_enable_caching` leaves a
:class:`CacheOnFirstUse` instead, which builds numba's cache when something first asks
it for anything (the kernel's first call looks its signature up there).

Nor do two processes saving kernels into one cache lose or swap them (the app and the
server, a parallel test run): numba's save of a new kernel reads the function's index,
numbers the machine code after the entries it holds and writes the index back, so two
processes compiling different signatures of one kernel at once could both write ``.1.nbc``,
the index written last naming the other's code, or drop an entry. :func:`_save` holds a lock
beside the index over the whole update and writes the code before the index names it.

Not part of :mod:`.kernel_cache`: every kernel's cache stamp covers that file (and this
one changes nothing a kernel's machine code holds).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
from llvmlite import binding as ll
from llvmlite.binding import ffi
from numba.core import caching, codegen, dispatcher, environment, types
from numba.core.errors import NumbaNotImplementedError
from numba.core.runtime import nrtdynmod, rtsys
from numba.core.typing import typeof
from numba.np import numpy_support

try:
    import fcntl
except ImportError:  # Windows: numba's own save
    fcntl = None

from inference.backends.cpu.kernel_cache import LOCATORS, _ours

_numba_load_overload = caching.Cache.load_overload
_numba_unserialize = codegen.CPUCodeLibrary._unserialize
_numba_module_for_linking = codegen.CPUCodeLibrary._get_module_for_linking
_numba_enable_caching = dispatcher.Dispatcher.enable_caching
_numba_rebuild_env = environment._rebuild_env
_numba_typeof_ndarray = typeof.typeof_impl.dispatch(np.ndarray)
_numba_compile_nrt_functions = nrtdynmod.compile_nrt_functions
_numba_save = caching.IndexDataCacheFile.save
_loading = threading.local()  # .ours: this thread is in _load_overload for our locators
# Whether a source file is ours, once a file: the 92 kernels decorated at import are
# defined in 13 files, and each answer resolves the path (a few stats).
is_ours = functools.lru_cache(maxsize=None)(_ours)


def _load_overload(self: caching.Cache, sig: Any, target_context: Any) -> Any:
    """numba's ``Cache.load_overload`` less its refresh, for kernels our locators found."""
    if not isinstance(self._impl.locator, LOCATORS):
        return _numba_load_overload(self, sig, target_context)
    with _quiet_llvm_lock():
        rtsys.initialize(target_context)
        _loading.ours = True
        try:
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)
        finally:
            _loading.ours = False
    return None  # the guard swallowed an I/O error: a miss, as in numba's own


def _rebuild_env(modname: str, consts: Any, env_name: str) -> Any:
    """numba's ``_rebuild_env`` (what a cached kernel's pickled environments call), less
    importing a numba module not imported yet as one of our kernels loads: the environment
    of a numba library function compiled into the kernel takes a stand-in for that module's
    globals, holding its name. numba's compiled library functions are nopython code, which
    reads only an environment's constants; only object-mode code reads its globals. Any
    other environment is numba's own."""
    if (getattr(_loading, "ours", False) and modname.startswith("numba.")
            and modname not in sys.modules
            and environment.lookup_environment(env_name) is None):
        env = environment.Environment({"__name__": modname})
        env.consts[:] = consts
        env.env_name = env_name
        environment.Environment._memo[env_name] = env
        return env
    return _numba_rebuild_env(modname, consts, env_name)


def _runtime_key(codegen_: Any) -> str:
    """What the runtime's machine code depends on: the compiler's versions and target."""
    import llvmlite
    import numba

    return f"nrt|{numba.__version__}|{llvmlite.__version__}|{codegen_.magic_tuple()}"


def _compile_nrt_functions(ctx: Any) -> Any:
    """numba's ``compile_nrt_functions`` (the runtime's LLVM functions, which ``rtsys``
    compiles once a process), read back from the weight cache where an earlier process
    kept its machine code; else compiled as numba does, and kept."""
    from inference.formats.cache import key_path, load_pickle, save_pickle

    codegen_ = ctx.codegen()
    path = key_path("runtime", _runtime_key(codegen_))
    state = load_pickle(path)
    if isinstance(state, tuple) and len(state) == 3 and state[1] == "object":
        _loading.ours = True  # the machine code's symbols are read as a kernel's
        try:
            return codegen_.unserialize_library(state)
        except Exception:  # noqa: BLE001 (llvmlite raises plain errors): compiled below
            pass
        finally:
            _loading.ours = False
    ir_mod, library = nrtdynmod.create_nrt_module(ctx)
    library.enable_object_caching()
    library.add_ir_module(ir_mod)
    library.finalize()
    save_pickle(path, library.serialize_using_object_code())
    return library


def _typeof_ndarray(val: np.ndarray, c: Any) -> Any:
    """numba's type of an array argument, less the masked-array check for an array whose
    class is ``ndarray`` itself (a subclass, or a dtype numba has no type for, takes
    numba's own, with its errors)."""
    if type(val) is np.ndarray:
        try:
            dtype = numpy_support.from_dtype(val.dtype)
        except NumbaNotImplementedError:
            pass
        else:
            return types.Array(dtype, val.ndim, numpy_support.map_layout(val),
                               readonly=not val.flags.writeable)
    return _numba_typeof_ndarray(val, c)


def _unserialize(cls: type, codegen_: Any, state: tuple[str, str, Any]) -> Any:
    """numba's ``CPUCodeLibrary._unserialize`` of a cached kernel of ours, less parsing the
    bitcode: the library takes the machine code as numba's does, keeps the bitcode unparsed
    for :func:`_module_for_linking`, and the execution engine learns the symbols it defines
    from the machine code's symbol table. Other kernels, other forms, and machine code whose
    symbol table :func:`defined_symbols` cannot read keep numba's own."""
    name, kind, data = state
    symbols = None
    if (kind == "object" and getattr(_loading, "ours", False)
            and isinstance(getattr(codegen_._engine, "_defined_symbols", None), set)):
        symbols = defined_symbols(data[0])
    if symbols is None:
        return _numba_unserialize.__func__(cls, codegen_, state)
    object_code, bitcode = data
    self = codegen_.create_library(name)
    self.enable_object_caching()
    self._set_compiled_object(object_code)
    self._unparsed_bitcode = bitcode
    self._finalize_final_module()
    codegen_._engine._defined_symbols |= symbols
    return self


def _module_for_linking(self: Any) -> Any:
    """numba's ``_get_module_for_linking``, parsing first the bitcode :func:`_unserialize`
    kept (a compile links the kernel into another, or saves it)."""
    bitcode = self.__dict__.pop("_unparsed_bitcode", None)
    if bitcode is not None:
        self._shared_module = ll.parse_bitcode(bitcode)
    return _numba_module_for_linking(self)


_ELF_HEADER = struct.Struct("<4sBB")  # magic, class (2: 64-bit), data (1: little-endian)
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section, value, size
_SYMTAB = 2  # section type
_SECTION_OR_FILE = (3, 4)  # symbol types that name no function or variable


def defined_symbols(object_code: bytes) -> set[str] | None:
    """The names of the functions and variables a relocatable ELF64 little-endian object
    defines (in a section: not undefined), as numba reads them from the module's bitcode;
    None for any other object format or a table it cannot read."""
    try:
        magic, elf_class, order = _ELF_HEADER.unpack_from(object_code, 0)
        if magic != b"\x7fELF" or elf_class != 2 or order != 1:
            return None
        (shoff,) = struct.unpack_from("<Q", object_code, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", object_code, 0x3A)
        sections = [_SECTION.unpack_from(object_code, shoff + i * shentsize)
                    for i in range(shnum)]
        names: set[str] = set()
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != _SYMTAB:
                continue
            strings = sections[link][4]
            for at in range(offset, offset + size, entsize or _SYMBOL.size):
                name, info, _, section, _, _ = _SYMBOL.unpack_from(object_code, at)
                if name and section and info & 0xF not in _SECTION_OR_FILE:
                    start = strings + name
                    names.add(object_code[start:object_code.index(b"\0", start)].decode())
        return names
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None


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


class CacheOnFirstUse:
    """A dispatcher's cache until it is first used: then numba's own (``enable_caching``),
    which takes this one's place on the dispatcher and answers this and every later use."""

    __slots__ = ("_dispatcher",)

    def __init__(self, owner: Any) -> None:
        self._dispatcher = owner

    def __getattr__(self, name: str) -> Any:
        owner = self._dispatcher
        if owner._cache is self:  # two threads' first calls: the cache is made once
            with _opening:
                if owner._cache is self:
                    _numba_enable_caching(owner)
        return getattr(owner._cache, name)


_opening = threading.Lock()


def _extensions_at_compile() -> None:
    """A kernel of ours's dispatch hook: numba's extensions are not loaded before its
    arguments are typed, only by the refresh that precedes a compile."""


def _enable_caching(self: Any) -> None:
    """numba's ``Dispatcher.enable_caching``, deferred to the cache's first use
    (:class:`CacheOnFirstUse`) for kernels of this repository, whose dispatch hook
    becomes :func:`_extensions_at_compile`."""
    code = getattr(getattr(self, "py_func", None), "__code__", None)
    if code is not None and is_ours(code.co_filename):
        self._cache = CacheOnFirstUse(self)
        if hasattr(self, "_compilation_chain_init_hook"):
            self._compilation_chain_init_hook = _extensions_at_compile
    else:
        _numba_enable_caching(self)


@contextlib.contextmanager
def _locked(index_path: str) -> Iterator[None]:
    """An exclusive lock on the lock file beside ``index_path``, held by one open file at a
    time (other processes and threads wait), released as the file closes."""
    with open(index_path + ".lock", "ab") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _save(self: caching.IndexDataCacheFile, key: Any, data: Any) -> None:
    """numba's ``IndexDataCacheFile.save`` under :func:`_locked`: read the index, write the
    machine code under a name none of its entries holds (or the key's own), then the index;
    no other process reads the index to save a kernel in between."""
    with _locked(self._index_path):
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            held = set(overloads.values())
            name = next(n for n in map(self._data_name, itertools.count(1)) if n not in held)
        self._save_data(name, data)  # whoever finds the entry finds its code
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)


def install() -> None:
    """Load our cached kernels through :func:`_load_overload` from now on (where numba's
    cache has the methods it wraps; otherwise numba's own load stays), their machine code
    through :func:`_unserialize` (where numba's code library has what it sets), and open
    their caches at first use (:func:`_enable_caching`); every numba cache saves through
    :func:`_save` (where its index file has the methods it calls). Before the first kernel is
    decorated: the package's ``__init__`` runs it."""
    if dispatcher.Dispatcher.enable_caching is _numba_enable_caching:
        dispatcher.Dispatcher.enable_caching = _enable_caching
    if environment._rebuild_env is _numba_rebuild_env:  # what cached kernels' pickles name
        environment._rebuild_env = _rebuild_env
    if (nrtdynmod.compile_nrt_functions is _numba_compile_nrt_functions
            and hasattr(nrtdynmod, "create_nrt_module")):
        nrtdynmod.compile_nrt_functions = _compile_nrt_functions
    if fcntl is not None and caching.IndexDataCacheFile.save is _numba_save and all(
            hasattr(caching.IndexDataCacheFile, a)
            for a in ("_load_index", "_data_name", "_save_data", "_save_index")):
        caching.IndexDataCacheFile.save = _save
    if typeof.typeof_impl.dispatch(np.ndarray) is _numba_typeof_ndarray:
        typeof.typeof_impl.register(np.ndarray)(_typeof_ndarray)
    if all(hasattr(caching.Cache, a) for a in ("_guard_against_spurious_io_errors",
                                                "_load_overload")):
        caching.Cache.load_overload = _load_overload
    library = codegen.CPUCodeLibrary
    if all(hasattr(library, a) for a in ("enable_object_caching", "_set_compiled_object",
                                         "_finalize_final_module")):
        library._unserialize = classmethod(_unserialize)
        library._get_module_for_linking = _module_for_linking
