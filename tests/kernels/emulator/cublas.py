"""The host emulator's stand-in for cublasGemmEx (kernels/cuda/blas.py describes the call).

Written from cuBLAS's documented contract (column-major operands read through their leading
dimensions, op() per transpose flag), not from our mapping (:func:`row_major_nt`), so a wrong
transpose, leading dimension or type code in the mapping gives wrong numbers or an error
here, as it would on a GPU.
"""

from __future__ import annotations

import numpy as np

from kernels.cuda.blas import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_OP_T,
    CUDA_R_16BF,
    CUDA_R_32F,
    DATA_TYPES,
    GemmEx,
)

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
