"""Compile every kernel with nvcc for each target architecture and parse `ptxas -v`.

All modules go into one translation unit and one nvcc call with a -gencode per
architecture (nvcc --threads compiles the architectures in parallel): ~20 s on two cores,
then cached by a hash of the sources, the flags and nvcc's version.

    python -m tests.kernels.nvcc_check      # prints registers / spills / smem per kernel
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from inference.files import write_atomic
from kernels.cuda.device import CUDA_DIR, MODULES

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
FLAGS = ("-std=c++17", "-Xptxas", "-v", "--threads", "2")


@dataclass(frozen=True)
class Resources:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    smem: int  # static shared memory, bytes
    barriers: int


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:.*?(\d+) bytes smem)?")


def parse_ptxas(text: str) -> dict[tuple[str, str], Resources]:
    out: dict[tuple[str, str], Resources] = {}
    key: tuple[str, str] | None = None
    frame = (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            key, frame = (m.group(1), m.group(2)), (0, 0, 0)
        elif (m := _FRAME.search(line)) and key:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif (m := _USED.search(line)) and key:
            out[key] = Resources(int(m.group(1)), frame[1], frame[2], frame[0],
                                 int(m.group(3) or 0), int(m.group(2) or 0))
            key = None
    return out


def _cache_file(compiler: str, archs: tuple[str, ...]) -> Path:
    h = hashlib.sha256()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    h.update(version.encode())
    h.update(" ".join(FLAGS + archs).encode())
    for f in sorted(CUDA_DIR.glob("*.cu*")):
        h.update(f.name.encode() + f.read_bytes())
    env = os.environ.get("INFERDESK_KERNEL_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    d = (base if env else base / "inferdesk" / "kernels") / "nvcc"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"ptxas-{h.hexdigest()[:20]}.json"


def compile_all(archs: tuple[str, ...] = ARCHS) -> tuple[dict[tuple[str, str], Resources], str]:
    """(resources per (kernel, arch), compiler diagnostics other than ptxas info)."""
    compiler = nvcc()
    if compiler is None:
        raise FileNotFoundError("nvcc not found")
    cache = _cache_file(compiler, archs)
    if cache.exists():
        data = json.loads(cache.read_text())
        return {tuple(k.split("@")): Resources(**v) for k, v in data["res"].items()}, data["diag"]
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "all_kernels.cu"
        unit.write_text("".join(f'#include "{CUDA_DIR / m}.cu"\n' for m in MODULES))
        r = subprocess.run([compiler, *FLAGS, *gencode, f"-I{CUDA_DIR}", "-c", "-o",
                            str(Path(tmp) / "all.o"), str(unit)], capture_output=True, text=True)
    text = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"nvcc failed:\n{text[-4000:]}")
    res = parse_ptxas(text)
    noise = ("ptxas info", "bytes stack frame")
    diag = "\n".join(line for line in text.splitlines()
                     if line.strip() and not any(n in line for n in noise))
    # Written whole, then renamed: another test process may read it meanwhile.
    text = json.dumps({"res": {f"{k}@{a}": asdict(v) for (k, a), v in res.items()},
                       "diag": diag})
    write_atomic(cache, lambda f: f.write(text.encode()))
    return res, diag


def main() -> None:
    res, diag = compile_all()
    if diag:
        print(diag)
    kernels = sorted({k for k, _ in res})
    print(f"{'kernel':28s} " + " ".join(f"{a:>18s}" for a in ARCHS))
    for k in kernels:
        cells = []
        for a in ARCHS:
            r = res[(k, a)]
            cells.append(f"{r.registers:3d}r {r.smem:5d}B {r.spill_stores + r.spill_loads}sp")
        print(f"{k:28s} " + " ".join(f"{c:>18s}" for c in cells))


if __name__ == "__main__":
    main()
