"""The one cuBLAS call of the prefill path: cublasGemmEx with 16-bit inputs, float32 output
and float32 accumulation (CUBLAS_COMPUTE_32F: tensor cores on sm_75+ for half, sm_80+ for
bfloat16).

:func:`row_major_nt` maps our row-major ``y = x @ w.T`` onto cuBLAS's column-major
arguments. The tests' host emulator checks that mapping against a stand-in for cublasGemmEx
written from cuBLAS's documented contract (tests/kernels/emulator/cublas.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# cuda library_types.h (checked against CUDA 13.0's header) and cublas_api.h.
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1

BF16 = np.dtype(np.uint16)  # bfloat16 bit patterns (ops.BF16)
# Storage dtype -> cudaDataType of a GEMM operand.
DATA_TYPES = {np.dtype(np.float16): CUDA_R_16F, BF16: CUDA_R_16BF,
              np.dtype(np.float32): CUDA_R_32F}


@dataclass(frozen=True)
class GemmEx:
    """cublasGemmEx's scalar arguments: C (m x n, column-major, ldc) = op(A) op(B), alpha 1,
    beta 0; op(A) is m x k, op(B) k x n."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    a_type: int
    b_type: int
    c_type: int
    compute: int = CUBLAS_COMPUTE_32F


def row_major_nt(x: Any, w: Any, y: Any) -> GemmEx:
    """Arguments for y (t, rows) = x (t, k) @ w (rows, k).T, all C-contiguous row-major.

    A row-major (r, c) array is the column-major (c, r) array with leading dimension c, so
    column-major y.T (rows x t) = w (read as k x rows, transposed) @ x.T (k x t): A = w with
    op T, B = x with op N."""
    t, k = x.shape
    rows = w.shape[0]
    return GemmEx(CUBLAS_OP_T, CUBLAS_OP_N, m=rows, n=t, k=k, lda=k, ldb=k, ldc=rows,
                  a_type=DATA_TYPES[np.dtype(w.dtype)], b_type=DATA_TYPES[np.dtype(x.dtype)],
                  c_type=DATA_TYPES[np.dtype(y.dtype)])
