"""What every kernel of the CPU backend compiles with: numba's options (``_jit``), and the
LLVM IR pieces numba lacks (prefetch, bit casts, float16 converts, raw addresses), plus
the fixed-order sums and the float32 exp the kernels share."""

from __future__ import annotations

from functools import partial

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from inference.backends.cpu import kernel_cache
from inference.backends.cpu.features import target_has_f16c

kernel_cache.install()  # before the first kernel below is decorated

PREFETCH = 4  # blocks ahead; 2-8 measured equal within noise, 0 is ~25% slower cold

_f32 = np.float32

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
    compile for a generic x86-64) fpext would become a call to a runtime routine the JIT
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

