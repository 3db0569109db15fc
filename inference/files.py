"""Writing a file whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


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
