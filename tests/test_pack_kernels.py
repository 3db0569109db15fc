"""The packing kernels (inference/backends/cpu/pack_kernels.py), which a first load packs
every GGML type with, write byte for byte the lane blocks of the NumPy packing
(``pack._pack``, the layout's reference), on one thread and in spans on two, for rows that
end inside a tile (padding lanes) and rows of two K-quant super-blocks; the blocks unpack
to gguf-py's dequantization of the file's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.backends.cpu import pack as cpu_pack
from inference.backends.cpu.pack_kernels import TYPE_CODES
from tests.bundled import random_tensor

ROWS, K = 70, 512  # a partial last tile; two super-blocks a row


def _same(a: cpu_pack.PackedWeight, b: cpu_pack.PackedWeight) -> None:
    assert (a.bits, a.zero, a.kind, a.shape, a.blocks.shape) == (
        b.bits, b.zero, b.kind, b.shape, b.blocks.shape)
    assert a.blocks.tobytes() == b.blocks.tobytes()


@pytest.mark.parametrize("qtype", sorted(TYPE_CODES))
def test_kernel_packs_the_bytes_of_the_numpy_packing(qtype: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    t = random_tensor(qtype, ROWS, K, seed=len(qtype) + TYPE_CODES[qtype])
    bits = cpu_pack.packed_bits(t)
    assert bits is not None
    want = cpu_pack._pack(t, bits)
    one = cpu_pack._pack_shared(t, bits)  # one span, on this thread
    _same(one, want)
    monkeypatch.setattr(cpu_pack, "SPAN_WEIGHTS", cpu_pack.LANES * K)  # spans of one tile
    monkeypatch.setattr(cpu_pack, "pack_workers", lambda: 2)
    monkeypatch.setattr(cpu_pack, "SHARED_MIN_WEIGHTS", 0)
    _same(cpu_pack._pack_shared(t, bits), want)
    ref = dequantize(np.asarray(t.data), GGMLQuantizationType[qtype]).astype(np.float32)
    np.testing.assert_array_equal(cpu_pack.unpack(one), ref.reshape(ROWS, K))


def test_a_file_map_and_a_copy_pack_alike() -> None:
    """Read-only rows (a model file's map) and writable ones (stacked parts joined) go
    through the kernel alike."""
    t = random_tensor("Q4_K", ROWS, K, seed=5)
    ro = np.array(t.data)
    ro.flags.writeable = False
    bits = cpu_pack.packed_bits(t)
    assert bits is not None
    a = cpu_pack._pack_shared(t, bits)
    b = cpu_pack._pack_shared(type(t)(t.name, t.shape, t.qtype, ro), bits)
    _same(a, b)
