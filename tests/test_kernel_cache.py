"""A cached kernel is recompiled when a file it imports changes, not only its own file.

numba stamps a cached kernel with its own source file alone; the kernel's machine code also
holds what it reads from other modules, so an update touching only those loaded stale code
(a segfault in the CPU backend's products). Each case runs fresh interpreters against one
numba cache folder, as an update followed by a start would.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inference.backends.cpu import kernel_cache, matvec_int

REPO = Path(__file__).resolve().parents[1]

# Loads kernel_cache.py on its own (not the CPU backend), roots it at the temporary
# repository, installs its locators unless told not to, and prints the kernel's result.
RUN = textwrap.dedent("""
    import importlib.util, sys
    from pathlib import Path
    root, ours = Path(sys.argv[1]), sys.argv[2] == "ours"
    spec = importlib.util.spec_from_file_location("kc", sys.argv[3])
    kc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kc)
    kc.ROOT, kc.PACKAGES = root, ("pkgx",)
    if ours:
        kc.install()
    sys.path.insert(0, str(root))
    from pkgx.kernel import scaled
    print(scaled(1.0))
""")


def _run(root: Path, cache: Path, which: str) -> str:
    env = {"NUMBA_CACHE_DIR": str(cache), "PATH": "", "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", RUN, str(root), which,
                          str(REPO / "inference/backends/cpu/kernel_cache.py")],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("which, after_update", [("ours", "3.0"), ("numba", "2.0")])
def test_a_dependency_update_reaches_the_cached_kernel(tmp_path: Path, which: str,
                                                       after_update: str) -> None:
    # "numba" is the control: numba's own stamp keeps the stale kernel, so the case
    # with our locators can tell the two apart.
    pkg = tmp_path / "repo" / "pkgx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "constants.py").write_text("SCALE = 2.0\n")
    (pkg / "kernel.py").write_text(textwrap.dedent("""
        from numba import njit
        from pkgx.constants import SCALE

        @njit(cache=True)
        def scaled(x):
            return x * SCALE
    """))
    cache = tmp_path / "cache"
    assert _run(tmp_path / "repo", cache, which) == "2.0"
    assert any(cache.rglob("*.nbi"))  # the kernel was cached
    (pkg / "constants.py").write_text("SCALE = 3.0\n")  # the update: kernel.py unchanged
    assert _run(tmp_path / "repo", cache, which) == after_update


def test_kernel_stamps_cover_the_files_they_import() -> None:
    files = {p.relative_to(kernel_cache.ROOT).as_posix()
             for p in kernel_cache.closure(Path(matvec_int.__file__))}
    assert {"inference/backends/cpu/matvec_int.py", "inference/backends/cpu/ir.py",
            "inference/backends/cpu/layout.py", "inference/backends/cpu/quantize.py"} <= files
    assert "inference/backends/cpu/backend.py" not in files  # only what it imports
    locator = matvec_int.linear_packed_int._cache._impl.locator
    assert isinstance(locator, kernel_cache.LOCATORS)
