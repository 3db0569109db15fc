"""Every .cu compiles with nvcc for sm_75..sm_90, and ptxas's resource use fits the budgets
the planners assume (kernels/cuda/table.py BUDGETS): no spills, registers, shared memory."""

from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kernels.cuda import table
from kernels.cuda.device import MODULES, source_path
from tests.kernels.emulator.build import scan_kernels
from tests.kernels.nvcc_check import ARCHS, compile_all, nvcc

pytestmark = pytest.mark.skipif(nvcc() is None, reason="nvcc not found: CUDA compile check skipped")

REGISTERS_PER_SM = 65536


@pytest.fixture(scope="module")
def ptxas() -> dict:
    res, diag = compile_all()
    assert "warning" not in diag.lower() and "error" not in diag.lower(), diag
    return res


def test_every_kernel_compiles_for_every_arch(ptxas: dict) -> None:
    names = {n for m in MODULES for n in scan_kernels(source_path(m))}
    assert names, "no kernels found"
    for arch in ARCHS:
        missing = sorted(n for n in names if (n, arch) not in ptxas)
        assert not missing, f"{arch}: ptxas reported nothing for {missing}"


def test_resources_fit_the_planner_budget(ptxas: dict) -> None:
    problems = []
    for (kernel, arch), r in sorted(ptxas.items()):
        b = table.budget(kernel)
        if r.spill_stores or r.spill_loads:
            problems.append(f"{kernel}@{arch}: spills {r.spill_stores}/{r.spill_loads} bytes")
        if r.registers > b.max_registers or r.registers * b.max_threads > REGISTERS_PER_SM:
            problems.append(f"{kernel}@{arch}: {r.registers} registers > budget {b.max_registers}")
        if r.smem > b.static_smem or r.smem > table.MAX_SHARED_PER_BLOCK:
            problems.append(f"{kernel}@{arch}: {r.smem} B shared > budget {b.static_smem}")
    assert not problems, "\n".join(problems)


def test_occupancy_table_is_current(ptxas: dict) -> None:
    # docs/cuda.md's table is what ptxas's figures give today; every kernel fits at least
    # one block an SM, and decode attention keeps at least 8 warps an SM on every arch.
    from pathlib import Path

    from tests.kernels.occupancy import BEGIN, END, blocks_per_sm, launch_of, occupancy_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cuda.md").read_text()
    assert doc.split(BEGIN)[1].split(END)[0].strip() == occupancy_table(ptxas).strip(), (
        "docs/cuda.md's occupancy table is stale: python -m tests.kernels.occupancy")
    for (kernel, arch), r in ptxas.items():
        threads, dyn = launch_of(kernel)
        blocks, _ = blocks_per_sm(r, arch, threads, dyn)
        assert blocks >= 1, (kernel, arch)
        if kernel.startswith("attn_vec_"):
            assert blocks * threads // 32 >= 8, (kernel, arch, blocks)


def test_launch_bounds_match_the_budget() -> None:
    # __launch_bounds__ in the source is the largest block a planner may choose.
    for m in MODULES:
        for kernel, bound in scan_kernels(source_path(m)).items():
            if kernel != "type_info":
                assert bound == table.budget(kernel).max_threads, kernel


def _nvrtc():  # noqa: ANN202
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:
        return None


def _nvrtc_include() -> Path | None:
    """The CUDA headers NVRTC compiles half.cuh against (cuda_fp16.h), or None."""
    roots = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    if nvcc():
        roots.append(str(Path(nvcc()).resolve().parent.parent))
    return next((Path(r) / "include" for r in roots if r and (Path(r) / "include" /
                                                            "cuda_fp16.h").exists()), None)


