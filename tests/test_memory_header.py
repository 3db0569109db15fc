"""What a load leaves resident and when: a loaded GGUF model leaves no parsed header (its
vocabulary as Python strings) in the reader's cache, the header is read again when asked
for; the tokenizer is built before the packed weights are mapped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inference import api
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


def test_tokenizer_is_built_once_before_the_weights_are_mapped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its build's temporaries are returned before the packed store is resident, so they do
    not add to the load's peak; the model keeps that one tokenizer."""
    calls: list[str] = []
    read, store = api.read_tokenizer, api._weight_store

    def read_spy(ckpt: Any) -> Any:
        calls.append("tokenizer")
        return read(ckpt)

    def store_spy(*a: Any) -> Any:
        calls.append("weights")
        return store(*a)

    monkeypatch.setattr(api, "read_tokenizer", read_spy)
    monkeypatch.setattr(api, "_weight_store", store_spy)
    model = load_model(bundled("SmolLM2"), backend="cpu")
    assert calls == ["tokenizer", "weights"]
    assert model.tokenizer.encode("hello world")
