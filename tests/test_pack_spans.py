"""A first load packs each tensor's spans of rows on every core and streams the packed
weights to the store as it goes: the blocks must be, byte for byte, those one ``_pack`` over
the whole tensor makes (every packed type, MLX's per-row scales, stacked tensors whose parts
meet inside a span), and the streamed store the one written from memory at the load's end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.backends.cpu import pack as cpu_pack
from inference.formats.tensor import TensorData
from tests.bundled import random_tensor

ROWS, K = 200, 256  # six whole tiles of 32 rows and a partial one
TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")


@pytest.fixture(autouse=True)
def small_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of two tiles (64 rows), shared by two threads whatever the cores."""
    monkeypatch.setattr(cpu_pack, "SPAN_WEIGHTS", 2 * cpu_pack.LANES * K)
    monkeypatch.setattr(cpu_pack, "pack_workers", lambda: 2)
    monkeypatch.setattr(cpu_pack, "SHARED_MIN_WEIGHTS", 0)


def _same(t: TensorData) -> None:
    bits = cpu_pack.packed_bits(t)
    assert bits is not None
    whole, shared = cpu_pack._pack(t, bits), cpu_pack._pack_shared(t, bits)
    assert (shared.bits, shared.zero, shared.kind, shared.shape) == (
        whole.bits, whole.zero, whole.kind, whole.shape)
    assert shared.data.shape == whole.data.shape
    assert shared.data.tobytes() == whole.data.tobytes()


@pytest.mark.parametrize("qtype", TYPES)
def test_spans_pack_the_bytes_of_one_pack(qtype: str) -> None:
    _same(random_tensor(qtype, ROWS, K, seed=3))


def test_mlx_scales_and_biases_are_cut_with_their_rows() -> None:
    r = np.random.default_rng(4)
    data = r.integers(0, 2**32, (ROWS, K // 8), dtype=np.uint32)
    extra = {"scales": r.standard_normal((ROWS, K // 64)).astype(np.float16),
             "biases": r.standard_normal((ROWS, K // 64)).astype(np.float16),
             "group_size": 64, "bits": 4}
    _same(TensorData("w", (ROWS, K), "MLX", data, extra))


def test_stacked_parts_meeting_inside_a_span() -> None:
    parts = [random_tensor("Q4_K", n, K, seed=n) for n in (100, 36, 64)]
    t = TensorData.stacked("a+b+c", parts, {})
    bits = cpu_pack.packed_bits(t)
    assert bits is not None
    shared = cpu_pack._pack_shared(t, bits)  # before t.data exists: from the parts
    assert t._data is None  # type: ignore[attr-defined]
    assert shared.data.tobytes() == cpu_pack._pack(t, bits).data.tobytes()


def _pack_all(fail: bool = False) -> list[cpu_pack.PackedWeight | cpu_pack.RawWeight]:
    out = []
    with cpu_pack.pack_store("m.gguf|1|2|x"):
        for seed, qtype in enumerate(TYPES):
            out.append(cpu_pack.pack(_named(random_tensor(qtype, ROWS, K, seed), seed)))
            if fail and seed == 3:
                raise KeyboardInterrupt
    return out


def _named(t: TensorData, i: int) -> TensorData:
    return TensorData(f"w{i}", t.shape, t.qtype, t.data, t.extra)


def test_streamed_store_is_the_store_written_from_memory(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "weights"))
    monkeypatch.setattr(cpu_pack, "MIN_STORE_BYTES", 1)
    monkeypatch.setattr(cpu_pack, "FREE_MARGIN", 0)
    packed = tmp_path / "weights" / "packed"
    with pytest.raises(KeyboardInterrupt):  # a load that stops leaves nothing behind
        _pack_all(fail=True)
    assert not packed.exists() or not any(packed.iterdir())

    made = _pack_all()
    (folder,) = packed.iterdir()
    streamed = (folder / "packed.bin").read_bytes()
    index = (folder / "index.json").read_text()
    store = cpu_pack.PackStore(tmp_path / "from-memory")
    store.new = [(f"w{i}", store._key(_named(random_tensor(q, ROWS, K, i), i), w.bits), w)
                 for i, (q, w) in enumerate(zip(TYPES, made, strict=True))]
    store.write()
    assert streamed == (tmp_path / "from-memory" / "packed.bin").read_bytes()
    assert index.split('"w0"', 1)[1] == (
        tmp_path / "from-memory" / "index.json").read_text().split('"w0"', 1)[1]
    again = cpu_pack.PackStore(folder)  # read back: the weights this load packed
    for i, (q, w) in enumerate(zip(TYPES, made, strict=True)):
        got = again.get(_named(random_tensor(q, ROWS, K, i), i))
        assert got is not None and got.data.tobytes() == w.data.tobytes()
