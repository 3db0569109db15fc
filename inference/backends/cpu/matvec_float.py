"""numba kernels of the CPU backend over quantized weights in "lane blocks".

Layout (made by :mod:`inference.backends.cpu_pack`): output rows are grouped in tiles of
``LANES`` rows and the input dimension in groups of ``GROUP``; one block holds one
(tile, group) pair as a float32 array ``(R, LANES)``:

- rows ``0 .. C-1`` are the codes as bytes, viewed as ``codes[blk, j, lane]``: 4-bit
  (C=4): byte ``j`` holds code ``j`` in its low and code ``j + 16`` in its high nibble,
  as in GGML's Q4_0/Q4_1; 5-bit (C=5): the same 16 nibble bytes for bits 0-3, then the
  plane of bit 4 in bytes 16-19: bit ``p`` of byte 16 / 17 / 18 / 19 belongs to code
  ``2p`` / ``2p+1`` / ``2p+16`` / ``2p+17`` (Q5_0, Q5_1, Q5_K: as small as the file's
  ``qh``); 8-bit (C=8): one code per byte (int8 for Q8_0);
- then the scale and bias of each lane, ``w = scale * code + bias``, in one of three
  layouts (``kind``): ``SYMMETRIC`` row ``C`` holds float32 scales and
  ``bias = -zero * scale``; ``AFFINE`` rows ``C`` and ``C + 1`` hold float32 scales and
  biases; ``AFFINE_F16`` row ``C`` holds float16 scales then float16 biases, for types
  whose file stores them so (Q4_1, MLX with float16 scales): one row fewer, so a Q4_1
  block is as large as in the file; ``SUB16`` (Q6_K, 8-bit signed codes ``q - 32``) row
  ``C`` holds as bytes an int8 scale for codes 0-15 and one for codes 16-31 of each lane,
  then the lane's float16 ``d``: ``w = (d * scale) * q``, as in the file.

Why: the inner loop runs over the lanes, i.e. 32 output rows at once, so LLVM vectorises
it with plain loads, converts and FMAs, and no horizontal sum per group is needed; the
``x`` values are broadcast scalars. Inside it, the group's codes (a constant-count loop,
fully unrolled) are summed in four independent chains held in registers: one chain is
bound by FMA latency, and a partial-sum array in memory costs a load and a store per code
row. A block is one contiguous run of memory (codes, scale, bias together), read front to
back, with the block ``PREFETCH`` ahead prefetched: the weights of a token no longer fit
in L2, and with three separate arrays the hardware
prefetchers lost ~40% of the speed (README "Fast on a plain CPU" has the figures).
Codes go through int32 before float: from uint8 & 15 numba would widen to int64, and
int64 -> float32 converts take twice the instructions. The lane loops take their trip
count from the array shape, not the constant: a constant 32 gets the loop fully unrolled
before the loop vectoriser runs, and the SLP vectoriser then leaves the int8 -> float
converts scalar (3x slower; seen in the assembly).

``sum_j (s*q_j + z) * x_j = s * sum_j q_j x_j + z * sum_j x_j``: the bias costs one FMA
per group with the precomputed group sums ``xsum`` of ``x``.

Vector width: LLVM's tuning for AVX-512 CPUs prefers 256-bit vectors (older Xeons lower
their clock for 512-bit code). These loops are bound by instruction throughput, so on a
CPU with AVX-512 the preference is lifted before anything is compiled
(:func:`_tune_target`; 1.5x on the mat-vec where it was measured, an Intel Xeon with
AVX-512), unless the user set NUMBA_CPU_FEATURES. CPUs without AVX-512 are unaffected.
"""

from __future__ import annotations

import math
from functools import cache, partial

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

LANES = 32
GROUP = 32
PREFETCH = 4  # blocks ahead; 2-8 measured equal within noise, 0 is ~25% slower cold

_f32 = np.float32


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

# Every kernel: NumPy's error model (a float division by zero gives inf/nan, as in NumPy,
# instead of raising), without which LLVM keeps any loop that divides scalar (GELU's erf
# ran 4.4x slower); nogil, so concurrent calls from several threads run in parallel.
_jit = partial(njit, cache=True, fastmath=True, error_model="numpy", nogil=True)
# The mat-vec kernels: fast math without reassociation. Their group sums run in four
# independent chains; "reassoc" lets LLVM fold them back into one dependent chain of 32
# FMAs per group, bound by FMA latency (seen in the assembly, AVX2; decode on SmolLM2 went
# from 0.49x to 0.64x llama.cpp's there: docs/benchmarks.md).
_NO_REASSOC = {"nnan", "ninf", "nsz", "arcp", "contract", "afn"}


