"""The one cuBLAS call of the prefill path: cublasGemmEx with 16-bit inputs, float32 output
and float32 accumulation (CUBLAS_COMPUTE_32F: tensor cores on sm_75+ for half, sm_80+ for
bfloat16).

:func:`row_major_nt` maps our row-major ``y = x @ w.T`` onto cuBLAS's column-major
arguments; :func:`emulate_gemm_ex` is the emulator's stand-in for cublasGemmEx, written from
cuBLAS's documented contract (column-major operands read through their leading dimensions,
op() per transpose flag), not from our mapping, so a wrong transpose, leading dimension or
type code in the mapping gives wrong numbers or an error here, as it would on a GPU.
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


_STORAGE = {v: k for k, v in DATA_TYPES.items()}


def _col_major(buf: np.ndarray, type_code: int, rows: int, cols: int, ld: int,
               what: str) -> np.ndarray:
    """The column-major rows x cols matrix at ``buf`` with leading dimension ``ld``, widened
    to float32 (exact for half and bfloat16); checks cuBLAS's rules and the buffer's size."""
    if type_code not in _STORAGE or np.dtype(buf.dtype) != _STORAGE[type_code]:
        raise ValueError(f"{what}: type code {type_code} does not describe a {buf.dtype} buffer")
    if ld < max(1, rows):
        raise ValueError(f"{what}: leading dimension {ld} < {rows} rows")
    flat = buf.reshape(-1)
    if (cols - 1) * ld + rows > flat.size:
        raise ValueError(f"{what}: {rows} x {cols} with ld {ld} runs past {flat.size} elements")
    if type_code == CUDA_R_16BF:
        flat = (flat.astype(np.uint32) << np.uint32(16)).view(np.float32)
    flat = np.ascontiguousarray(flat, dtype=np.float32)
    # element (i, j) at flat[i + j * ld]
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (4, 4 * ld), writeable=False)


def emulate_gemm_ex(g: GemmEx, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """cublasGemmEx (alpha 1, beta 0) on host buffers: float32 products and sums (NumPy's
    float32 matmul), as CUBLAS_COMPUTE_32F; only C's m x n elements are written."""
    if g.compute != CUBLAS_COMPUTE_32F or g.a_type != g.b_type or g.a_type == CUDA_R_32F:
        raise ValueError("only 16-bit A and B of one type with CUBLAS_COMPUTE_32F are used")
    if g.c_type != CUDA_R_32F or c.dtype != np.float32:
        raise ValueError("C must be float32 (CUDA_R_32F)")
    ta, tb = g.transa == CUBLAS_OP_T, g.transb == CUBLAS_OP_T
    A = _col_major(a, g.a_type, *((g.k, g.m) if ta else (g.m, g.k)), g.lda, "A")
    B = _col_major(b, g.b_type, *((g.n, g.k) if tb else (g.k, g.n)), g.ldb, "B")
    prod = np.matmul(A.T if ta else A, B.T if tb else B)  # m x n, float32
    if g.ldc < max(1, g.m) or (g.n - 1) * g.ldc + g.m > c.size:
        raise ValueError(f"C: {g.m} x {g.n} with ldc {g.ldc} does not fit {c.size} elements")
    flat = c.reshape(-1)
    if not np.shares_memory(flat, c):
        raise ValueError("C must be a contiguous buffer")
    np.lib.stride_tricks.as_strided(flat, (g.m, g.n), (4, 4 * g.ldc))[...] = prod
