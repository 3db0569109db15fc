"""Q6_K in 26 byte rows a block (inference/backends/cpu/layout.py): 4-bit nibbles, two
planes of high bits (bits 4 and 5) and the ``SUB16`` int8 scales, its float16 ``d`` in the
super-block's super row (the file's 840 bytes a 1024 weights), against its earlier 8-bit
form (one int8 code ``q - 32`` a byte, 34 byte rows), which the kernels still take.

The codes are the same integers either way and every kernel keeps its sums and float
expression, so each must give bitwise what it gives the 8-bit form: the decode mat-vecs
(float, int16 and int8 activations; one row and a pair), the prefill products (dequant +
sgemm, the integer GEMM, the integer kernels), the embedding gather, and a captured step's
replay; and unpacking must give gguf-py's dequantization bit for bit. Random Q6_K blocks
with random float16 ``d`` of both signs cover all codes and scales.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.backends.cpu import CpuBackend, dequant, gemm_int
from inference.backends.cpu import pack as cpu_pack
from inference.backends.cpu import quantize as cpu_quantize
from inference.backends.cpu.layout import SUB16
from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import TensorData
from tests.bundled import random_tensor

ROWS, K = 70, 512  # a partial last tile, two super-blocks a row


def _tensor() -> TensorData:
    """Random Q6_K blocks with d replaced by random float16s of both signs."""
    t = random_tensor("Q6_K", ROWS, K, seed=13)
    raw = np.array(t.data).view(np.uint8).reshape(-1, BLOCK_TYPES["Q6_K"].type_size)
    d = np.random.default_rng(6).uniform(-2.0, 2.0, len(raw)).astype(np.float16)
    raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
    return TensorData(t.name, t.shape, "Q6_K", raw.reshape(ROWS, -1))


@pytest.fixture(scope="module")
def pair():
    t = _tensor()
    return t, cpu_pack._pack(t, cpu_pack.packed_bits(t)), cpu_pack._pack(t, 8)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def test_q6_k_is_as_large_as_the_file_and_unpacks_to_gguf_py(pair):
    t, w, old = pair
    assert (w.bits, w.kind, w.codes.shape[1], old.codes.shape[1]) == (6, SUB16, 26, 34)
    assert cpu_pack.packed_nbytes(t) == w.nbytes
    padded = -(-ROWS // 32) * 32  # rows in whole tiles
    assert w.nbytes == padded * BLOCK_TYPES["Q6_K"].row_bytes(K)  # as the file: 840 / 1024
    assert np.shares_memory(w.high, w.data)  # the planes are a view, not a copy
    want = dequantize(np.asarray(t.data), GGMLQuantizationType.Q6_K).astype(np.float32)
    np.testing.assert_array_equal(_bits(cpu_pack.unpack(w)), _bits(want.reshape(ROWS, K)))
    np.testing.assert_array_equal(_bits(cpu_pack.unpack(old)), _bits(want.reshape(ROWS, K)))


@pytest.mark.parametrize("mode", ["float", "int16", "int8"])
def test_every_kernel_gives_the_8_bit_forms_bits(pair, mode):
    _, w, old = pair
    b = CpuBackend(mode)
    x = np.random.default_rng(2).standard_normal((9, K)).astype(np.float32) * 3
    for rows in (1, 2, 9):  # decode (one row, a pair) and a prefill product
        np.testing.assert_array_equal(_bits(b.linear(x[:rows], w)), _bits(b.linear(x[:rows], old)),
                                      (mode, rows))
    for got, want in zip(b.linears(x, [(w, None), (w, None)]),
                         b.linears(x, [(old, None), (old, None)]), strict=True):
        np.testing.assert_array_equal(_bits(got), _bits(want))
    ids = np.array([0, 31, 33, ROWS - 1])
    np.testing.assert_array_equal(_bits(b.embedding(w, ids)), _bits(b.embedding(old, ids)))


def test_prefill_kernels_give_the_8_bit_forms_bits(pair):
    """dequant+sgemm's dequantization and the integer GEMM, called directly (which of
    them a product takes depends on the CPU: tests/test_cpu_routing.py)."""
    _, w, old = pair
    tiles = len(w.codes) // w.groups
    outs = []
    for v in (w, old):
        wt = np.empty((K, tiles * 32), dtype=np.float32)
        dequant.dequant_t(v.codes, v.blocks, v.halves, v.high, v.kind, v.bits, v.zero,
                          v.groups, 0, tiles, wt)
        outs.append(wt)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
    x = np.random.default_rng(3).standard_normal((5, K)).astype(np.float32)
    xq = cpu_quantize.quantize_rows(x, "int16", cpu_quantize.narrow("int16", 6))
    outs = []
    for v in (w, old):
        out = np.zeros((5, tiles * 32), dtype=np.float32)
        gemm_int.gemm_int(v.codes, v.high, v.blocks, v.kind, v.zero, *xq, out, 0, tiles)
        outs.append(out)
    np.testing.assert_array_equal(_bits(outs[0]), _bits(outs[1]))
