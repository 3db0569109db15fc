"""Read a GGUF file's key/values (not its tensors) with the engine's GGUF reader.

The engine's own reader (inference.formats) hands the same dict as ``Checkpoint.metadata``;
this exists so the tokenizer can be built and tested from a path on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_metadata(path: str | Path) -> dict[str, Any]:
    """GGUF key/values under their original names (:class:`GGUFHeader`'s values: strings,
    Python scalars, lists of strings, read-only arrays); typed errors for bad files."""
    from inference.formats.gguf_file import read_header

    return dict(read_header(path)[0].metadata)