def _i64_of(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An integer IR value widened (sign-extended) to 64 bits."""
    return builder.sext(v, ir.IntType(64)) if v.type.width < 64 else v


def _splat(builder: ir.IRBuilder, v: ir.Value, n: int) -> ir.Value:
    """``v`` (a scalar IR value) in every lane of an ``n``-lane vector."""
    vt = ir.VectorType(v.type, n)
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vt, None), v, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vt, None),
                                  ir.Constant(ir.VectorType(i32, n), [0] * n))


def _item_ptr(context, builder, aty, arr, idx):  # type: ignore[no-untyped-def]
    """In an intrinsic's codegen: the pointer to ``arr[idx]`` (``aty`` its array type,
    ``idx`` a list of index values), unchecked."""
    ary = context.make_array(aty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, aty, ary, idx, wraparound=False,
                                    boundscheck=False)


@intrinsic
def _prefetch(typingctx, arr, idx):  # type: ignore[no-untyped-def]
    """llvm.prefetch (read, keep in all caches) of ``arr[idx]``; numba has no such call."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ptr = _item_ptr(context, builder, signature.args[0], args[0], [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _at(typingctx, addr, like):  # type: ignore[no-untyped-def]
    """The buffer at address ``addr`` (int64) as a pointer to ``like``'s element type (an
    array), for ``numba.carray``."""
    sig = types.CPointer(like.dtype)(types.int64, like)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@_jit(inline="always")
def _unit(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A 1-D ``x`` of unit stride (a row of a strided 2-D view, unchecked) as a contiguous
    array of ``like``'s type: the loops over it vectorise as over a C-contiguous row (an
    'A'-layout row stays scalar: 10x slower, other bits)."""
    return numba.carray(_at(x.ctypes.data, like), x.shape[0])


@intrinsic
def _bits_to_f32(typingctx, v):  # type: ignore[no-untyped-def]
    """Reinterpret an int32 as float32 (a bitcast LLVM can vectorise)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _f32_to_bits(typingctx, v):  # type: ignore[no-untyped-def]
    """Reinterpret a float32 as int32 (:func:`_bits_to_f32` backwards)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


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


def _half_from_bits(builder: ir.IRBuilder, h16: ir.Value) -> ir.Value:
    """float16 bits -> float32 with integer ops only, exact for every input (zeros,
    subnormals, inf, NaN): the mantissa and exponent move into float32's fields and the
    exponent is rebiased; a subnormal is renormalised by one float subtraction. Selects,
    not branches, so loops stay vectorised. ``h16`` an i16 or a vector of them."""
    i32, f32 = ir.IntType(32), ir.FloatType()
    if isinstance(h16.type, ir.VectorType):
        i32, f32 = ir.VectorType(i32, h16.type.count), ir.VectorType(f32, h16.type.count)

    def c(v: int) -> ir.Constant:
        return ir.Constant(i32, v)  # a vector constant splats v

    h = builder.zext(h16, i32)
    o = builder.shl(builder.and_(h, c(0x7FFF)), c(13))
    exp = builder.and_(o, c(0x0F800000))
    o = builder.add(o, c(112 << 23))  # rebias 15 -> 127
    inf_nan = builder.icmp_unsigned("==", exp, c(0x0F800000))
    o = builder.select(inf_nan, builder.add(o, c(112 << 23)), o)  # exponent to 255
    sub = builder.icmp_unsigned("==", exp, c(0))
    renorm = builder.fsub(builder.bitcast(builder.add(o, c(1 << 23)), f32),
                          builder.bitcast(c(113 << 23), f32))
    f = builder.select(sub, renorm, builder.bitcast(o, f32))
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    return builder.bitcast(builder.or_(builder.bitcast(f, i32), sign), f32)


def half_to_float(builder: ir.IRBuilder, h16: ir.Value) -> ir.Value:
    """float16 bits (an i16 or a vector of them) -> float32 in IR. With F16C: LLVM's fpext
    from half, one vcvtph2ps per 16 values. Without it (an old CPU, or numba told to
    compile for a generic x86-64) fpext would become a call to a runtime helper the JIT
    cannot link, so the conversion is written out in integer ops instead."""
    if not target_has_f16c():
        return _half_from_bits(builder, h16)
    if isinstance(h16.type, ir.VectorType):
        n = h16.type.count
        return builder.fpext(builder.bitcast(h16, ir.VectorType(ir.HalfType(), n)),
                             ir.VectorType(ir.FloatType(), n))
    return builder.fpext(builder.bitcast(h16, ir.HalfType()), ir.FloatType())


@intrinsic
def _half(typingctx, h):  # type: ignore[no-untyped-def]
    """float16 bits (uint16) -> float32 (numba has no float16 type on the CPU):
    :func:`half_to_float`."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return half_to_float(builder, args[0])

    return sig, codegen


def _widen(x):  # type: ignore[no-untyped-def]  # numba only: float32, or float16 bits, as float32
    raise NotImplementedError


@overload(_widen, inline="always")
def _widen_ov(x):  # type: ignore[no-untyped-def]
    if x == types.uint16:
        return lambda x: _half(x)
    return lambda x: x


def _term(x, y, i):  # type: ignore[no-untyped-def]  # numba only: a term of _fold8's sum
    raise NotImplementedError


@overload(_term, inline="always")
def _term_ov(x, y, i):  # type: ignore[no-untyped-def]
    if isinstance(y, types.NoneType):
        return lambda x, y, i: x[i]
    return lambda x, y, i: x[i] * _widen(y[i])


