"""A GGUF header's string arrays (the vocabulary's tokens and merges) are kept as the
file's bytes and decoded at their first read: reading a header or describing a model
decodes none of them, the header pickles as bytes, and what they decode to is, string for
string, gguf-py's own reading of the file."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from inference.formats import gguf_file
from inference.formats.gguf_reader import StringArray
from tests.bundled import smollm2_gguf

TOKENS, MERGES = "tokenizer.ggml.tokens", "tokenizer.ggml.merges"


def _undecoded(a: object) -> bool:
    return isinstance(a, StringArray) and a._items is None


def test_header_and_description_decode_no_vocabulary(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path))
    from inference.store import spec_for_path

    path = smollm2_gguf()
    gguf_file.forget_header(path)
    header, _ = gguf_file.read_header(path)
    spec = spec_for_path(path)
    tokens, merges = header.metadata[TOKENS], header.metadata[MERGES]
    assert spec.architecture and _undecoded(tokens) and _undecoded(merges)
    assert len(tokens) == 49152  # no decoding needed for the count
    kept = pickle.loads(pickle.dumps(header))  # the disk cache's copy: bytes, not strings
    assert _undecoded(kept.metadata[TOKENS])
    field = GGUFReader(path).fields[TOKENS]  # gguf-py's own reader: a part a string
    want = [bytes(field.parts[i]).decode("utf-8", "surrogateescape") for i in field.data]
    assert list(kept.metadata[TOKENS]) == want == list(tokens)
    assert tokens[1:3] == want[1:3] and tokens[-1] == want[-1] and want[7] in tokens


def test_odd_strings_and_empty_arrays(tmp_path: Path) -> None:
    """Empty strings, invalid UTF-8 (kept as surrogate escapes)."""
    path = tmp_path / "odd.gguf"
    w = GGUFWriter(path, "llama")
    odd = ["", "a", "caf\u00e9", "\u2581x", "z" * 300]
    w.add_array(TOKENS, odd + [b"\xff\xfe"])  # type: ignore[list-item]
    w.add_tensor("w", np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    header, _ = gguf_file.read_header(path)
    tokens = header.metadata[TOKENS]
    assert len(tokens) == 6 and list(tokens)[:5] == odd
    assert tokens[5] == b"\xff\xfe".decode("utf-8", "surrogateescape")
