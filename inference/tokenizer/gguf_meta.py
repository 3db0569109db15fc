"""Read a GGUF file's key/values (not its tensors) with the ``gguf`` package's reader.

The engine's own reader (inference.formats) hands the same dict as ``Checkpoint.metadata``;
this exists so the tokenizer can be built and tested from a path on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inference.errors import CorruptModelError, ModelNotFoundError


def read_metadata(path: str | Path) -> dict[str, Any]:
    """GGUF key/values under their original names, as plain Python values."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such file.")
    try:
        reader = GGUFReader(str(path), "r")
        return {name: field.contents() for name, field in reader.fields.items()
                if not name.startswith("GGUF.")}
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError) as e:
        raise CorruptModelError(f"{path}: not a readable GGUF file ({e}).") from e
