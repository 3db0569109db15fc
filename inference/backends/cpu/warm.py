"""Every kernel of the cpu backend compiled into numba's cache once, with progress:
``python -m inference.warm`` (``make run`` and ``make test`` run it at install) runs
:func:`warm` with the bundled models' steps; ``python -m inference.backends.cpu.warm`` runs
the products alone.

numba compiles a kernel at its first call with new argument types and keeps the machine
code in its cache (the ``__pycache__`` folders beside the sources, or ``NUMBA_CACHE_DIR``),
keyed by the CPU's features. Compiling the whole set takes minutes on 2 cores; loading it
from the cache takes about a second. Without this step the first ``generate`` after an
install pays the compiles.

What runs, with the activation mode the backend would use (``INFERDESK_CPU_ACTIVATIONS``):
each weight type's products at decode (one row, and the two calls a captured step makes)
and at prefill, the packing of every GGML type a first load packs, then the steps the
caller adds (:mod:`inference.warm`: a short generation of the bundled chat model and an
embedding of the bundled encoder, where installed: the norms, RoPE, attention, step
replay, sampling). Those load models through the engine
above the backends, so this module takes them as arguments instead of importing it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import TensorData

# One type of each kernel specialization: codes without a plane of high bits (Q4_0, Q4_1,
# Q4_K share it), with one (Q5_*), 8-bit signed (Q8_0, Q6_K), the raw file-byte kernels
# (Q2_K, Q3_K with kdot, F16 with the float loop) and float32.
WEIGHT_TYPES = ("Q4_1", "Q4_K", "Q5_0", "Q5_K", "Q8_0", "Q6_K", "Q2_K", "Q3_K", "F16", "F32")
ROWS, COLS = 64, 256  # a weight's shape: K-quant blocks are 256 wide
PREFILL_ROWS = 24  # above MATVEC_ROWS: the prefill products


def has_zero_weight(qtype: str) -> bool:
    """Whether :func:`zero_weight` makes weights of ``qtype``: GGML block types, F16, F32."""
    return qtype in ("F16", "F32") or (qtype in BLOCK_TYPES and not BLOCK_TYPES[qtype].is_float)


def zero_weight(qtype: str) -> TensorData:
    """A (ROWS, COLS) weight of ``qtype`` whose every value is zero (valid in every type)."""
    if qtype == "F32":
        return TensorData("warm", (ROWS, COLS), qtype, np.zeros((ROWS, COLS), np.float32))
    if qtype == "F16":
        return TensorData("warm", (ROWS, COLS), qtype, np.zeros((ROWS, COLS), np.float16))
    bt = BLOCK_TYPES[qtype]
    data = np.zeros((ROWS, COLS // bt.block_size * bt.type_size), np.uint8)
    return TensorData("warm", (ROWS, COLS), qtype, data)


def products(backend: Any, qtype: str, *, prefill: bool = True, embedding: bool = True) -> None:
    """``qtype``'s products as decode and (``prefill``) prefill call them and as a captured
    step does, and (``embedding``) its embedding lookup, on a zero weight."""
    from inference.backends.cpu.replay import Tape

    w = backend.weight(zero_weight(qtype))
    if embedding:
        backend.embedding(w, np.zeros((1, 1), np.int64))
    x = np.ones((PREFILL_ROWS, COLS), np.float32)
    backend.linear(x[:1], w)
    backend.linear(x[:2], w)
    if prefill:
        backend.linear(x, w)
    backend._tape = Tape(0)
    try:
        backend.linear(x[:1], w)
    finally:
        backend._tape = None


def packing() -> None:
    """Every GGML type's packing kernel (:mod:`.pack_kernels`: a model's first load packs
    its weights with them), on a zero weight of each."""
    from inference.backends.cpu.pack import pack
    from inference.backends.cpu.pack_kernels import TYPE_CODES

    for qtype in TYPE_CODES:
        pack(zero_weight(qtype))


def activation(backend: Any, op: str) -> None:
    """The activation op ``op`` (``silu_mul``, ``gelu_tanh_mul``) as a decode step and a
    prefill call it: one row, and rows enough to be shared out; over whole arrays, and over
    the column views of one stacked gate-and-up product, as a model's ``Linears`` gives
    them (a kernel specialisation of its own)."""
    from inference.backends.cpu.backend import SHARE_MIN

    act = getattr(backend, op)
    for rows in (1, SHARE_MIN // 64):
        x = np.ones((1, rows, 64), np.float32)
        act(x, x)
    for rows in (2, SHARE_MIN // 64):  # (a one-row view is C-contiguous: the first form)
        gate_up = np.ones((1, rows, 128), np.float32)
        act(gate_up[..., :64], gate_up[..., 64:])


Step = tuple[str, Callable[[], None]]  # (what it compiles, the call)


def warm(say: Callable[[str], None] = print, more: Sequence[Step] = ()) -> float:
    """Compile (or load) the kernels, each weight type's products then ``more``, saying
    each step as it starts; the seconds taken."""
    from inference.backends.cpu import CpuBackend

    t0 = time.perf_counter()
    backend = CpuBackend()
    steps: list[Step] = [
        (f"{q} products", lambda q=q: products(backend, q)) for q in WEIGHT_TYPES]
    steps.append(("GELU-tanh", lambda: activation(backend, "gelu_tanh_mul")))
    steps.append(("packing", packing))
    steps += more
    for i, (what, run) in enumerate(steps, 1):
        t = time.perf_counter()
        say(f"[{i}/{len(steps)}] cpu kernels: {what} ...")
        run()
        say(f"[{i}/{len(steps)}] cpu kernels: {what}: {time.perf_counter() - t:.1f} s")
    return time.perf_counter() - t0


def main(more: Sequence[Step] = ()) -> int:
    def say(line: str) -> None:
        print(line, flush=True)

    try:
        total = warm(say, more)
    except Exception as e:  # a failed warm-up costs speed, never the install
        print(f"cpu kernels: not compiled ahead ({type(e).__name__}: {e}); they compile "
              "at first use instead.", file=sys.stderr)
        return 0
    say(f"cpu kernels ready in {total:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
