"""A cached kernel loads without numba's registry refresh, and computes as before."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import numpy as np
from numba.core import base

calls = []
real = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: (calls.append(1), real(self))[1]
from importlib import metadata  # noqa: E402

scans = []
entry_points = metadata.entry_points
metadata.entry_points = lambda **kw: (scans.append(1), entry_points(**kw))[1]

from inference.backends.cpu import CpuBackend, fused  # noqa: E402 (after the spy)

x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
out = np.empty_like(x)
fused.rms_norm_rows(x, w, 1e-6, out)
want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * w
np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
print("hits", sum(fused.rms_norm_rows.stats.cache_hits.values()), "refreshes", len(calls),
      "scans", len(scans))
"""


def test_a_cached_kernel_loads_without_a_refresh() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    hits, refreshes, scans = (int(v) for v in out.stdout.split()[1::2])
    # A tree whose kernels are not compiled yet compiles this one: numba refreshes then,
    # and loads its extensions (the installed packages' entry points scanned) there.
    assert (refreshes, scans) == (0, 0) or hits == 0, out.stdout


def test_prepare_tells_the_head_types_from_the_layers():
    """The types prepare readies a prefill for are the layers' own; a type only the
    embedding table and output head hold gets decode rows, and the lookup is the table's."""
    from types import SimpleNamespace

    from inference.backends.cpu import CpuBackend
    from inference.backends.cpu.warm import zero_weight

    b = CpuBackend()
    table, proj, norm = (b.weight(zero_weight(q)) for q in ("Q8_0", "Q4_1", "F32"))
    model = SimpleNamespace(embed_tokens=table, lm_head=table, layers=[proj, norm])
    assert b._weight_roles(model) == ({"Q4_1", "F32"}, {"Q8_0"}, "Q8_0")
    assert b._weight_types == {}  # emptied: what prepare's own zero weights add goes too
    # A model without an embed_tokens table: every loaded type, as before.
    b.weight(zero_weight("Q4_1"))
    assert b._weight_roles(SimpleNamespace()) == ({"Q8_0", "Q4_1", "F32"}, set(), None)


LOCK_SCRIPT = r"""
import numpy as np
from llvmlite import binding as llvm
from llvmlite.binding import ffi
from numba.core import event

from inference.backends.cpu import fused


class Count(event.Listener):
    n = 0

    def on_start(self, ev):
        Count.n += 1

    def on_end(self, ev):
        pass


event.register("numba:llvm_lock", Count())
callbacks = list(ffi.lib._lock._cblist)
x = np.ones((3, 64), np.float32)
fused.rms_norm_rows(x, np.ones(64, np.float32), 1e-6, np.empty_like(x))
during = Count.n
llvm.get_process_triple()  # an LLVM call after the load: numba's callbacks are back
print("hits", sum(fused.rms_norm_rows.stats.cache_hits.values()), "during", during,
      "after", Count.n - during, "same", ffi.lib._lock._cblist == callbacks)
"""