@_jit(inline="always")
def _fold8(x: np.ndarray, y: np.ndarray | None, n: int) -> np.float32:
    """The sum over i < n of x[i] (``y`` None) or of x[i] * y[i] (y float32 or float16
    bits) in a fixed order: eight running sums (terms i, i + 8, ...), added pairwise, then
    the tail. Written out so that it needs no reassociation to run eight lanes wide (the
    kernels that call it are compiled without it: :data:`_NO_REASSOC`)."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = _f32(0.0)
    n8 = n // 8 * 8
    for i in range(0, n8, 8):
        s0 += _term(x, y, i)
        s1 += _term(x, y, i + 1)
        s2 += _term(x, y, i + 2)
        s3 += _term(x, y, i + 3)
        s4 += _term(x, y, i + 4)
        s5 += _term(x, y, i + 5)
        s6 += _term(x, y, i + 6)
        s7 += _term(x, y, i + 7)
    t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    for i in range(n8, n):
        t += _term(x, y, i)
    return t


@_jit(inline="always")
def _sum8(x: np.ndarray, n: int) -> np.float32:
    """x[:n]'s sum in :func:`_fold8`'s fixed order."""
    return _fold8(x, None, n)


@_jit(inline="always")
def _dot8(x: np.ndarray, y: np.ndarray) -> np.float32:
    """x . y (y float32 or float16 bits) in :func:`_fold8`'s fixed order."""
    return _fold8(x, y, x.shape[0])


@_jit(inline="always")
def _exp(x: float) -> float:
    """float32 exp, relative error < 2e-7 on [-86, 88] (Cephes expf: 2^n times a
    degree-6 polynomial of the remainder), clamped to that range. math.exp is a scalar
    libm call that keeps loops scalar. n is rounded through int32: math.floor returns
    int64 and took the whole polynomial to float64 (2x slower). The lower clamp keeps
    2^n * p normal: a denormal result costs ~100 cycles."""
    x = min(max(x, _f32(-86.0)), _f32(88.0))
    y = x * _f32(1.4426950408889634)
    n = np.int32(y + (_f32(0.5) if y >= _f32(0.0) else _f32(-0.5)))
    fn = _f32(n)
    r = x - fn * _f32(0.693359375) - fn * _f32(-2.12194440e-4)
    p = _f32(1.9875691500e-4)
    p = p * r + _f32(1.3981999507e-3)
    p = p * r + _f32(8.3334519073e-3)
    p = p * r + _f32(4.1665795894e-2)
    p = p * r + _f32(1.6666665459e-1)
    p = p * r + _f32(5.0000001201e-1)
    p = p * r * r + r + _f32(1.0)
    return p * _bits_to_f32((n + np.int32(127)) << np.int32(23))


@_jit(fastmath=False, inline="always")
def _prefetch_block(flat: np.ndarray, blk: int, row_bytes: int) -> None:
    """Prefetch every 64-byte line of block ``blk`` of a flat uint8 view."""
    start = blk * row_bytes
    if start + row_bytes <= flat.shape[0]:
        for off in range(0, row_bytes, 64):
            _prefetch(flat, start + off)


