"""Writing a file whole or not at all; reading one whole into memory on a few threads."""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np

READ_PART = 64 << 20  # bytes a read call takes: large enough that a call's cost is nothing


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a temporary file in ``path``'s folder, sync it and rename it onto
    ``path``. If anything fails (a full disk, an exception in ``write``) any existing file
    at ``path`` is unchanged and no temporary file is left; the error propagates. The file
    keeps the permissions of the one it replaces, else gets those the umask gives a new
    file (not the temporary file's private 0600)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        old = target.stat().st_mode & 0o7777 if target.is_file() else None
        os.fchmod(fd, old if old is not None else 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def read_whole(path: str | Path, threads: int = 2) -> np.ndarray:
    """The file's bytes in a new uint8 array of this process's memory (:func:`anonymous`),
    read in :data:`READ_PART` parts by ``threads`` threads (``os.preadv`` releases the GIL,
    so a file in the page cache is copied at the cores' speed, not one core's; without it,
    Windows, by one thread in order). Raises OSError if the file cannot be read whole (a
    short read: it shrank)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        out = anonymous(size)
        view = memoryview(out)

        positioned = hasattr(os, "preadv")  # else one thread, seeking (Windows)

        def read_at(at: int, end: int) -> int:
            if positioned:
                return os.preadv(f.fileno(), [view[at:end]], at)
            f.seek(at)
            return f.readinto(view[at:end]) or 0

        def part(start: int) -> None:
            end, at = min(size, start + READ_PART), start
            while at < end:
                got = read_at(at, end)
                if got == 0:
                    raise OSError(f"{path} ended at byte {at} of {size}")
                at += got

        starts = range(0, size, READ_PART)
        if threads <= 1 or len(starts) <= 1 or not positioned:
            for s in starts:
                part(s)
        else:
            with ThreadPoolExecutor(min(threads, len(starts))) as pool:
                list(pool.map(part, starts))
    return out


def anonymous(size: int) -> np.ndarray:
    """``size`` bytes of private anonymous memory, pages as the system's huge-page policy
    gives them: not advised, as NumPy advises its large arrays. Advised, the first touches
    of a 2 GB array can wait on compaction (reading a store took up to 3.5 s against
    0.58-0.62 s), and a decode step over it was no faster (Llama 3.2 3B: 137-140 ms a step against
    139-145). Where mmap has no private anonymous maps (Windows), a NumPy array."""
    if size and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS"):
        return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                             dtype=np.uint8)
    return np.empty(size, dtype=np.uint8)