def test_a_cached_kernel_loads_without_numbas_llvm_lock_events() -> None:
    """numba raises two events around every LLVM call (to time compiles); a cached load's
    few hundred calls raise none, and the callbacks are back once it is loaded."""
    out = subprocess.run([sys.executable, "-c", LOCK_SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    hits, during, after, same = out.stdout.split()[1::2]
    assert same == "True" and int(after) >= 1, out.stdout
    # A tree whose kernels are not compiled yet compiles this one: events run then.
    assert int(during) == 0 or int(hits) == 0, out.stdout


BITCODE_SCRIPT = r"""
import numba
import numpy as np

from inference.backends.cpu import fused, kernel_load

read = []  # the symbols each load read from machine code
real = kernel_load.defined_symbols
kernel_load.defined_symbols = lambda code: (read.append(real(code)), read[-1])[1]

x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
w = np.linspace(0.5, 1.5, 64, dtype=np.float32)
out = np.empty_like(x)
fused.rms_norm_rows(x, w, 1e-6, out)
hits = sum(fused.rms_norm_rows.stats.cache_hits.values())
(cres,) = fused.rms_norm_rows.overloads.values()
lib = cres.library
unparsed = lib._shared_module is None and isinstance(lib.__dict__.get("_unparsed_bitcode"), bytes)
engine = lib.codegen._engine
entry = engine.is_symbol_defined(cres.fndesc.llvm_func_name)
symbols = read[-1] if read else None


@numba.njit
def twice(x, w, out):  # a compile that links the loaded kernel: its bitcode is read then
    fused.rms_norm_rows(x, w, 1e-6, out)
    return out * 2


linked = np.allclose(twice(x, w, np.empty_like(x)), 2 * out)
module = lib._get_module_for_linking()
from_bitcode = {g.name for gs in (module.functions, module.global_variables) for g in gs
                if not g.is_declaration}
print("hits", hits, "unparsed", unparsed, "entry", entry, "linked", linked,
      "same", not unparsed or symbols == from_bitcode)
"""


def test_a_cached_kernel_loads_without_parsing_its_bitcode() -> None:
    """A cached kernel of ours loads its machine code alone: the bitcode kept beside it
    stays unparsed until a compile links the kernel into another (which then computes
    as the kernel does), and the symbols the engine learns from the machine code are the
    ones numba reads from the bitcode."""
    out = subprocess.run([sys.executable, "-c", BITCODE_SCRIPT], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    fields = dict(zip(out.stdout.split()[::2], out.stdout.split()[1::2], strict=True))
    assert fields["entry"] == "True" and fields["linked"] == "True", out.stdout
    assert fields["same"] == "True", out.stdout
    # A tree whose kernels are not compiled yet compiles this one: nothing is loaded then.
    assert fields["unparsed"] == "True" or fields["hits"] == "0", out.stdout


def test_defined_symbols_reads_elf_objects_only() -> None:
    from inference.backends.cpu.kernel_load import defined_symbols

    assert defined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None  # Mach-O: numba's own
    assert defined_symbols(b"\x7fELF\x02\x01" + bytes(10)) is None  # cut short


def test_a_kernel_of_ours_opens_its_cache_at_first_use() -> None:
    """Decorating a kernel of this repository leaves its cache unopened (numba's checks of
    the cache folders and the source stamp cost ~0.4 ms a kernel at import); the first use
    opens numba's own, with our locator, in its place. Other functions keep numba's."""
    import numba
    from numba.core.caching import FunctionCache

    from inference.backends.cpu import fused
    from inference.backends.cpu.kernel_cache import LOCATORS
    from inference.backends.cpu.kernel_load import CacheOnFirstUse

    ours = numba.njit(cache=True)(fused.rms_norm_rows.py_func)
    assert isinstance(ours._cache, CacheOnFirstUse)
    assert isinstance(ours._cache._impl.locator, LOCATORS)  # the first use opens it
    assert isinstance(ours._cache, FunctionCache)

    def theirs(x: float) -> float:  # a test's function: not this repository's
        return x + 1.0

    assert isinstance(numba.njit(cache=True)(theirs)._cache, FunctionCache)


def test_a_kernel_load_rebuilds_numbas_library_environments_without_their_modules() -> None:
    """As one of our kernels loads, the environment of a numba library function compiled into it
    (NumPy's dtype lowering, in numba.np.npyimpl: 50-60 ms of imports) is rebuilt without
    importing the function's module, which only object-mode code would read; outside such a
    load, and for modules already imported, numba rebuilds it as before."""
    from numba.core import environment

    from inference.backends.cpu import kernel_load

    name = "numba.np.not_a_module_of_numbas"
    kernel_load._loading.ours = True
    try:
        env = environment._rebuild_env(name, [1.5], "_ZN08NumbaEnv_test_library")
    finally:
        kernel_load._loading.ours = False
    assert env.globals == {"__name__": name} and list(env.consts) == [1.5]
    assert environment.lookup_environment("_ZN08NumbaEnv_test_library") is env
    import pytest

    with pytest.raises(ImportError):  # not loading a kernel of ours: numba's own
        environment._rebuild_env(name, [], "_ZN08NumbaEnv_test_other")
    kernel_load._loading.ours = True
    try:  # an imported module: its real globals
        env = environment._rebuild_env("numba.core.environment", [], "_ZN08NumbaEnv_test_real")
    finally:
        kernel_load._loading.ours = False
    assert env.globals is environment.__dict__


def test_an_array_argument_is_typed_as_numba_types_it_without_numpy_ma() -> None:
    """A kernel's array argument whose class is ndarray is typed without numba's masked-array
    check (which imports numpy.ma, 13 ms of a first load), as numba types it; a masked
    array and a dtype numba has no type for keep numba's errors."""
    import numpy as np
    import pytest
    from numba.core import errors
    from numba.core.typing import typeof

    from inference.backends.cpu import kernel_load

    assert typeof.typeof_impl.dispatch(np.ndarray) is kernel_load._typeof_ndarray
    base = np.zeros((4, 6), np.float32)
    frozen = np.zeros(3, np.uint8)
    frozen.flags.writeable = False
    for a in (base, base.T, base[:, ::2], frozen, np.array([object()]), np.zeros(2, "M8[s]")):
        assert typeof.typeof(a) == kernel_load._numba_typeof_ndarray(a, None)
    with pytest.raises(errors.NumbaTypeError):
        typeof.typeof(np.ma.masked_array([1.0, 2.0]))
    with pytest.raises(errors.NumbaValueError):
        typeof.typeof(np.zeros(2, ">f4" if np.little_endian else "<f4"))  # swapped bytes


RUNTIME_SCRIPT = r"""
import numba
import numpy as np
from numba.core.runtime import nrtdynmod

built = []
real = nrtdynmod.create_nrt_module
nrtdynmod.create_nrt_module = lambda ctx: (built.append(1), real(ctx))[1]

from inference.backends.cpu import fused  # noqa: E402 (after the spy)

x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
out = np.empty_like(x)
fused.rms_norm_rows(x, np.ones(64, np.float32), 1e-6, out)  # the runtime, at the first load


@numba.njit
def allocates(n):  # compiled now: links the runtime's functions, allocates through them
    return (np.arange(n) * 2.0).sum()


assert allocates(10) == 90.0
print("built", len(built))
"""


def test_numbas_runtime_is_compiled_once_then_read_back(tmp_path) -> None:
    """The runtime's LLVM functions (compiled at every process's first kernel load, ~20 ms)
    are kept in the weight cache by the first process and read back by the next, which
    still compiles and runs a kernel that allocates through them."""
    import os

    env = {**os.environ, "INFERDESK_WEIGHT_CACHE": str(tmp_path)}
    built = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", RUNTIME_SCRIPT], capture_output=True,
                             text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        built.append(int(out.stdout.split()[-1]))
    assert built == [1, 0]
    assert list((tmp_path / "runtime").iterdir())


def test_two_savers_of_one_kernels_signatures_keep_both(tmp_path) -> None:
    """Two processes that compile different signatures of one kernel at once (the app and
    the server, two test workers) each read the kernel's index before saving: numba's own
    save let the second's index overwrite the first's (both numbered ``.1.nbc``), so an
    entry went missing or named the other's machine code. Here the first saver stops
    between reading the index and writing, while the second saves."""
    import threading

    from numba.core import caching

    def cache_file() -> caching.IndexDataCacheFile:  # as one process's cache of the kernel
        return caching.IndexDataCacheFile(str(tmp_path), "kernel-12.py311", "stamp")

    first, second = cache_file(), cache_file()
    read, go = threading.Event(), threading.Event()
    load_index = first._load_index

    def load_then_wait() -> dict:
        overloads = load_index()
        read.set()
        go.wait(60)
        return overloads

    first._load_index = load_then_wait
    a = threading.Thread(target=first.save, args=(("sig-a", "cpu"), "code-a"))
    a.start()
    assert read.wait(60)
    b = threading.Thread(target=second.save, args=(("sig-b", "cpu"), "code-b"))
    b.start()
    b.join(0.5)  # an unlocked save ends here; a locked one waits for the first saver
    go.set()
    a.join(60)
    b.join(60)
    assert not a.is_alive() and not b.is_alive()
    fresh = cache_file()
    assert fresh.load(("sig-a", "cpu")) == "code-a"
    assert fresh.load(("sig-b", "cpu")) == "code-b"
