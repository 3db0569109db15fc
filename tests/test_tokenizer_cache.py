"""A GGUF tokenizer kept in the weight cache: a later load of the same file reads it back
instead of building it, tokenizes alike, and any other file or a damaged entry builds anew."""

from __future__ import annotations

from collections import UserList
from pathlib import Path

import pytest

from inference.formats import read_checkpoint
from inference.formats.cache import load_pickle, save_pickle
from inference.store import resolve
from inference.tokenizer import Tokenizer, core, gguf_vocab
from inference.tokenizer import kept as kept_form
from inference.tokenizer.gguf_meta import read_metadata

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


def _rebuilds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the builds from the file's metadata from now on."""
    calls: list[int] = []
    build = gguf_vocab.build_from_gguf

    def counted(md):
        calls.append(1)
        return build(md)

    monkeypatch.setattr(gguf_vocab, "build_from_gguf", counted)
    return calls


def test_the_kept_form_is_read_without_a_tokenizer_json(ckpt, monkeypatch):
    built = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    builds = _rebuilds(monkeypatch)

    class NoJson:
        @staticmethod
        def from_str(text):
            raise AssertionError("read back from its JSON")

    monkeypatch.setattr(core, "HFTokenizer", NoJson)
    kept = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    assert not builds
    assert kept.backend.to_str() == built.backend.to_str()  # model, parts and added tokens
    assert kept.max_id == built.max_id == Tokenizer.from_gguf_metadata(ckpt.metadata).max_id
    _same(kept, built)


@pytest.mark.parametrize("damage", ["merges cut short", "an added token's id", "unknown form",
                                    "a part's state", "not a dict"])
def test_a_kept_form_that_does_not_rebuild_as_kept_builds_anew(ckpt, tmp_path, monkeypatch,
                                                               damage):
    built = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    (entry,) = (tmp_path / "cache" / "tokenizer").iterdir()
    whole = load_pickle(entry)
    form = whole["tokenizer"]
    if damage == "merges cut short":
        form["merges"] = form["merges"][:-4]
    elif damage == "an added token's id":
        form["added"][0] = (form["added"][0][0] + 1, form["added"][0][1])
    elif damage == "unknown form":
        form["form"] = kept_form.FORM + 1
    elif damage == "a part's state":
        form["parts"]["decoder"] = b"not a pickle"
    else:
        whole["tokenizer"] = ["not", "a", "dict"]
    save_pickle(entry, whole)
    builds = _rebuilds(monkeypatch)
    again = Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    assert builds == [1]
    _same(again, built)
    assert again.backend.to_str() == built.backend.to_str()


def test_merges_split_at_once_or_one_by_one_alike():
    merges = ["a b", "ab c", "Ġ t", "Ġt he"]
    assert gguf_vocab._merge_pairs(merges) == [("a", "b"), ("ab", "c"), ("Ġ", "t"), ("Ġt", "he")]
    odd = ["a b c", "d e"]  # a space inside a piece: split at the first, as before
    assert gguf_vocab._merge_pairs(odd) == [("a", "b c"), ("d", "e")]
    assert gguf_vocab._merge_pairs(["ab", "c d e"]) == [("ab",), ("c", "d e")]


def test_metadata_lists_made_plain_at_once_or_one_by_one_alike():
    bad = "ok\udcff"  # invalid UTF-8 kept by a reader as a surrogate escape
    assert core._plain(["a", "b"]) == ["a", "b"]
    assert core._plain(["a", bad]) == ["a", "ok\ufffd"]
    assert core._plain([1, 2.5, True]) == [1, 2.5, True]
    assert core._plain([b"x", "y"]) == ["x", "y"]
    lazy = UserList(["a", bad])  # a reader's sequence that is not a list
    assert core._plain(lazy) == ["a", "ok\ufffd"] and type(core._plain(lazy)) is list


GOLDENS = Path(__file__).resolve().parent / "goldens"


@pytest.mark.parametrize("name", ["families/phi3/tokenizer.gguf",  # SentencePiece BPE
                                  "embedders/bert_bge.gguf"])  # WordPiece
def test_other_kinds_read_back_from_their_kept_form(name, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(core, "MIN_CACHED_TOKENS", 0)  # these vocabularies are cut short
    md = read_metadata(GOLDENS / name)
    built = Tokenizer.from_gguf_metadata(md, f"test|{name}")
    builds = _rebuilds(monkeypatch)
    kept = Tokenizer.from_gguf_metadata(md, f"test|{name}")
    assert not builds
    assert kept.backend.to_str() == built.backend.to_str()
    _same(kept, built)


def test_the_kept_form_holds_the_models_own_inputs(ckpt, tmp_path):
    """The kept BPE model is the dict and the merge tuples its constructor takes, each
    merge's pieces the vocabulary's own strings (kept once in the pickle): restoring it
    rebuilds nothing in Python first."""
    Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    (entry,) = (tmp_path / "cache" / "tokenizer").iterdir()
    form = load_pickle(entry)["tokenizer"]
    vocab, merges = form["vocab"], form["merges"]
    assert isinstance(vocab, dict) and isinstance(merges, list)
    assert (form["n_vocab"], form["n_merges"]) == (len(vocab), len(merges))
    assert len(merges) == len(ckpt.metadata["tokenizer.ggml.merges"])
    keys = {id(k) for k in vocab}
    assert all(id(a) in keys and id(b) in keys for a, b in merges[:1000])
