"""Reading a file whole into the process's memory (inference.files.read_whole), and how
much memory the machine has for it (backends.base.host_memory)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from inference import files


@pytest.mark.parametrize("threads", [1, 3])
def test_read_whole_returns_every_byte_in_parts(tmp_path: Path, threads: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "READ_PART", 4096)  # many parts, and a short last one
    data = np.random.default_rng(0).integers(0, 256, 10 * 4096 + 123, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    got = files.read_whole(path, threads=threads)
    assert got.dtype == np.uint8 and got.flags.writeable
    np.testing.assert_array_equal(got, data)


def test_read_whole_of_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    assert files.read_whole(tmp_path / "empty").nbytes == 0


def test_a_file_that_ends_early_is_an_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that returns nothing before the size fstat gave (the file shrank) raises
    OSError rather than returning zeros."""
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\1" * 8192)
    monkeypatch.setattr(files, "READ_PART", 4096)
    real = os.preadv if hasattr(os, "preadv") else None

    def shrunk(fd: int, buffers: list, offset: int) -> int:
        return 0 if offset >= 4096 else real(fd, buffers, offset)

    if real is None:
        pytest.skip("no os.preadv here")
    monkeypatch.setattr(os, "preadv", shrunk)
    with pytest.raises(OSError, match="ended at byte 4096 of 8192"):
        files.read_whole(path, threads=2)


def test_host_memory_agrees_with_psutil() -> None:
    """/proc/meminfo's figures are psutil's on Linux (it reads the same file); available
    memory moves between the two reads, so within 256 MiB."""
    import psutil

    from inference.backends.base import host_memory

    total, available = host_memory()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert abs(available - vm.available) < 256 << 20


def test_the_largest_cache_is_read_from_sysfs() -> None:
    from inference.backends.cpu.features import last_level_cache

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [p.read_text().strip() for p in
             Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size")]
    want = max((int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t) for t in sizes),
               default=0)
    assert last_level_cache() == want
