"""A loaded GGUF model leaves no parsed header (its vocabulary as Python strings) in the
reader's cache; the header is read again when asked for."""

from __future__ import annotations

from pathlib import Path

from inference.api import load_model
from inference.formats.gguf_file import _HEADERS, read_gguf
from tests.bundled import bundled

TOKENS = "tokenizer.ggml.tokens"


def _cached(path: Path) -> bool:
    return str(path.resolve()) in _HEADERS._entries


def test_load_leaves_no_header_in_the_cache() -> None:
    path = bundled("SmolLM2")
    vocab = list(read_gguf(path).metadata[TOKENS])
    assert _cached(path)  # a plain read keeps it (the reader's cache serves the next read)
    model = load_model(path, backend="cpu")
    assert not _cached(path)
    assert list(read_gguf(path).metadata[TOKENS]) == vocab  # read again, from the disk cache
    ids = model.tokenizer.encode("hello world")
    assert ids and model.tokenizer.decode(ids).strip() == "hello world"
