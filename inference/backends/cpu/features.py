"""What the CPU numba compiles for can do: its instruction sets (AVX2, AVX-512, F16C, VNNI,
ARM's dot product), the target's tuning before the first compile, the form the integer
kernels take on it, and its largest cache."""

from __future__ import annotations

from functools import cache

import numba


@cache
def host_cpu_features() -> str:
    """LLVM's feature string for this CPU, e.g. "+avx2,+f16c,-avx512f,...", asked once."""
    import llvmlite.binding as ll

    return str(ll.get_host_cpu_features().flatten())


def _arch() -> str:
    """The architecture numba compiles for (the host's): "x86", "arm" (aarch64) or "other"."""
    import platform

    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    return "arm" if machine in ("arm64", "aarch64") else "other"


def _x86() -> bool:
    return _arch() == "x86"


HWCAP_ASIMDDP = 1 << 20  # Linux arm64, AT_HWCAP: SDOT/UDOT (the dot-product extension)


def arm_cpu_has_dotprod() -> bool:
    """Whether this ARM CPU has the dot-product instructions, as the OS reports them at run
    time (Linux: AT_HWCAP; macOS: hw.optional.arm.FEAT_DotProd). LLVM's host feature string
    does not list them: on Linux it is read from /proc/cpuinfo and a Neoverse N1's came back
    "+aes,+crc,+fp-armv8,+lse,+neon,+sha2" (dotprod only implied by the CPU's name)."""
    import ctypes
    import sys

    if _arch() != "arm":
        return False
    try:
        libc = ctypes.CDLL(None)
        if sys.platform == "darwin":
            value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
            return libc.sysctlbyname(b"hw.optional.arm.FEAT_DotProd", ctypes.byref(value),
                                     ctypes.byref(size), None, 0) == 0 and value.value == 1
        libc.getauxval.restype = ctypes.c_ulong
        libc.getauxval.argtypes = [ctypes.c_ulong]
        return bool(libc.getauxval(16) & HWCAP_ASIMDDP)  # 16: AT_HWCAP
    except (OSError, AttributeError):  # no such call here: say nothing is there
        return False


def _tune_target() -> None:
    """The target numba compiles for, adjusted before anything is compiled (numba reads
    the feature string once, at its first compile): on AVX-512 hosts 512-bit vectors are
    allowed (see the module docstring); on ARM CPUs whose OS reports the dot-product
    extension, ``+dotprod`` is added, which LLVM's host features leave out. A user's
    NUMBA_CPU_FEATURES or NUMBA_CPU_NAME wins. Compiled kernels are cached per feature
    string."""
    if numba.config.CPU_FEATURES is not None or numba.config.CPU_NAME is not None:
        return
    try:
        features = host_cpu_features()
    except Exception:  # no host feature query: keep numba's own choice
        return
    listed = features.split(",")
    if "+avx512f" in listed:
        numba.config.CPU_FEATURES = features + ",-prefer-256-bit"
    elif "+dotprod" not in listed and arm_cpu_has_dotprod():
        numba.config.CPU_FEATURES = ",".join(f for f in (features, "+dotprod") if f)


_tune_target()


def target_has(feature: str) -> bool:
    """Whether the code numba generates may use ``feature`` as LLVM names it for this
    architecture ("f16c", "avx2" on x86; "dotprod" on ARM): the host's CPU unless
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES name another target. Callers of x86-only kernels
    also check :func:`_x86` (a user's NUMBA_CPU_FEATURES may say anything)."""
    if numba.config.CPU_FEATURES is not None:
        return f"+{feature}" in numba.config.CPU_FEATURES.split(",")
    if numba.config.CPU_NAME is not None:  # e.g. "generic": nothing beyond the baseline
        return False
    return f"+{feature}" in host_cpu_features().split(",")


def target_isa() -> str:
    """The vector instruction set numba compiles the kernels for, as ``backend_reason``
    names it: "AVX-512 with VNNI (512-bit vectors)", "AVX2 with AVX-VNNI", "AVX2", "no
    AVX2" (generic x86, e.g. NUMBA_CPU_NAME); on aarch64 "ARM NEON" (every aarch64 CPU
    has it), "ARM NEON with dot product" where LLVM reports ``dotprod`` (the same kernels
    run either way: no kernel uses ``sdot`` yet)."""
    arch = _arch()
    if arch == "arm":
        return "ARM NEON with dot product" if target_has("dotprod") else "ARM NEON"
    if arch != "x86":
        return "generic"
    if target_has("avx512f"):
        vnni = " with VNNI" if target_has("avx512vnni") else ""
        wide = (numba.config.CPU_FEATURES or "").endswith(",-prefer-256-bit")  # _tune_target
        return f"AVX-512{vnni}" + (" (512-bit vectors)" if wide else "")
    if target_has("avx2"):
        return "AVX2 with AVX-VNNI" if target_has("avxvnni") else "AVX2"
    return "no AVX2"


def target_has_f16c() -> bool:
    """Whether float16 converts compile to hardware ones: F16C on x86; other
    architectures (ARM) convert float16 natively."""
    return not _x86() or target_has("f16c")


def float16_converts() -> str:
    """How the kernels widen float16 scales, as ``backend_reason`` names it."""
    if not _x86():
        return "native float16 converts"
    return "F16C" if target_has("f16c") else "integer float16 converts"



def form() -> str:
    """The integer kernels numba's target takes: "avx512" (x86 with AVX-512BW: pairs of
    codes, 512-bit vectors), "avx2" (x86 with AVX2: pairs of codes, ``vpmaddwd``), or
    "lanes" everywhere else (plain vector IR, lane by lane: NEON's ``smlal`` on ARM, SSE2
    on an x86 without AVX2)."""
    if _x86() and target_has("avx2"):
        return "avx512" if target_has("avx512bw") else "avx2"
    return "lanes"


@cache
def last_level_cache() -> int:
    """Bytes of this CPU's largest cache (Linux's sysfs, as the kernel reports it: a
    virtual machine's may be its host's whole L3), 0 where unknown."""
    import glob

    from inference.units import parse_bytes

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                sizes.append(parse_bytes(f.read()))  # "491520K"
        except (OSError, ValueError):
            continue
    return max(sizes, default=0)
