"""The packing kernels (inference/backends/cpu/pack_kernels.py), which a first load packs
every GGML type with, write byte for byte the lane blocks of the NumPy packing
(``pack._pack``, the layout's reference), on one thread and in spans on two, for rows that
end inside a tile (padding lanes) and rows of two K-quant super-blocks; the blocks unpack
to gguf-py's dequantization of the file's bytes; the store of the K-quants, Q4_0, Q5_0 and
Q8_0 takes at most 3% more bytes a weight than the file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.backends.cpu import pack as cpu_pack
from inference.backends.cpu.pack_kernels import TYPE_CODES
from inference.formats.quants import BLOCK_TYPES
from tests.bundled import random_tensor

ROWS, K = 70, 512  # a partial last tile; two super-blocks a row


def _same(a: cpu_pack.PackedWeight, b: cpu_pack.PackedWeight) -> None:
    assert (a.bits, a.zero, a.kind, a.shape, a.data.shape) == (
        b.bits, b.zero, b.kind, b.shape, b.data.shape)
    assert a.data.tobytes() == b.data.tobytes()


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


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q8_0"])
def test_store_takes_as_many_bytes_a_weight_as_the_file(
        qtype: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within 3% (Q4_K 1.028x, Q5_K 1.023x: the super rows of float16 d, dmin; the others
    1.0x), in memory and in the store on disk; a block with a float32 row of scales was
    1.06-1.11x."""
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "weights"))
    monkeypatch.setattr(cpu_pack, "MIN_STORE_BYTES", 1)
    monkeypatch.setattr(cpu_pack, "FREE_MARGIN", 0)
    t = random_tensor(qtype, 4 * cpu_pack.LANES, 2048, seed=3)  # whole tiles: no padding
    file_bytes = t.shape[0] * BLOCK_TYPES[qtype].row_bytes(t.shape[1])
    with cpu_pack.pack_store("m.gguf|1|2|x"):
        w = cpu_pack.pack(t)
    assert isinstance(w, cpu_pack.PackedWeight)
    assert w.nbytes == cpu_pack.packed_nbytes(t)
    assert file_bytes <= w.nbytes <= 1.03 * file_bytes
    (folder,) = (tmp_path / "weights" / "packed").iterdir()
    assert (folder / "packed.bin").stat().st_size == w.nbytes
