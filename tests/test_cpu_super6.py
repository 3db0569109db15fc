"""Q4_K and Q5_K in the ``SUPER6`` lane layout (inference/backends/cpu/layout.py): two byte
rows of scales a block (the file's 6-bit scales and mins) and the float16 d and dmin once
per super-block (its super row), instead of ``AFFINE``'s float32 scale and bias rows.

``f32(d) * sc`` and ``-(f32(dmin) * m)`` are exact in float32, so every kernel must give
bitwise what it gives the same weights packed ``AFFINE``, and unpacking must give gguf-py's
dequantization bit for bit; random K-quant blocks (random 6-bit scales and mins, float16 d
and dmin of both signs) cover all scale values.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.backends.cpu import CpuBackend
from inference.backends.cpu import pack as cpu_pack
from inference.backends.cpu.layout import AFFINE, SUPER6
from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import TensorData
from tests.bundled import random_tensor

TYPES = ("Q4_K", "Q5_K")
ROWS, K = 70, 512  # a partial last tile, two super-blocks a row


def _tensor(qtype: str) -> TensorData:
    """Random blocks with d and dmin replaced by random float16s of both signs."""
    t = random_tensor(qtype, ROWS, K, seed=11)
    raw = np.array(t.data).view(np.uint8).reshape(-1, BLOCK_TYPES[qtype].type_size)
    dd = np.random.default_rng(5).uniform(-2.0, 2.0, (len(raw), 2)).astype(np.float16)
    raw[:, 0:4] = dd.view(np.uint8)
    return TensorData(t.name, t.shape, qtype, raw.reshape(ROWS, -1))


@pytest.fixture(scope="module", params=TYPES)
def pair(request):
    t = _tensor(request.param)
    bits = cpu_pack.packed_bits(t)
    return t, cpu_pack._pack(t, bits), cpu_pack._pack(t, bits, AFFINE)


def test_super6_is_two_byte_rows_of_scales_and_unpacks_to_gguf_py(pair):
    t, w, a = pair
    # a block: its code bytes and two byte rows (sc, m); AFFINE: two float32 rows
    assert (w.kind, w.codes.shape[1], a.blocks.shape[1]) == (SUPER6, 4 * w.bits + 2,
                                                             w.bits + 2)
    assert cpu_pack.packed_nbytes(t) == w.nbytes
    want = dequantize(np.asarray(t.data), GGMLQuantizationType[t.qtype]).astype(np.float32)
    np.testing.assert_array_equal(cpu_pack.unpack(w).view(np.uint32),
                                  want.reshape(ROWS, K).view(np.uint32))


@pytest.mark.parametrize("mode", ["float", "int16", "int8"])
def test_every_kernel_gives_the_affine_layouts_bits(pair, mode):
    _, w, a = pair
    b = CpuBackend(mode)
    x = np.random.default_rng(2).standard_normal((9, K)).astype(np.float32) * 3
    for rows in (1, 2, 9):  # decode (one row, a pair) and a prefill product
        np.testing.assert_array_equal(b.linear(x[:rows], w).view(np.uint32),
                                      b.linear(x[:rows], a).view(np.uint32), (mode, rows))
    for got, want in zip(b.linears(x, [(w, None), (w, None)]),
                         b.linears(x, [(a, None), (a, None)]), strict=True):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ids = np.array([0, 31, 33, ROWS - 1])
    np.testing.assert_array_equal(b.embedding(w, ids).view(np.uint32),
                                  b.embedding(a, ids).view(np.uint32))
