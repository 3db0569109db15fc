"""Where data derived from a model file is kept between processes (parsed GGUF headers,
the cpu backend's packed weights), beside the kernel cache.

The root is ``INFERDESK_WEIGHT_CACHE`` ("0" or empty: nothing is kept), else a folder
``inferdesk-weights`` in ``NUMBA_CACHE_DIR`` when that is set (so an empty kernel cache
comes with an empty weight cache), else ``~/.cache/inferdesk/weights``. Every entry is
keyed by what identifies the file it came from, and a reader checks it before use."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

MIN_HEADER_BYTES = 1 << 20  # smaller headers parse in milliseconds: not worth a file


def cache_root() -> Path | None:
    env = os.environ.get("INFERDESK_WEIGHT_CACHE")
    if env is not None:
        return None if env in ("", "0") else Path(env)
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir:
        return Path(numba_dir) / "inferdesk-weights"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inferdesk" / "weights"


def key_path(kind: str, key: str, suffix: str = "") -> Path | None:
    """``<root>/<kind>/<hash of key><suffix>``, or None without a root."""
    root = cache_root()
    if root is None:
        return None
    return root / kind / (hashlib.blake2b(key.encode(), digest_size=16).hexdigest() + suffix)


def load_pickle(path: Path | None) -> Any:
    """What :func:`save_pickle` wrote at ``path``, or None (absent, unreadable, cut short)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError,
            IndexError, TypeError, ValueError):
        return None


def save_pickle(path: Path | None, value: Any) -> None:
    """``value`` at ``path``, whole or not at all (a temporary file renamed in); a cache
    that cannot be written is skipped silently."""
    if path is None:
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".writing-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
