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
``PRODUCTS`` shares a prefill product out between the threads; inside it the integer
kernels, the integer GEMM (AVX2) or dequantize + sgemm are chosen per weight
(``CpuBackend._integer``, ``_gemm``), as docs/ops.md lists.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from inference.backends.cpu import kdot
from inference.backends.cpu.pack import RawWeight

# Up to this many rows a linear is the decode mat-vec, numba's threads over its tiles
# (dequant+sgemm cost more per row even at 16 rows); above, a prefill product shared out
# by ``CpuBackend._products`` (for 4/5-bit weights the same kernels, so their rows' results
# do not depend on the cut). docs/cpu-backend.md, "Prefill".
MATVEC_ROWS = 8

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
