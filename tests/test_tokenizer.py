"""Tokenizer parity: our ids equal the reference tokenizers' ids on the golden corpus.

Goldens come from scripts/make_tokenizer_goldens.py (transformers, sentencepiece); this file
needs neither. SmolLM2 and MiniLM are the bundled models; the SentencePiece vocabulary is a
small model trained by that script and stored in the golden.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from inference.tokenizer import Tokenizer
from tests.bundled import minilm_dir, smollm2_gguf

GOLDENS = Path(__file__).parent / "goldens"


def _golden(name: str) -> dict:
    return json.loads((GOLDENS / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def smol_md() -> dict:
    # The engine's reader, as load_model uses it (numpy arrays for numeric lists).
    from inference.formats.gguf_file import read_gguf

    return read_gguf(smollm2_gguf()).metadata


@pytest.fixture(scope="module")
def smol(smol_md) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smol_md)


@pytest.fixture(scope="module")
def minilm() -> Tokenizer:
    return Tokenizer.from_dir(minilm_dir())


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_golden("spm")["metadata"])


def _mismatches(tok: Tokenizer, cases: list[dict], key: str, special: bool) -> list[str]:
    bad = []
    for c in cases:
        got = tok.encode(c["text"], add_special_tokens=special)
        if key in c and got != c[key]:
            bad.append(f"{c['text'][:40]!r}: got {got[:12]} want {c[key][:12]}")
    return bad


# -- ids ------------------------------------------------------------------------------------

def test_smollm2_ids_equal_transformers(smol):
    cases = _golden("smollm2")["cases"]
    assert len(cases) >= 50
    assert _mismatches(smol, cases, "ids", special=False) == []
    assert _mismatches(smol, cases, "ids_special", special=True) == []


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_pre_tokenizer_regexes_equal_transformers(smol_md, pre):
    g = _golden("pre_variants")
    tok = Tokenizer.from_gguf_metadata({**smol_md, "tokenizer.ggml.pre": pre})
    bad = [t for t, ids in zip(g["texts"], g["ids"][pre], strict=True)
           if tok.encode(t, add_special_tokens=False) != ids]
    assert bad == []


def test_minilm_ids_equal_transformers(minilm):
    cases = _golden("minilm")["cases"]
    assert _mismatches(minilm, cases, "ids_special", special=True) == []
    assert _mismatches(minilm, cases, "ids", special=False) == []


def test_spm_ids_equal_sentencepiece(spm):
    cases = _golden("spm")["cases"]
    assert sum("ids_sentencepiece" in c for c in cases) >= 40
    assert _mismatches(spm, cases, "ids_sentencepiece", special=False) == []


def test_spm_special_tokens_equal_transformers(spm):
    # sentencepiece parses no special tokens in text; transformers' GGUF conversion does.
    cases = [c for c in _golden("spm")["cases"] if "ids_sentencepiece" not in c]
    assert cases
    assert _mismatches(spm, cases, "ids", special=False) == []
    assert _mismatches(spm, cases, "ids_special", special=True) == []


def test_spm_differs_from_transformers_only_where_it_drops_the_dummy_prefix(spm):
    # transformers' Metaspace adds no "\u2581" before text that already starts with a space;
    # SentencePiece and llama.cpp do. We follow SentencePiece, so only those texts differ.
    cases = _golden("spm")["cases"]
    differ = [c["text"] for c in cases
              if spm.encode(c["text"], add_special_tokens=False) != c["ids"]]
    assert all(t[:1].isspace() for t in differ), differ


def test_spm_gguf_file_round_trip(spm, tmp_path):
    gguf = pytest.importorskip("gguf")
    md = _golden("spm")["metadata"]
    w = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama")
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_scores(md["tokenizer.ggml.scores"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = Tokenizer.from_gguf(tmp_path / "tiny.gguf")
    for c in _golden("spm")["cases"]:
        assert tok.encode(c["text"]) == spm.encode(c["text"])
    assert tok.encode("hi")[0] == 1  # llama vocabularies add BOS unless the file says not to


# -- special tokens and facts ---------------------------------------------------------------

def test_special_tokens_are_single_ids(smol):
    assert smol.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert smol.encode("<|im_end|>", add_special_tokens=False) == [2]
    plain = smol.encode("<|im_start|>user", add_special_tokens=False, parse_special=False)
    assert 1 not in plain and smol.decode(plain) == "<|im_start|>user"


def test_smollm2_facts(smol):
    assert smol.vocab_size == 49152
    assert smol.bos_id == 1 and smol.eos_id == 2 and smol.bos_token == "<|im_start|>"
    assert smol.eos_ids == {0, 2}  # <|im_end|> ends a turn, <|endoftext|> a document
    assert smol.encode("Hi") == smol.encode("Hi", add_special_tokens=False)  # add_bos is off
    assert smol.chat_template == _golden("smollm2")["chat_model_template"]


def test_minilm_no_truncation_or_padding(minilm):
    # tokenizer.json asks for max_length 128 and fixed padding; callers truncate themselves.
    long = minilm.encode("word " * 300)
    assert len(long) == 302 and long[0] == 101 and long[-1] == 102
    assert minilm.encode("hi") == [101, 7632, 102]
    assert minilm.pad_id == 0 and minilm.eos_ids == set()
    assert minilm.encode_batch(["hi", "word " * 3]) == [minilm.encode("hi"),
                                                        minilm.encode("word " * 3)]


def test_from_file_reads_config_and_generation_config(smol, tmp_path):
    smol.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|endoftext|>",
        "add_bos_token": True, "chat_template": [{"name": "default", "template": "{{ 1 }}"}]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.kind == "byte_level"
    assert tok.encode("Hi") == [1] + smol.encode("Hi", add_special_tokens=False)
    assert tok.eos_id == 0 and {0, 2, 7} <= tok.eos_ids
    assert tok.chat_template == "{{ 1 }}"


# -- decoding -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["smollm2", "minilm", "spm"])
def test_decode_and_stream_equal_reference(name, request):
    tok = request.getfixturevalue("smol" if name == "smollm2" else name)
    for c in _golden(name)["cases"]:
        for skip, key in ((False, "decoded"), (True, "decoded_skip")):
            assert tok.decode(c["ids"], skip_special_tokens=skip) == c[key]
            dec = tok.stream_decoder(skip_special_tokens=skip)
            deltas = [dec.add(i) for i in c["ids"]] + [dec.flush()]
            assert "".join(deltas) == c[key], c["text"][:40]
            if "\ufffd" not in c[key]:  # never half a character on the way
                assert not any("\ufffd" in d for d in deltas)


def test_stream_holds_split_bytes(smol):
    ids = smol.encode("🤖!", add_special_tokens=False)
    assert len(ids) > 2  # the emoji is split over byte-level tokens
    dec = smol.stream_decoder()
    deltas = [dec.add(i) for i in ids]
    assert deltas[:-2] == [""] * (len(ids) - 2) and deltas[-2:] == ["🤖", "!"]
    dec = smol.stream_decoder()
    dec.add(ids[0])
    assert dec.flush() == "\ufffd"  # cut off mid-character: said, not dropped


def test_stream_sentencepiece_spaces(spm):
    ids = spm.encode("Hello world, again")
    dec = spm.stream_decoder()
    deltas = [dec.add(i) for i in ids]
    assert "".join(deltas) == "Hello world, again"
    # ids: <s>, "▁", "H", ...: the dummy prefix space is dropped once, at the start.
    assert deltas[:3] == ["", "", "H"] and " " in "".join(deltas[3:])
    assert spm.decode(spm.encode("  two")[1:], skip_special_tokens=True) == "  two"


# -- bad input ------------------------------------------------------------------------------

def test_bad_metadata_raises_typed_errors(smol_md):
    with pytest.raises(UnsupportedModelError, match="no tokenizer"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"})
    with pytest.raises(UnsupportedModelError, match="'t5'"):
        Tokenizer.from_gguf_metadata({**smol_md, "tokenizer.ggml.model": "t5"})
    with pytest.raises(CorruptModelError, match="names no unknown token"):
        Tokenizer.from_gguf_metadata({**smol_md, "tokenizer.ggml.model": "bert",
                                      "tokenizer.ggml.unknown_token_id": None})
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'mystery'"):
        Tokenizer.from_gguf_metadata({**smol_md, "tokenizer.ggml.pre": "mystery"})
    with pytest.raises(CorruptModelError, match="token types"):
        Tokenizer.from_gguf_metadata({**smol_md, "tokenizer.ggml.token_type": [1, 1]})
    with pytest.raises(CorruptModelError, match="scores"):
        Tokenizer.from_gguf_metadata({**_golden("spm")["metadata"], "tokenizer.ggml.scores": []})


def test_invalid_utf8_token_is_replaced_not_fatal():
    md = dict(_golden("spm")["metadata"])
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[-1] = "bad\udcff"  # how a reader keeps invalid UTF-8 (surrogateescape)
    tok = Tokenizer.from_gguf_metadata({**md, "tokenizer.ggml.tokens": tokens})
    assert tok.id_to_token(len(tokens) - 1) == "bad\ufffd"


def test_bad_files_raise_typed_errors(tmp_path):
    with pytest.raises(ModelNotFoundError):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\xff")
    with pytest.raises(CorruptModelError):
        Tokenizer.from_gguf(tmp_path / "bad.gguf")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CorruptModelError):
        Tokenizer.from_dir(tmp_path)
