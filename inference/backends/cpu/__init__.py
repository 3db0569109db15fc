"""The ``cpu`` backend: NumPy's op semantics over quantized weights, with numba kernels.

Files, by what they hold (docs/ops.md maps each op to its method and kernel):

- ``backend``: :class:`CpuBackend`, the ops and how they share work between threads;
- ``routing``: which kernel a product (``linear``) takes, in one table;
- ``threads``: the worker threads prefill products are shared with;
- ``features``: what the target CPU can do, and the tuning applied before compiling;
- ``ir``: the jit options and LLVM IR pieces every kernel uses;
- ``layout``: the lane-block layout of packed weights; ``pack``: packing at load;
- ``matvec_float`` / ``matvec_int``: decode mat-vecs over float32 or quantized activations;
- ``quantize``: activations quantized for the integer kernels;
- ``kdot`` / ``raw``: kernels over weights kept as the file stores them;
- ``dequant``: packed weights back to float32 (prefill sgemm, embeddings);
- ``fused``: norms, activations, RoPE and softmaxes as single row-wise calls;
- ``attention``: decode, batched-decode and prefill attention;
- ``replay``: a captured decode step, replayed token after token.
- ``warm``: every kernel compiled into numba's cache once, at install.
"""

from inference.numba_import import import_numba as _import_numba

_import_numba()  # first, where nothing imported numba yet (two of its imports deferred)

from inference.backends.cpu.kernel_load import install as _install_kernel_load  # noqa: E402

_install_kernel_load()  # before any kernel module below is imported (decorated)

from inference.backends.cpu.backend import (  # noqa: E402
    ACTIVATIONS,
    ACTIVATIONS_ENV,
    MATVEC_ROWS,
    CpuBackend,
    create,
    probe,
)

__all__ = ["ACTIVATIONS", "ACTIVATIONS_ENV", "MATVEC_ROWS", "CpuBackend", "create", "probe"]
