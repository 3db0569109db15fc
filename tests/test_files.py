"""Reading a file whole into the process's memory (inference.files.read_whole)."""

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
