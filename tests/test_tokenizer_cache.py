"""A GGUF tokenizer kept in the weight cache: a later load of the same file reads it back
instead of building it, tokenizes alike, and any other file or a damaged entry builds anew."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.formats import read_checkpoint
from inference.formats.cache import load_pickle, save_pickle
from inference.store import resolve
from inference.tokenizer import Tokenizer, gguf_vocab

TEXT = "Hello, <|im_start|>user\nünïcode 123   spaces\n\n<|im_end|> end"


@pytest.fixture
def ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "cache"))
    return read_checkpoint(resolve("SmolLM2-135M-Instruct.Q4_1").path)


def _same(a: Tokenizer, b: Tokenizer) -> None:
    assert a.encode(TEXT) == b.encode(TEXT)
    assert a.decode(a.encode(TEXT)) == b.decode(b.encode(TEXT))
    assert (a.bos_id, a.eos_ids, a.kind, a.chat_template) == \
        (b.bos_id, b.eos_ids, b.kind, b.chat_template)


def test_second_load_reads_the_kept_tokenizer(ckpt, monkeypatch):
    built = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    fresh = Tokenizer.from_gguf_metadata(ckpt.metadata)  # no identity: nothing kept or read

    def no_build(md):
        raise AssertionError("built again")

    monkeypatch.setattr(gguf_vocab, "build_from_gguf", no_build)
    kept = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    _same(kept, built)
    _same(kept, fresh)
    with pytest.raises(AssertionError, match="built again"):  # another file's identity
        Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity + "|other")


def test_the_kept_tokenizer_knows_its_largest_id_without_the_vocabulary(ckpt, monkeypatch,
                                                                       tmp_path):
    fresh = Tokenizer.from_gguf_metadata(ckpt.metadata).max_id  # read from the vocabulary
    Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    (entry,) = (tmp_path / "cache" / "tokenizer").iterdir()
    kept = load_pickle(entry)
    del kept["max_id"]  # an entry written before max_id was kept: the next load adds it
    save_pickle(entry, kept)
    Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    kept = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)

    def no_vocab(*args, **kwargs):
        raise AssertionError("vocabulary read")

    monkeypatch.setattr(kept, "backend", type("B", (), {"get_vocab": no_vocab})())
    assert kept.max_id == fresh == len(ckpt.metadata["tokenizer.ggml.tokens"]) - 1


def test_a_damaged_entry_builds_anew(ckpt, tmp_path):
    built = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    (entry,) = (tmp_path / "cache" / "tokenizer").iterdir()
    entry.write_bytes(entry.read_bytes()[:100])  # cut short
    _same(Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity), built)