@_jit()
def group_sums(x: np.ndarray) -> np.ndarray:
    """(T, K) -> (T, K/32) sums of each group of 32 activations."""
    t, k = x.shape
    out = np.empty((t, k // GROUP), dtype=np.float32)
    for i in range(t):
        for g in range(k // GROUP):
            s = _f32(0.0)
            for j in range(GROUP):
                s += x[i, g * GROUP + j]
            out[i, g] = s
    return out


SYMMETRIC, AFFINE, AFFINE_F16, SUB16 = 0, 1, 2, 3  # scale layouts (module docstring)


@_jit(inline="always")
def _high(hb: np.ndarray, j: int, lane: int) -> np.int32:
    """Bit 4 of 5-bit code ``j`` of a lane, from a block's plane of high bits ``hb``
    (4, LANES): byte ``(j & 1) + 2 * (j >= 16)``, bit ``(j % 16) // 2``."""
    plane = (j & 1) + 2 * (j >> 4)
    return ((np.int32(hb[plane, lane]) >> np.int32((j & 15) >> 1)) & np.int32(1)) << np.int32(4)


@_jit(inline="always")
def _block_scales(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, blk: int,
                  c: int, kind: int, zero: float, sg: np.ndarray, sg2: np.ndarray,
                  zg: np.ndarray) -> None:
    """Scales of every lane of block ``blk`` for its codes 0-15 (``sg``) and 16-31
    (``sg2``), and its bias (``zg``), as float32."""
    n = sg.shape[0]
    if kind == SUB16:
        d = halves[blk, c]
        for lane in range(n):
            dl = _half(d[n + lane])
            sg[lane] = dl * _f32(np.int32(codes[blk, 4 * c, lane]))
            sg2[lane] = dl * _f32(np.int32(codes[blk, 4 * c + 1, lane]))
            zg[lane] = _f32(0.0)
        return
    if kind == AFFINE_F16:
        row = halves[blk, c]
        for lane in range(n):
            sg[lane] = _half(row[lane])
            zg[lane] = _half(row[n + lane])
    elif kind == AFFINE:
        for lane in range(n):
            sg[lane] = blocks[blk, c, lane]
            zg[lane] = blocks[blk, c + 1, lane]
    else:
        for lane in range(n):
            sg[lane] = blocks[blk, c, lane]
            zg[lane] = -_f32(zero) * blocks[blk, c, lane]
    sg2[:] = sg


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes4(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 32 4-bit codes, in four chains."""
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(0, 16, 2):
        q = np.int32(cb[j, lane])
        r = np.int32(cb[j + 1, lane])
        p0 += _f32(np.int32(q & 15)) * xi[b0 + j]
        p1 += _f32(np.int32(q >> 4)) * xi[b0 + 16 + j]
        p2 += _f32(np.int32(r & 15)) * xi[b0 + j + 1]
        p3 += _f32(np.int32(r >> 4)) * xi[b0 + 17 + j]
    return (p0 + p1) + (p2 + p3)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes5(cb: np.ndarray, hb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """As :func:`_codes4` for 5-bit codes, bit 4 from the plane ``hb`` (module docstring)."""
    el, ol = np.int32(hb[0, lane]), np.int32(hb[1, lane])
    eh, oh = np.int32(hb[2, lane]), np.int32(hb[3, lane])
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(0, 16, 2):
        q = np.int32(cb[j, lane])
        r = np.int32(cb[j + 1, lane])
        b = np.int32(j >> 1)
        p0 += _f32(np.int32(q & 15) | (((el >> b) & 1) << 4)) * xi[b0 + j]
        p1 += _f32(np.int32(q >> 4) | (((eh >> b) & 1) << 4)) * xi[b0 + 16 + j]
        p2 += _f32(np.int32(r & 15) | (((ol >> b) & 1) << 4)) * xi[b0 + j + 1]
        p3 += _f32(np.int32(r >> 4) | (((oh >> b) & 1) << 4)) * xi[b0 + 17 + j]
    return (p0 + p1) + (p2 + p3)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes_nib(cb: np.ndarray, high: np.ndarray | None, blk: int, xi: np.ndarray, b0: int,
               lane: int) -> float:
    """:func:`_codes4`, or :func:`_codes5` when there is a plane of high bits (the branch
    is resolved when numba compiles: ``high`` is None or an array)."""
    if high is None:
        return _codes4(cb, xi, b0, lane)
    return _codes5(cb, high[blk], xi, b0, lane)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes16(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int, j0: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 8-bit codes j0 .. j0+15, in four chains."""
    p0 = _f32(0.0)
    p1 = _f32(0.0)
    p2 = _f32(0.0)
    p3 = _f32(0.0)
    for j in range(j0, j0 + 16, 4):
        p0 += _f32(np.int32(cb[j, lane])) * xi[b0 + j]
        p1 += _f32(np.int32(cb[j + 1, lane])) * xi[b0 + j + 1]
        p2 += _f32(np.int32(cb[j + 2, lane])) * xi[b0 + j + 2]
        p3 += _f32(np.int32(cb[j + 3, lane])) * xi[b0 + j + 3]
    return (p0 + p1) + (p2 + p3)


@_jit(inline="always", fastmath=_NO_REASSOC)
def _codes8(cb: np.ndarray, xi: np.ndarray, b0: int, lane: int) -> float:
    """sum_j code_j * x[b0 + j] over one lane's 32 8-bit codes."""
    return _codes16(cb, xi, b0, lane, 0) + _codes16(cb, xi, b0, lane, 16)


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q4(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, flat: np.ndarray,
              high: np.ndarray | None, kind: int, zero: float, x: np.ndarray,
              out: np.ndarray) -> None:
    """out (T, tiles*LANES) = x (T, K) @ W.T for a 4-bit W, or a 5-bit W given its plane of
    high bits ``high`` (nblk, 4, LANES); T is small (decode).

    codes (nblk, 4*R, LANES), halves (nblk, R, 2*LANES) and flat (nblk*R*4*LANES,) are
    byte, uint16 and flat byte views of blocks (nblk, R, LANES) float32."""
    groups = x.shape[1] // GROUP
    xsum = group_sums(x)
    tiles = blocks.shape[0] // groups
    row_bytes = blocks.shape[1] * LANES * 4
    nl = codes.shape[2]  # == LANES, but a runtime trip count: see module docstring
    c = 4 if high is None else 5  # the block's row of scales
    for t in prange(tiles):
        acc = np.empty(nl, dtype=np.float32)
        for i in range(x.shape[0]):
            acc[:] = 0.0
            xi = x[i]
            for g in range(groups):
                blk = t * groups + g
                if i == 0:
                    _prefetch_block(flat, blk + PREFETCH, row_bytes)
                cb = codes[blk]
                b0 = g * GROUP
                xs = xsum[i, g]
                # One lane loop per scale layout (kind is the same for every block).
                if kind == AFFINE_F16:
                    h = halves[blk, c]
                    for lane in range(nl):
                        acc[lane] += (_half(h[lane]) * _codes_nib(cb, high, blk, xi, b0, lane)
                                      + _half(h[nl + lane]) * xs)
                elif kind == AFFINE:
                    sg, zg = blocks[blk, c], blocks[blk, c + 1]
                    for lane in range(nl):
                        acc[lane] += (sg[lane] * _codes_nib(cb, high, blk, xi, b0, lane)
                                      + zg[lane] * xs)
                else:
                    sg, zx = blocks[blk, c], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += sg[lane] * (_codes_nib(cb, high, blk, xi, b0, lane) - zx)
            out[i, t * LANES:(t + 1) * LANES] = acc


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q8(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, flat: np.ndarray,
              kind: int, zero: float, x: np.ndarray, out: np.ndarray) -> None:
    """As :func:`matvec_q4` for an 8-bit W (codes uint8, or int8 for Q8_0 and Q6_K).

    Its own kernel, not a ``bits`` argument of one: a merged kernel branching on the code
    width per lane ran 3x slower (1536x576, 2 threads: Q4_1 28.8 -> 8.8 Gweights/s), as
    the branch kept the lane loops from vectorising."""
    groups = x.shape[1] // GROUP
    xsum = group_sums(x)
    tiles = blocks.shape[0] // groups
    row_bytes = blocks.shape[1] * LANES * 4
    nl = codes.shape[2]  # == LANES, but a runtime trip count: see module docstring
    for t in prange(tiles):
        acc = np.empty(nl, dtype=np.float32)
        for i in range(x.shape[0]):
            acc[:] = 0.0
            xi = x[i]
            for g in range(groups):
                blk = t * groups + g
                if i == 0:
                    _prefetch_block(flat, blk + PREFETCH, row_bytes)
                cb = codes[blk]
                b0 = g * GROUP
                xs = xsum[i, g]
                if kind == SUB16:  # Q6_K: a scale per 16 codes times a float16 d
                    h = halves[blk, 8]
                    for lane in range(nl):
                        acc[lane] += _half(h[nl + lane]) * (
                            _f32(np.int32(cb[32, lane])) * _codes16(cb, xi, b0, lane, 0)
                            + _f32(np.int32(cb[33, lane])) * _codes16(cb, xi, b0, lane, 16))
                elif kind == AFFINE_F16:
                    h = halves[blk, 8]
                    for lane in range(nl):
                        acc[lane] += (_half(h[lane]) * _codes8(cb, xi, b0, lane)
                                      + _half(h[nl + lane]) * xs)
                elif kind == AFFINE:
                    sg, zg = blocks[blk, 8], blocks[blk, 9]
                    for lane in range(nl):
                        acc[lane] += sg[lane] * _codes8(cb, xi, b0, lane) + zg[lane] * xs
                else:
                    sg, zx = blocks[blk, 8], _f32(zero) * xs
                    for lane in range(nl):
                        acc[lane] += sg[lane] * (_codes8(cb, xi, b0, lane) - zx)
            out[i, t * LANES:(t + 1) * LANES] = acc


@_jit(inline="always", fastmath=_NO_REASSOC)
def _chains2(wf: np.ndarray, xa: np.ndarray, xb: np.ndarray, b0: int, j0: int,
             s: np.ndarray, add: bool) -> None:
    """Chains j0 and j0+1 of :func:`_codes16` (codes j0, j0+4, j0+8, j0+12 and those +1)
    for rows a and b at once, each code loaded once for both, over converted codes
    ``wf``: s[lane] (row a) and s[nl + lane] (row b) = the two chains' sum, or += it when
    ``add``. Two chains per pass, not four: four for two rows made a loop body LLVM did
    not vectorise (seen in the assembly)."""
    nl = wf.shape[1]
    for lane in range(nl):
        a0 = a1 = c0 = c1 = _f32(0.0)
        for j in range(j0, j0 + 16, 4):
            w0 = wf[j, lane]
            w1 = wf[j + 1, lane]
            a0 += w0 * xa[b0 + j]
            a1 += w1 * xa[b0 + j + 1]
            c0 += w0 * xb[b0 + j]
            c1 += w1 * xb[b0 + j + 1]
        if add:
            s[lane] = s[lane] + (a0 + a1)
            s[nl + lane] = s[nl + lane] + (c0 + c1)
        else:
            s[lane] = a0 + a1
            s[nl + lane] = c0 + c1


@_jit(parallel=True, fastmath=_NO_REASSOC)
def matvec_q8_rows(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                   flat: np.ndarray, kind: int, x: np.ndarray, out: np.ndarray) -> None:
    """:func:`matvec_q8` for an even number of rows of x (one decode step of several
    sequences) and the scale-only layouts (SYMMETRIC with zero 0, i.e. Q8_0; SUB16, i.e.
    Q6_K), each row's result bitwise the one it gets alone.

    Converting int8 codes to float is most of a row's work in matvec_q8, so here a block's
    codes are converted once and the rows sum over the floats, two rows per pass. Each
    row keeps matvec_q8's chains, group order and scaling expressions: the server's
    batching relies on this exactness (inference/server/scheduler.py)."""
    rows = x.shape[0]
    groups = x.shape[1] // GROUP
    tiles = blocks.shape[0] // groups
    row_bytes = blocks.shape[1] * LANES * 4
    nl = codes.shape[2]
    for t in prange(tiles):
        acc = np.zeros((rows, nl), dtype=np.float32)
        s = np.empty(2 * nl, dtype=np.float32)  # rows a, b: sums of codes 0-15
        h = np.empty(2 * nl, dtype=np.float32)  # and of codes 16-31
        wf = np.empty((GROUP, nl), dtype=np.float32)
        for g in range(groups):
            blk = t * groups + g
            _prefetch_block(flat, blk + PREFETCH, row_bytes)
            cb = codes[blk]
            b0 = g * GROUP
            for j in range(GROUP):
                for lane in range(nl):
                    wf[j, lane] = _f32(np.int32(cb[j, lane]))
            for i in range(0, rows, 2):
                xa, xb = x[i], x[i + 1]
                _chains2(wf, xa, xb, b0, 0, s, False)
                _chains2(wf, xa, xb, b0, 2, s, True)
                _chains2(wf, xa, xb, b0, 16, h, False)
                _chains2(wf, xa, xb, b0, 18, h, True)
                for r in range(2):
                    a = acc[i + r]
                    if kind == SUB16:
                        d = halves[blk, 8]
                        for lane in range(nl):
                            a[lane] += _half(d[nl + lane]) * (
                                _f32(np.int32(cb[32, lane])) * s[r * nl + lane]
                                + _f32(np.int32(cb[33, lane])) * h[r * nl + lane])
                    else:
                        sg = blocks[blk, 8]
                        for lane in range(nl):
                            a[lane] += sg[lane] * (s[r * nl + lane] + h[r * nl + lane])
        out[:, t * LANES:(t + 1) * LANES] = acc


def dequant_t(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
              high: np.ndarray | None, kind: int, bits: int, zero: float, groups: int,
              t0: int, t1: int, out: np.ndarray) -> None:
    """Tiles t0..t1 of W -> out (K, (t1-t0)*LANES) float32: that slice of W.T, row-major
    in the output rows, so BLAS computes x @ out without a transpose. One compiled kernel
    per code width: one kernel branching on ``bits`` inside ran 4x slower on 4-bit
    weights (Q4_1 1536x768, 1 thread: 2.3 -> 0.58 ms)."""
    if bits == 8:
        _dequant_t8(codes, blocks, halves, kind, zero, groups, t0, t1, out)
    else:
        _dequant_t_nibbles(codes, blocks, halves, high, kind, zero, groups, t0, t1, out)


@_jit()
def _dequant_t8(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, kind: int,
                zero: float, groups: int, t0: int, t1: int, out: np.ndarray) -> None:
    nl = codes.shape[2]  # == LANES, a runtime trip count (module docstring)
    sg = np.empty(nl, dtype=np.float32)
    sg2 = np.empty(nl, dtype=np.float32)
    zg = np.empty(nl, dtype=np.float32)
    for t in range(t0, t1):
        col = (t - t0) * LANES
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, 8, kind, zero, sg, sg2, zg)
            for j in range(GROUP):
                row = codes[blk, j]
                o = out[g * GROUP + j, col:col + nl]
                s = sg if j < 16 else sg2
                for lane in range(nl):
                    o[lane] = s[lane] * _f32(np.int32(row[lane])) + zg[lane]


@_jit()
def _dequant_t_nibbles(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray,
                       high: np.ndarray | None, kind: int, zero: float, groups: int, t0: int,
                       t1: int, out: np.ndarray) -> None:
    """4-bit codes, or 5-bit ones with their plane of high bits ``high`` (nblk, 4, LANES)."""
    nl = codes.shape[2]
    c = 4 if high is None else 5
    sg = np.empty(nl, dtype=np.float32)
    sg2 = np.empty(nl, dtype=np.float32)
    zg = np.empty(nl, dtype=np.float32)
    for t in range(t0, t1):
        col = (t - t0) * LANES
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, c, kind, zero, sg, sg2, zg)
            for j in range(16):
                row = codes[blk, j]
                lo = out[g * GROUP + j, col:col + nl]
                hi = out[g * GROUP + 16 + j, col:col + nl]
                if high is None:
                    for lane in range(nl):  # one store per loop: two ran slower
                        lo[lane] = sg[lane] * _f32(np.int32(row[lane] & np.uint8(15))) + zg[lane]
                    for lane in range(nl):
                        hi[lane] = sg2[lane] * _f32(np.int32(row[lane] >> np.uint8(4))) + zg[lane]
                else:
                    hb = high[blk]
                    for lane in range(nl):
                        a = np.int32(row[lane] & np.uint8(15)) | _high(hb, j, lane)
                        lo[lane] = sg[lane] * _f32(a) + zg[lane]
                    for lane in range(nl):
                        b = np.int32(row[lane] >> np.uint8(4)) | _high(hb, j + 16, lane)
                        hi[lane] = sg2[lane] * _f32(b) + zg[lane]


@_jit(fastmath=False)
def gather_rows(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, kind: int,
                bits: int, zero: float, groups: int, ids: np.ndarray, out: np.ndarray) -> None:
    """Embedding lookup: rows ``ids`` of W, dequantized into out (n, K)."""
    c = bits  # rows of codes: 32 codes of ``bits`` bits are ``bits`` float32 words a lane
    sg = np.empty(LANES, dtype=np.float32)
    sg2 = np.empty(LANES, dtype=np.float32)
    zg = np.empty(LANES, dtype=np.float32)
    for i in range(ids.shape[0]):
        t, lane = divmod(ids[i], LANES)
        for g in range(groups):
            blk = t * groups + g
            _block_scales(codes, blocks, halves, blk, c, kind, zero, sg, sg2, zg)
            s, s2, z = sg[lane], sg2[lane], zg[lane]
            if bits != 8:
                hb = codes[blk, 16:20]
                for j in range(16):
                    q = np.int32(codes[blk, j, lane])
                    a = np.int32(q & 15)
                    b = np.int32(q >> 4)
                    if bits == 5:
                        a |= _high(hb, j, lane)
                        b |= _high(hb, j + 16, lane)
                    out[i, g * GROUP + j] = s * _f32(a) + z
                    out[i, g * GROUP + 16 + j] = s2 * _f32(b) + z
            else:
                for j in range(GROUP):
                    q = _f32(np.int32(codes[blk, j, lane]))
                    out[i, g * GROUP + j] = (s if j < 16 else s2) * q + z


# --- small fused ops for the token loop (one call instead of 4-6 NumPy passes) ----------

# The decode step's row kernels: no reassociation (as attend_rows), so a specialisation
# compiled in this process and one loaded from numba's cache give the same bits (a lone
# row and a batch, contiguous or strided, may each take either); sums in a fixed order.
@_jit(fastmath=_NO_REASSOC)
def rms_norm_rows(x: np.ndarray, w: np.ndarray, eps: float, out: np.ndarray) -> None:
    n, d = x.shape
    for i in range(n):
        ss = _dot8(x[i], x[i])
        # Scalars kept float32: a float64 factor (math.sqrt, eps) widens the row loop.
        r = _f32(1.0 / math.sqrt(ss / d + eps))
        for k in range(d):
            out[i, k] = x[i, k] * r * w[k]


@_jit(fastmath=_NO_REASSOC)
def silu_mul_flat(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    for k in range(g.shape[0]):
        out[k] = g[k] / (_f32(1.0) + _exp(-g[k])) * u[k]


@_jit(fastmath=_NO_REASSOC)
def silu_mul_rows(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """out (T, n) = silu(g) * u for rows of g and u (T, n) of unit stride, strided or not
    (the gate and up columns of one stacked product): no copy, the bits of
    :func:`silu_mul_flat`."""
    for r in range(g.shape[0]):
        silu_mul_flat(_unit(g[r], out), _unit(u[r], out), out[r])


SILU_CHUNK = 4096  # elements per unit of silu_mul_chunks' split


@_jit(inline="always")
def silu_rows_per(n: int) -> int:
    """Rows of ``n`` elements in one part of :func:`silu_mul_chunks` (about SILU_CHUNK
    elements, at least one row); the helpers' split of a prefill's SiLU cuts the same."""
    return max(1, SILU_CHUNK // n)


@_jit(parallel=True, fastmath=_NO_REASSOC)
def silu_mul_chunks(g: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """:func:`silu_mul_rows` over parts of about SILU_CHUNK elements, split between numba's
    threads (a prefill's gate: ~200 k elements a SmolLM2 layer at 138 tokens)."""
    t, n = g.shape
    per = silu_rows_per(n)
    for c in prange((t + per - 1) // per):
        a = c * per
        b = min(a + per, t)
        silu_mul_rows(g[a:b], u[a:b], out[a:b])


@_jit(fastmath=_NO_REASSOC)
def rope_rows(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray) -> None:
    """NeoX (half-split) RoPE. x (rows, t, d) with tables (t, d/2)."""
    rows, t, d = x.shape
    h = d // 2
    for r in range(rows):
        for i in range(t):
            for k in range(h):
                a = x[r, i, k]
                b = x[r, i, k + h]
                out[r, i, k] = a * cos[i, k] - b * sin[i, k]
                out[r, i, k + h] = b * cos[i, k] + a * sin[i, k]


# --- encoder / prefill ops --------------------------------------------------------------
# Serial on purpose: they run between BLAS calls, and a numba (OpenMP) pool spinning next
# to OpenBLAS's pool on the same two cores halved MiniLM throughput (115 vs 229
# sentences/s, quiet machine, 2 threads). The encoder gets its parallelism from whole
# calls side by side (CpuBackend.map_calls), prefill from BLAS; the mat-vec kernels,
# which run with no BLAS around them, carry it in decode.

@_jit(inline="always")
def _erf(a: float) -> float:
    """Rational approximation of erf (Eigen's generic_fast_erf_float), |error| < 4e-7:
    pure multiply-adds and one division, so the GELU loop vectorises (math.erf is a
    scalar libm call, ~10x slower here)."""
    x = min(max(a, _f32(-4.0)), _f32(4.0))
    x2 = x * x
    p = x2 * _f32(-2.72614225801306e-10) + _f32(2.77068142495902e-08)
    p = x2 * p + _f32(-2.10102402082508e-06)
    p = x2 * p + _f32(-5.69250639462346e-05)
    p = x2 * p + _f32(-7.34990630326855e-04)
    p = x2 * p + _f32(-2.95459980854025e-03)
    p = x2 * p + _f32(-1.60960333262415e-02)
    q = x2 * _f32(-1.45660718464996e-05) + _f32(-2.13374055278905e-04)
    q = x2 * q + _f32(-1.68282697438203e-03)
    q = x2 * q + _f32(-7.37332916720468e-03)
    q = x2 * q + _f32(-1.42647390514189e-02)
    return x * p / q


@_jit()
def gelu_rows(x: np.ndarray, out: np.ndarray) -> None:
    """Exact (erf) GELU of a (rows, d) array."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            v = x[i, k]
            out[i, k] = _f32(0.5) * v * (_f32(1.0) + _erf(v * _f32(0.7071067811865476)))


@_jit()
def layer_norm_rows(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float,
                    out: np.ndarray) -> None:
    n, d = x.shape
    for i in range(n):
        mu = _f32(0.0)
        for k in range(d):
            mu += x[i, k]
        mu = _f32(mu / d)  # float32 scalars: a float64 one widens the row loops
        var = _f32(0.0)
        for k in range(d):
            t = x[i, k] - mu
            var += t * t
        r = _f32(1.0 / math.sqrt(var / d + eps))
        for k in range(d):
            out[i, k] = (x[i, k] - mu) * r * w[k] + b[k]


@_jit()
def softmax_scores(sc: np.ndarray, scale: float, causal_offset: int,
                   mask: np.ndarray) -> None:
    """In place: sc (b, h, t, s) raw q.k scores -> attention weights.

    mask (b, s) is 1 for keys to attend and 0 for padding (exact zero weight);
    causal_offset >= 0 lets query i see keys 0 .. causal_offset + i, < 0: no limit.
    The two matmuls around it stay with BLAS; a fused numba kernel with short key loops
    measured 1.6x slower than NumPy, this split 1.4x faster (README)."""
    b, h, t, s = sc.shape
    scale = _f32(scale)  # a Python float arrives as float64 and widened the whole loop
    for bh in range(b * h):
        bi = bh // h
        hh = bh - bi * h
        keep = mask[bi]
        for i in range(t):
            row = sc[bi, hh, i]
            last = s if causal_offset < 0 else min(s, causal_offset + i + 1)
            # Selects, not branches around the exp, so the loops vectorise.
            m = _f32(-3.0e38)
            for j in range(last):
                x = row[j] * scale if keep[j] > 0 else _f32(-3.0e38)
                row[j] = x
                m = x if x > m else m
            tot = _f32(0.0)
            for j in range(last):
                e = _exp(row[j] - m)
                e = e if keep[j] > 0 else _f32(0.0)
                row[j] = e
                tot += e
            inv = _f32(1.0) / tot
            for j in range(last):
                row[j] *= inv
            for j in range(last, s):
                row[j] = _f32(0.0)



@_jit()
def bias_gelu_rows(x: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """out = gelu(x + bias) over (rows, d), as np.add then :func:`gelu_rows`, the bias
    costing no pass of its own. ``out`` must not overlap ``x``: LLVM checks at run time,
    and on overlap takes its scalar loop (in place measured 8x slower)."""
    n, d = x.shape
    for i in range(n):
        for k in range(d):
            v = x[i, k] + bias[k]
            out[i, k] = _f32(0.5) * v * (_f32(1.0) + _erf(v * _f32(0.7071067811865476)))


@_jit()
def add_norm_rows(x: np.ndarray, bias: np.ndarray, res: np.ndarray, w: np.ndarray,
                  b: np.ndarray, eps: float, out: np.ndarray) -> None:
    """out = layer_norm((x + bias) + res) over (rows, d), the sums rounded in that order
    as NumPy's two adds; one pass writes the sum into ``out``, the norm then runs in
    place there as :func:`layer_norm_rows`. ``out`` must not overlap ``x`` or ``res``
    (see :func:`bias_gelu_rows`): 3x the three separate passes when it does not."""
    n, d = x.shape
    for i in range(n):
        mu = _f32(0.0)
        for k in range(d):
            t = (x[i, k] + bias[k]) + res[i, k]
            out[i, k] = t
            mu += t
        mu = _f32(mu / d)
        var = _f32(0.0)
        for k in range(d):
            t = out[i, k] - mu
            var += t * t
        r = _f32(1.0 / math.sqrt(var / d + eps))
        for k in range(d):
            out[i, k] = (out[i, k] - mu) * r * w[k] + b[k]


@_jit()
def softmax_keys(sc: np.ndarray, scale: float, keep: np.ndarray) -> None:
    """In place: sc (b, s, m) raw scores with the keys on axis 1 (m = heads x queries) ->
    attention weights over axis 1; keys with ``keep[b, j] == 0`` (padding) get weight 0.

    The keys-outer layout makes every loop run over m (heads x queries, ~280 for a chunk of
    23-token inputs) instead of over one row's keys: :func:`softmax_scores` over (b, h,
    t, s) spent 3.2 ns a score with short encoder inputs, mostly in the scalar remainders
    of its vector loops."""
    b, s, m = sc.shape
    scale = _f32(scale)
    top = np.empty(m, dtype=np.float32)
    tot = np.empty(m, dtype=np.float32)
    for bi in range(b):
        x = sc[bi]
        top[:] = _f32(-3.0e38)
        for j in range(s):
            if keep[bi, j] > 0:
                row = x[j]
                for c in range(m):
                    v = row[c] * scale
                    top[c] = v if v > top[c] else top[c]
        tot[:] = _f32(0.0)
        for j in range(s):
            row = x[j]
            if keep[bi, j] > 0:
                for c in range(m):
                    e = _exp(row[c] * scale - top[c])
                    row[c] = e
                    tot[c] += e
            else:
                row[:] = _f32(0.0)
        for c in range(m):
            tot[c] = _f32(1.0) / tot[c]
        for j in range(s):
            if keep[bi, j] > 0:
                row = x[j]
                for c in range(m):
                    row[c] *= tot[c]
