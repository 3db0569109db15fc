"""Weights a decode streams every token are mapped in 2 MiB pages where Linux can
(``madvise(MADV_HUGEPAGE)``): a store of packed weights as it is opened, and the weights kept
as file bytes at the backend's prepare(), except an embedding table the model only looks
rows up in. What is checked is the advice the kernel recorded for each mapping (smaps'
``VmFlags: ... hg``), not a speed."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from inference.backends.base import huge_pages
from inference.backends.cpu.backend import CpuBackend
from inference.backends.cpu.pack import PackStore, RawWeight

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


def test_an_opened_store_is_advised_whole(tmp_path: Path) -> None:
    n = 4 * MIB
    (tmp_path / "packed.bin").write_bytes(b"\1" * n)
    (tmp_path / "index.json").write_text(f'{{"__bytes__": {n}}}')
    store = PackStore(tmp_path)
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
