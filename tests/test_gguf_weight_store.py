"""The cpu backend's store of packed weights: a model's second load reads the weights its
first load packed (into memory or mapped; same logits), a store cut short is written
anew, and the store's key follows the file (a changed file is not served another's
weights)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.api import load_model
from inference.backends.cpu.pack import PackedWeight, PackStore
from inference.formats.gguf_file import read_gguf
from tests.bundled import bundled
from tests.test_formats_gguf import write_decoder

IDS = [1, 504, 3458, 282, 4649, 314, 7042, 30]


def _mapped(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a map: the store's file, or its bytes read into memory."""
    base: Any = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else base.base
    return base is not None


def _load(path: Path) -> tuple[Any, np.ndarray]:
    m = load_model(path, backend="cpu")
    # One thread, pinned: on a busy machine the backend may pick another count for each load,
    # and a prefill's products are not bitwise the same across thread counts.
    m.backend.set_threads(1)
    return m, m.logits(IDS)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "weights"))
    return tmp_path / "weights"


@pytest.mark.parametrize("place", ["memory", "mapped"])
def test_second_load_reads_the_packed_weights(store: Path, place: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", place)
    path = bundled("SmolLM2")
    first, want = _load(path)
    assert not any(_mapped(w.blocks) for w in vars(first.model.layers[0].mlp).values()
                   if isinstance(w, PackedWeight))
    del first
    (folder,) = (store / "packed").iterdir()
    packed = folder / "packed.bin"
    size = packed.stat().st_size
    assert size > 32 << 20
    second, got = _load(path)
    mapped = [w for w in vars(second.model.layers[0].mlp).values() if isinstance(w, PackedWeight)]
    assert mapped and all(_mapped(w.blocks) for w in mapped)
    if Path("/proc/self/smaps").exists():  # the file itself is mapped only when asked to be
        assert (_resident_kb(packed.resolve()) > 0) == (place == "mapped")
    # Same blocks, same kernels, same thread count in one process: the same logits.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    del second

    with open(packed, "r+b") as f:  # a store cut short is packed and written again
        f.truncate(size // 2)
    _, got = _load(path)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert PackStore(folder).map is not None  # whole again, and read as such


def test_identity_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_decoder(path, seed=0)
    a = read_gguf(path).identity
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    b = read_gguf(path).identity
    assert a and b and a != b and str(path.resolve()) in a


def _resident_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = head[-1] == str(path)
        elif inside and head[:1] == ["Rss:"]:
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's smaps")
def test_a_mapped_store_is_mapped_in_whole_when_populated_not_when_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a store maps none of its pages (a load's kernels load first, so its peak
    does not hold both); populate() maps them all (madvise POPULATE_READ), so the first
    prefill does not fault them in one by one; still shared with the file, not copied."""
    if tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit()) < (5, 14):
        pytest.skip("MADV_POPULATE_READ is Linux 5.14+")
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", "mapped")
    n = 4 << 20
    (tmp_path / "packed.bin").write_bytes(b"\1" * n)
    (tmp_path / "index.json").write_text(f'{{"__bytes__": {n}}}')
    s = PackStore(tmp_path)
    assert s.map is not None
    assert _resident_kb((tmp_path / "packed.bin").resolve()) == 0
    s.populate()
    assert s.map[n - 1] == 1
    assert _resident_kb((tmp_path / "packed.bin").resolve()) == n >> 10


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's smaps")
def test_a_store_read_into_memory_maps_nothing_of_its_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In memory, populate() reads the store into the process's own pages and lets the map
    go: none of the file's pages are mapped in, before or after."""
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", "memory")
    n = 4 << 20
    data = np.arange(n, dtype=np.uint32).astype(np.uint8)
    (tmp_path / "packed.bin").write_bytes(data.tobytes())
    (tmp_path / "index.json").write_text(f'{{"__bytes__": {n}}}')
    s = PackStore(tmp_path)
    assert isinstance(s.map, mmap.mmap) and s.in_memory
    s.populate()
    assert isinstance(s.map, np.ndarray)
    np.testing.assert_array_equal(s.map, data)
    assert _resident_kb((tmp_path / "packed.bin").resolve()) == 0


def test_where_a_store_lives_follows_the_setting_and_the_free_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from inference.backends.cpu import pack
    from inference.errors import InvalidInputError

    monkeypatch.setattr(pack, "host_memory", lambda: (16 << 30, 8 << 30))  # total, available
    monkeypatch.setattr(pack, "last_level_cache", lambda: 64 << 20)
    monkeypatch.delenv("INFERDESK_CPU_WEIGHTS", raising=False)
    # Unset: memory while the machine keeps max(2 GiB, a tenth of its RAM) available besides,
    # for weights larger than the CPU's largest cache.
    assert pack.in_memory(5 << 30)
    assert not pack.in_memory(7 << 30)
    assert not pack.in_memory(64 << 20)
    assert pack.in_memory((64 << 20) + 1)
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", "mapped")
    assert not pack.in_memory(1 << 20)
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", " Memory ")
    assert pack.in_memory(64 << 30)  # as asked, even past the free memory
    assert pack.in_memory(1 << 20)  # and within the cache
    monkeypatch.setenv("INFERDESK_CPU_WEIGHTS", "ram")
    with pytest.raises(InvalidInputError, match="INFERDESK_CPU_WEIGHTS must be one of"):
        pack.in_memory(1)
