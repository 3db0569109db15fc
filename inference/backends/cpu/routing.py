"""Which kernel a product ``x @ W.T`` of the cpu backend takes: one function, one table.

=====================================  ===========================  =====================
weight                                 rows <= MATVEC_ROWS (decode)  more rows (prefill)
=====================================  ===========================  =====================
float32 array                          ``BLAS``                     ``PRODUCTS``
packed lane blocks, float activations  ``MATVEC_FLOAT``             ``PRODUCTS``
packed lane blocks, int activations    ``MATVEC_INT``               ``PRODUCTS``
Q2_K/Q3_K bytes, int activations, AVX2 ``KDOT``                     ``PRODUCTS``
F16/BF16/Q2_K/Q3_K bytes otherwise     ``RAW``                      ``PRODUCTS``
other file bytes (MLX 3/5/6-bit)       ``PRODUCTS``                 ``PRODUCTS``
=====================================  ===========================  =====================

A step being captured for replay keeps float32 products on ``BLAS`` whatever the rows
(a capture never has prefill rows of quantized weights: those raise ``NotCapturable``).
``PRODUCTS`` shares a prefill product out between the threads; inside it each weight's
kernel is :func:`prefill_route`'s (docs/ops.md):

=================================================================  ============
weight of a ``PRODUCTS`` product                                   kernel
=================================================================  ============
packed, ``INTEGER_BITS`` codes, integer prefill on                 ``INTEGER``
packed, ``gemm_int.GEMM_BITS`` codes, int activations, on AVX2     ``GEMM_INT``
anything else                                                      ``DEQUANT``
=================================================================  ============

``INTEGER`` is the decode kernels over all the rows (numba's threads when every weight of
the product takes it, else a range of rows per thread); ``DEQUANT`` dequantizes a few rows
or tiles at a time into a thread's scratch and multiplies them by a one-thread sgemm (a
float32 weight is multiplied as it is). "Integer prefill on" is the backend's
``_numba_prefill``: integer activations, VNNI row groups and a threading layer that runs
kernels from two threads at once.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from inference.backends.cpu import features, gemm_int, kdot
from inference.backends.cpu.pack import PackedWeight, RawWeight

# Up to this many rows a linear is the decode mat-vec, numba's threads over its tiles
# (dequant+sgemm cost more per row even at 16 rows); above, a prefill product shared out
# by ``CpuBackend._products`` (for 4/5-bit weights the same kernels, so their rows' results
# do not depend on the cut). docs/cpu-backend.md, "Prefill".
MATVEC_ROWS = 8

# Packed code widths whose prefill products take the integer kernels rather than
# dequant+sgemm (with integer activations, on AVX-512 VNNI). Measured per product at 138
# rows, SmolLM2 shapes (docs/benchmarks.md, prefill products), with the float tail in the
# intrinsics: 4/5-bit 0.68-0.71x the time of dequant+sgemm at 1 thread, 8-bit (Q8_0, Q6_K)
# 0.69-0.71x (1.03-1.25x before that tail). Not on AVX2, where the decode kernels go by row
# pairs (0.80-0.93x sgemm's speed on the Q3_K_M prefill): there 4/5/6/8-bit codes take
# the integer GEMM (docs/cpu-backend.md, "Prefill").
INTEGER_BITS = frozenset({4, 5, 6, 8})

Route = Literal["blas", "matvec_float", "matvec_int", "kdot", "raw", "products"]
BLAS, MATVEC_FLOAT, MATVEC_INT, KDOT, RAW, PRODUCTS = (
    "blas", "matvec_float", "matvec_int", "kdot", "raw", "products")


def route(w: Any, rows: int, activations: str, capturing: bool) -> Route:
    """The kernel family of ``x @ W.T`` for ``rows`` token rows of ``x`` (the table above);
    ``activations`` as ``CpuBackend.activations``, ``capturing`` while a step is taped."""
    decode = rows <= MATVEC_ROWS
    if isinstance(w, np.ndarray):
        return "blas" if decode or capturing else "products"
    if isinstance(w, RawWeight):
        if w.code is None or not decode:
            return "products"
        if w.code in kdot.CODES and activations != "float" and kdot.available():
            return "kdot"
        return "raw"
    if not decode:
        return "products"
    return "matvec_float" if activations == "float" else "matvec_int"


PrefillRoute = Literal["integer", "gemm_int", "dequant"]
INTEGER, GEMM_INT, DEQUANT = "integer", "gemm_int", "dequant"


def integer_prefill(bits: int | None, numba_prefill: bool) -> bool:
    """Whether prefill products of ``bits``-bit packed codes (None: not packed) take the
    integer kernels: the one rule for the products and the load's estimate of them."""
    return bits in INTEGER_BITS and numba_prefill


def prefill_route(w: Any, activations: str, numba_prefill: bool) -> PrefillRoute:
    """The kernel of weight ``w`` inside a ``PRODUCTS`` product (the second table above);
    ``numba_prefill`` as ``CpuBackend._numba_prefill``."""
    if isinstance(w, PackedWeight):
        if integer_prefill(w.bits, numba_prefill):
            return "integer"
        if w.bits in gemm_int.GEMM_BITS and activations != "float" \
                and features.form() == "avx2":
            return "gemm_int"
    return "dequant"