def _nvrtc_stamp(source: str, arch: str, options: list[str], version: object) -> Path:
    """Where a module that compiled is remembered: keyed by its inlined source (headers
    included), the architecture, the options and NVRTC's version, in the kernel cache
    (INFERDESK_KERNEL_CACHE, else ~/.cache/inferdesk/kernels), as nvcc_check keys ptxas."""
    h = hashlib.sha256("\0".join([source, arch, *options, repr(version)]).encode())
    env = os.environ.get("INFERDESK_KERNEL_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    d = (base if env else base / "inferdesk" / "kernels") / "nvrtc"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{h.hexdigest()[:24]}.ok"


# NVRTC compiles one program on one thread, and most of a large module's time is its kernels'
# instantiations: a module of at least NVRTC_SPLIT_AT one-line kernel definitions (mmv.cu's
# MMV*(...) lines, one kernel's name each) is compiled as NVRTC_PARTS programs at once
# (threads: compileProgram releases the GIL), each with every other line of the source and
# its share of those. mmv (141 kernels, compute_75): 11.8 s as one program, 7.5 s as two on
# 2 cores, the same CPU seconds (docs/benchmarks.md, 2026-11-29 01:43).
NVRTC_PARTS = 2
NVRTC_SPLIT_AT = 100


def _nvrtc_parts(source: str, kernels: set[str], parts: int) -> list[str]:
    """``source`` as ``parts`` programs that define each kernel of ``kernels`` whose
    definition is a one-line macro use in exactly one of them (other lines in all)."""
    lines = source.split("\n")
    own = [i for i, line in enumerate(lines)
           if re.match(r"[A-Z][A-Z0-9_]*\(.*\)\s*(//.*)?$", line)
           and len(kernels.intersection(re.findall(r"\w+", line))) == 1]
    if len(own) < NVRTC_SPLIT_AT:
        return [source]
    return ["\n".join(line for i, line in enumerate(lines)
                      if i not in own or i in set(own[k::parts])) for k in range(parts)]


def _nvrtc_entries(nvrtc: Any, module: str, source: str, options: list[str]) -> set[str]:
    """The kernels (.entry) of ``source`` compiled by NVRTC with ``options``."""
    prog = nvrtc.createProgram(source, f"{module}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, options)
        ptx = nvrtc.getPTX(prog)
    except Exception as e:
        raise AssertionError(f"{module}: {nvrtc.getProgramLog(prog)}") from e
    finally:
        nvrtc.destroyProgram(prog)
    text = ptx.decode() if isinstance(ptx, bytes) else ptx
    return set(re.findall(r"\.entry\s+(\w+)", text))


# One case per module (mmv, the largest, ~7.5 s cold on 2 cores in two programs; the rest
# 0.2-5 s); sm_75 every run, sm_90 under `long` (the __CUDACC_RTC__ path is the same; the
# architectures' differences are ptxas's, which test_every_kernel_compiles_for_every_arch
# checks for all five). A module whose source, options and NVRTC are unchanged since it
# last compiled here is not compiled again.
@pytest.mark.skipif(_nvrtc() is None, reason="NVRTC not loadable: CuPy RawModule compile "
                    "check skipped (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("arch", ["compute_75", pytest.param("compute_90",
                                                             marks=pytest.mark.long)])
@pytest.mark.parametrize("module", MODULES)
def test_every_module_compiles_with_nvrtc_as_cupy_would(module: str, arch: str) -> None:
    """The __CUDACC_RTC__ path (no libc headers), with the options CuPy's RawModule adds,
    and every kernel the emulator knows present under its extern "C" name."""
    from kernels.cuda.device import kernel_source

    nvrtc = _nvrtc()
    include = _nvrtc_include()
    if include is None:
        pytest.skip("no CUDA headers (cuda_fp16.h) for NVRTC")
    source = kernel_source(module)
    options = ["-std=c++17", f"-I{include}", f"--gpu-architecture={arch}", "-ftz=true"]
    want = set(scan_kernels(source_path(module)))
    stamp = _nvrtc_stamp(source, arch, options, nvrtc.getVersion())
    if stamp.exists() and set(stamp.read_text().split()) == want:
        return
    programs = _nvrtc_parts(source, want, NVRTC_PARTS)
    with ThreadPoolExecutor(len(programs)) as pool:
        entries = list(pool.map(lambda s: _nvrtc_entries(nvrtc, module, s, options), programs))
    assert set().union(*entries) == want, module
    stamp.write_text("\n".join(sorted(want)) + "\n")
