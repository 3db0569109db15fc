"""Compile a .cu file for the host: g++, the emulation header, a launch shim; cached by hash.

The shared object is keyed by a hash of everything that affects it (the compiler's version,
the flags, the .cu file and every header beside it and beside the emulator), so a clean
checkout compiles once and later runs load from the cache directory.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kernels.cuda.device import CUDA_DIR  # common.cuh and quants.cuh, for sources anywhere

EMU_DIR = Path(__file__).resolve().parent
HEADER = EMU_DIR / "cuda_emu.h"
# -O2: emulated kernels run ~2x faster than at -O1, which pays for the longer cold build
# (once per source hash). Warnings are the nvcc check's business.
CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-fno-strict-aliasing", "-w")

_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\(([^)]*)\)\s*)?(\w+)\s*\('
)


class EmulatorUnavailable(RuntimeError):
    """No host C++ compiler: the emulator cannot run here."""


def cache_dir() -> Path:
    env = os.environ.get("INFERDESK_KERNEL_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = (base if env else base / "inferdesk" / "kernels") / "emulator"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def compiler() -> tuple[str, str]:
    """(path, version line) of the host C++ compiler."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise EmulatorUnavailable("no host C++ compiler (g++) on PATH")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return cxx, version.splitlines()[0] if version else "?"


def _digest(source: Path) -> str:
    h = hashlib.sha256()
    h.update(compiler()[1].encode())
    h.update(" ".join(CXXFLAGS).encode())
    headers = {*source.parent.glob("*.cuh"), *CUDA_DIR.glob("*.cuh"), *EMU_DIR.glob("*.h")}
    files = [source, *sorted(headers)]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:20]


def _bound(expr: str | None) -> int:
    """The first __launch_bounds__ argument after preprocessing, e.g. '256' or '(4*32)'."""
    if not expr:
        return 0
    first = expr.split(",")[0].strip()
    if not re.fullmatch(r"[\d\s()*+\-]+", first):
        raise ValueError(f"cannot evaluate __launch_bounds__({expr})")
    return int(eval(first, {"__builtins__": {}}))  # digits and + - * ( ) only


def scan_kernels(source: Path) -> dict[str, int]:
    """Kernel names -> __launch_bounds__ (0 if none), from the preprocessed source."""
    cxx, _ = compiler()
    out = subprocess.run(
        [cxx, "-E", "-P", "-x", "c++", "-std=c++17", "-DEMU_SCAN", "-I", str(CUDA_DIR),
         "-include", str(HEADER), str(source)],
        capture_output=True, text=True,
    )
    if out.returncode:
        raise RuntimeError(f"preprocessing {source.name} failed:\n{out.stderr}")
    return {name: _bound(bound) for bound, name in _KERNEL_RE.findall(out.stdout)}


def _shim(source: Path, names: list[str]) -> str:
    lines = [f'#include "{HEADER}"', f'#include "{source}"', "#define EMU_API extern \"C\" "
             "__attribute__((visibility(\"default\")))",
             "EMU_API const char * emu_error() { return emu::g.err; }",
             "EMU_API void emu_trace_start() { emu::trace.on = 1; emu::trace.n = 0; }",
             "EMU_API size_t emu_trace_stop(const emu::Access ** ev) "
             "{ emu::trace.on = 0; *ev = emu::trace.ev; return emu::trace.n; }"]
    for n in names:
        lines.append(f"EMU_API int emu_launch_{n}(const emu::Cfg * c, void ** a) "
                     f"{{ return emu::launch({n}, c, a); }}")
        lines.append(f"EMU_API const char * emu_sig_{n}() {{ return emu::signature({n}); }}")
    return "\n".join(lines) + "\n"


def build(source: Path) -> tuple[Path, dict[str, int]]:
    """Shared object for `source` (compiled now or taken from the cache) and its kernels."""
    source = Path(source).resolve()
    key = _digest(source)
    so = cache_dir() / f"{source.stem}-{key}.so"
    meta = so.with_suffix(".json")
    if so.exists() and meta.exists():
        return so, json.loads(meta.read_text())
    kernels = scan_kernels(source)
    cxx, _ = compiler()
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        shim = Path(tmp) / "shim.cpp"
        shim.write_text(_shim(source, list(kernels)))
        out = Path(tmp) / so.name
        r = subprocess.run([cxx, *CXXFLAGS, "-I", str(CUDA_DIR), "-o", str(out), str(shim)],
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"emulator build of {source.name} failed:\n{r.stderr[-4000:]}")
        os.replace(out, so)  # atomic: concurrent builders agree on the result
    tmp_meta = meta.with_suffix(f".{os.getpid()}.tmp")
    tmp_meta.write_text(json.dumps(kernels))
    os.replace(tmp_meta, meta)
    return so, kernels
