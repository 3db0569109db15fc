"""Weights a decode streams every token are mapped in 2 MiB pages where Linux can
(``madvise(MADV_HUGEPAGE)``): a store of packed weights as it is opened, and the weights kept
as file bytes at the backend's prepare(), except an embedding table the model only looks
rows up in. What is checked is the advice the kernel recorded for each mapping (smaps'
``VmFlags: ... hg``), not a speed."""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from inference.backends.base import huge_pages, huge_share
from inference.backends.cpu import pack
from inference.backends.cpu.backend import CpuBackend
from inference.backends.cpu.pack import SMALL_PAGES, PackStore, RawWeight

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(
    not SMAPS.exists() or not Path("/sys/kernel/mm/transparent_hugepage").exists()
    or "VmFlags" not in SMAPS.read_text(), reason="Linux with transparent huge pages")

MIB = 1 << 20


def _advised(path: Path) -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of ``path`` that carry the huge-page advice."""
    spans, current = [], None
    for line in SMAPS.read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$", line)
        if head:
            current = (int(head[1], 16), int(head[2], 16)) if head[3] == str(path) else None
        elif current and line.startswith("VmFlags:") and " hg" in line:
            spans.append(current)
    return spans


def _covered(spans: list[tuple[int, int]], a: np.ndarray) -> bool:
    """Whether the whole pages inside ``a`` lie in the advised spans."""
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    return any(s <= -(-lo // 4096) * 4096 and (hi // 4096) * 4096 <= e for s, e in spans)


def _touches(spans: list[tuple[int, int]], a: np.ndarray) -> bool:
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    return any(s < hi and lo < e for s, e in spans)


def test_only_the_pages_inside_the_array_are_advised(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * (8 * MIB))
    m = np.memmap(path, mode="r")
    inner = m[MIB + 100: 5 * MIB - 100]  # not page-aligned at either end
    assert _advised(path.resolve()) == []
    assert huge_pages(inner)
    spans = _advised(path.resolve())
    assert spans == [(m.ctypes.data + MIB + 4096, m.ctypes.data + 5 * MIB - 4096)]
    assert not _touches(spans, m[:MIB + 100]) and not _touches(spans, m[5 * MIB - 100:])
    assert not huge_pages(m[:100])  # no whole page inside: nothing asked


def _store(folder: Path, n: int) -> PackStore:
    (folder / "packed.bin").write_bytes(b"\1" * n)
    (folder / "index.json").write_text(f'{{"__bytes__": {n}}}')
    return PackStore(folder)


def test_an_opened_store_is_advised_whole(tmp_path: Path) -> None:
    n = 4 * MIB
    store = _store(tmp_path, n)
    assert store.map is not None
    (span,) = _advised((tmp_path / "packed.bin").resolve())
    assert span[1] - span[0] == n


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_file_weights_are_advised_and_a_lookup_table_is_not(tmp_path: Path,
                                                                     tied: bool) -> None:
    """prepare()'s choice: a layer's weight and the output head stream every token; an
    embedding table that is not also the head is read a row a token and keeps 4 KiB pages
    (its resident memory would grow by 2 MiB for each row a prompt looks up)."""
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * (12 * MIB))
    rows = np.memmap(path, dtype=np.float16, mode="r").reshape(-1, 2048)  # 4 KiB rows

    def raw(first: int, n: int) -> RawWeight:
        return RawWeight(rows[first:first + n], "F16", (n, 2048))

    table, layer = raw(0, 1024), raw(1024, 1024)
    head = table if tied else raw(2048, 1024)
    B = CpuBackend()
    B._raw_weights = [table, layer] + ([] if tied else [head])
    B._stream_in_huge_pages(SimpleNamespace(embed_tokens=table, lm_head=head))
    spans = _advised(path.resolve())
    assert _covered(spans, layer.raw) and _covered(spans, head.raw)
    assert tied == _touches(spans, table.raw)
    assert B._raw_weights == []  # each load's weights once


def test_huge_share_reads_the_mappings_that_hold_the_array(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\1" * (4 * MIB))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    a = np.frombuffer(m, np.uint8)
    assert huge_share(a) is None  # nothing resident yet
    assert int(a.sum()) == 4 * MIB
    share = huge_share(a)
    assert share is not None and 0.0 <= share <= 1.0
    del a
    m.close()


@pytest.fixture
def drops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The page-cache drops a store asks for (posix_fadvise), passed on to the OS."""
    seen: list[int] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        seen.append(advice)
        real(fd, offset, length, advice)
    monkeypatch.setattr(os, "posix_fadvise", spy)
    monkeypatch.setattr(pack, "REREAD_MIN_BYTES", MIB)
    monkeypatch.setattr(pack, "_huge_pages_on", lambda: True)
    return seen


def _shares(monkeypatch: pytest.MonkeyPatch, *values: float) -> list[float]:
    """huge_share() answers ``values`` in turn; returns what is left of them."""
    left = list(values)
    monkeypatch.setattr(pack, "huge_share", lambda a: left.pop(0))
    return left


def test_a_store_mostly_in_small_pages_is_read_again(tmp_path: Path, drops: list[int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    left = _shares(monkeypatch, 0.1, 0.95)
    store = _store(tmp_path, 4 * MIB)
    store.populate()
    assert drops == [os.POSIX_FADV_DONTNEED] and left == []
    assert store.map is not None and store.map[0] == store.map[4 * MIB - 1] == 1
    assert not (tmp_path / SMALL_PAGES).exists()


def test_a_store_read_again_in_vain_is_marked_and_left_alone_after(
        tmp_path: Path, drops: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    _shares(monkeypatch, 0.1, 0.15)
    _store(tmp_path, 4 * MIB).populate()
    assert drops == [os.POSIX_FADV_DONTNEED] and (tmp_path / SMALL_PAGES).exists()
    left = _shares(monkeypatch, 0.1)
    PackStore(tmp_path).populate()
    assert drops == [os.POSIX_FADV_DONTNEED] and left == [0.1]  # not even looked at


@pytest.mark.parametrize(("size", "share", "looked"),
                         [(4 * MIB, 0.9, True), (MIB // 2, 0.1, False)])
def test_a_store_in_2_mib_pages_or_a_small_one_is_not_read_again(
        tmp_path: Path, drops: list[int], monkeypatch: pytest.MonkeyPatch, size: int,
        share: float, looked: bool) -> None:
    left = _shares(monkeypatch, share)
    _store(tmp_path, size).populate()
    assert drops == [] and (left == []) == looked


def test_a_store_written_in_4_kib_pieces_is_read_again_through_the_os(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real path, no stand-ins: a store whose page cache holds 4 KiB folios (written
    4 KiB at a time) is dropped and read in again, its bytes intact. Whether the OS then
    gives 2 MiB pages is its own (a filesystem without large folios gives none): the store
    ends mostly in 2 MiB pages, or is marked so that no later load tries again."""
    monkeypatch.setattr(pack, "REREAD_MIN_BYTES", MIB)
    n = 8 * MIB
    with open(tmp_path / "packed.bin", "wb") as f:
        for _ in range(n // 4096):
            f.write(b"\1" * 4096)
    (tmp_path / "index.json").write_text(f'{{"__bytes__": {n}}}')
    store = PackStore(tmp_path)
    store.populate()
    assert store.map is not None
    whole = np.frombuffer(store.map, np.uint8)
    assert int(whole.sum()) == n
    share = huge_share(whole)
    assert (share is not None and share >= pack.REREAD_BELOW) or (
        tmp_path / SMALL_PAGES).exists() or not pack._huge_pages_on()
