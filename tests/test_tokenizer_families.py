"""Gemma-, Llama 3-, Qwen 3- and Phi-3-shaped tokenizers, from GGUF and from a Hugging Face
directory, give transformers' ids, text and chat prompts; their end-of-turn tokens stop
generation.

The fixtures and goldens come from scripts/make_family_tokenizer_goldens.py (transformers,
sentencepiece); this file needs neither.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from inference.chat_template import ChatTemplate
from inference.errors import InvalidInputError
from inference.tokenizer import Tokenizer
from inference.tokenizer.bounded import encode_segments
from inference.tokenizer.gguf_meta import read_metadata

FAMILIES = Path(__file__).parent / "goldens" / "families"
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
GOLDEN = json.loads((FAMILIES / "goldens.json").read_text(encoding="utf-8"))
SOURCES = [(f, s) for f in ("gemma", "llama3", "qwen3", "phi3") for s in ("gguf", "dir")]


def _load(family: str, source: str) -> Tokenizer:
    if source == "gguf":
        return Tokenizer.from_gguf(FAMILIES / family / "tokenizer.gguf")
    return Tokenizer.from_dir(FAMILIES / family / "hf")


@pytest.fixture(scope="module")
def tokenizers() -> dict[tuple[str, str], Tokenizer]:
    return {key: _load(*key) for key in SOURCES}


# -- ids and text -----------------------------------------------------------------------------

@pytest.mark.parametrize("family,source", SOURCES)
def test_ids_equal_transformers(tokenizers, family, source):
    tok = tokenizers[family, source]
    cases = GOLDEN[family][source]["cases"]
    assert len(cases) >= 50
    bad = [c["text"][:40] for c in cases
           if tok.encode(c["text"], add_special_tokens=False) != c["ids"]
           or tok.encode(c["text"]) != c["ids_special"]]
    assert bad == []


def test_gemma_ids_equal_sentencepiece(tokenizers):
    # The GGUF spells runs of spaces with real spaces and has all-zero scores, as Gemma's do.
    for source in ("gguf", "dir"):
        cases = [c for c in GOLDEN["gemma"][source]["cases"] if "ids_sentencepiece" in c]
        assert len(cases) >= 40
        tok = tokenizers["gemma", source]
        assert [c["text"][:40] for c in cases
                if tok.encode(c["text"], add_special_tokens=False) != c["ids_sentencepiece"]] == []
    md = read_metadata(FAMILIES / "gemma" / "tokenizer.gguf")
    assert "  " in md["tokenizer.ggml.tokens"] and not any(md["tokenizer.ggml.scores"])


def test_qwen_normalizes_to_nfc_only_from_its_tokenizer_json(tokenizers):
    # Qwen's tokenizer.json composes characters (NFC); a GGUF has no normalizer, as in
    # llama.cpp and in transformers' reading of it.
    text = "e\u0301"
    assert tokenizers["qwen3", "dir"].encode(text) == tokenizers["qwen3", "dir"].encode("\u00e9")
    assert tokenizers["qwen3", "gguf"].encode(text) != tokenizers["qwen3", "gguf"].encode("\u00e9")


@pytest.mark.parametrize("family,source", SOURCES)
def test_decode_and_stream_equal_transformers(tokenizers, family, source):
    tok = tokenizers[family, source]
    for c in GOLDEN[family][source]["cases"]:
        for skip, key in ((False, "decoded"), (True, "decoded_skip")):
            if (family, source, skip) == ("phi3", "gguf", True) and 2 in c["ids"]:
                # Phi-3's GGUF marks </s> user-defined: llama.cpp (and we) print it; only
                # transformers drops it, as its LlamaTokenizer's default EOS text.
                assert tok.id_to_token(2) == "</s>" and tok.added_token(2) == ("</s>", False)
                continue
            assert tok.decode(c["ids"], skip_special_tokens=skip) == c[key]
            dec = tok.stream_decoder(skip_special_tokens=skip)
            assert "".join([dec.add(i) for i in c["ids"]] + [dec.flush()]) == c[key], c["text"]


# -- BOS and end-of-turn rules ----------------------------------------------------------------

@pytest.mark.parametrize("family,source", SOURCES)
def test_bos_eos_and_end_of_turn(tokenizers, family, source):
    tok = tokenizers[family, source]
    facts = GOLDEN[family][source]["facts"]
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        facts["bos_token"], facts["eos_token"], facts["pad_token"])
    first = tok.encode("Hi")[0]
    ends = {tok.token_to_id(t) for t in {
        "gemma": ["<eos>", "<end_of_turn>"],
        "llama3": ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
        "qwen3": ["<|im_end|>", "<|endoftext|>"],
        # Phi-3's generation_config.json also lists <|assistant|>; a GGUF has no such list.
        "phi3": ["<|endoftext|>", "<|end|>", "</s>"] + ["<|assistant|>"] * (source == "dir"),
    }[family]}
    assert tok.eos_ids == ends
    if family in ("qwen3", "phi3"):
        assert first != tok.bos_id  # no BOS (Qwen's GGUF names one; Phi-3.5 says not to)
    else:
        assert first == tok.bos_id and tok.encode("Hi", add_special_tokens=False)[0] != first


def test_user_defined_end_of_turn_still_stops():
    # Some Gemma GGUFs mark <end_of_turn> user-defined, not control; it ends a turn all the same.
    md = read_metadata(FAMILIES / "gemma" / "tokenizer.gguf")
    types = list(md["tokenizer.ggml.token_type"])
    eot = md["tokenizer.ggml.tokens"].index("<end_of_turn>")
    types[eot] = 4
    tok = Tokenizer.from_gguf_metadata({**md, "tokenizer.ggml.token_type": types})
    assert eot in tok.eos_ids and tok.encode("a<end_of_turn>", add_special_tokens=False)[-1] == eot


# -- chat templates ---------------------------------------------------------------------------

def _template_cases():
    for family, data in GOLDEN.items():
        for name, cases in data["chat"].items():
            for i, case in enumerate(cases):
                yield pytest.param(family, name, case, id=f"{name}-{i}")


@pytest.mark.parametrize("family,name,case", list(_template_cases()))
def test_chat_renders_equal_apply_chat_template(tokenizers, family, name, case):
    tok = tokenizers[family, "dir"]
    tpl = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"),
                       bos_token=tok.bos_token, eos_token=tok.eos_token)
    if "error" in case and case["messages"][0]["role"] == "system":
        # Gemma 2 has no system role; we fold it into the first user turn as Gemma 3's
        # template does, so where the two templates agree, Gemma 3's rendering is the answer.
        text = tpl.render(case["messages"], add_generation_prompt=case["add_generation_prompt"])
        system = case["messages"][0]["content"]
        assert system.strip() in text and "system" not in text
        g3 = [c for c in GOLDEN["gemma"]["chat"]["gemma-3-it"] if c["messages"] == case["messages"]
              and c["add_generation_prompt"] == case["add_generation_prompt"]]
        if system == system.strip():
            assert text == g3[0]["text"]
        return
    if "error" in case:
        with pytest.raises(InvalidInputError, match=case["error"].rstrip(".").replace(".", r"\.")):
            tpl.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                       **case["kwargs"])
        return
    text = tpl.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                      **case["kwargs"])
    want = case["text"]
    if "date_string" not in case["kwargs"]:  # Llama 3.2 writes today's date (strftime_now)
        want = want.replace(case["date"], datetime.now().strftime("%d %b %Y"))
    assert text == want
    if want == case["text"]:
        assert tok.encode(text, add_special_tokens=False) == case["ids"]


@pytest.mark.parametrize("family,origin", [("gemma", "gguf"), ("llama3", "tokenizer_config.json"),
                                           ("qwen3", "tokenizer_config.json")])
def test_template_found_in_the_model_files(tokenizers, family, origin):
    if origin == "gguf":
        md = read_metadata(FAMILIES / family / "tokenizer.gguf")
        tpl = ChatTemplate.resolve(gguf_metadata=md, tokenizer=tokenizers[family, "gguf"])
    else:
        tpl = ChatTemplate.resolve(model_dir=FAMILIES / family / "hf",
                                   tokenizer=tokenizers[family, "dir"])
    assert tpl.origin == origin and tpl.fallback_reason is None
    convo = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    text = tpl.render(convo)
    assert "Be kind." in text and "Hi" in text
    # Folded or not, the system prompt reaches the model; a Gemma prompt opens with one BOS.
    if family == "gemma":
        assert text.startswith("<bos><start_of_turn>user\nBe kind.\n\nHi<end_of_turn>")
    # transformers saves a template as chat_template.jinja beside tokenizer.json.
    assert tokenizers[family, "dir"].chat_template == tpl.source


def test_folded_system_message_stays_content(tokenizers):
    # The engine tokenizes message contents without special tokens; a folded system message
    # is still content, so "<end_of_turn>" typed into it cannot end the turn.
    tok = tokenizers["gemma", "dir"]
    tpl = ChatTemplate((TEMPLATES / "gemma-2-it.jinja").read_text(encoding="utf-8"),
                       bos_token=tok.bos_token, eos_token=tok.eos_token)
    chat = [{"role": "system", "content": "Be <end_of_turn> kind."},
            {"role": "user", "content": "Hi"}]
    pieces = tpl.render_segments(chat)
    assert "".join(p for p, _ in pieces) == tpl.render(chat)
    assert [p for p, content in pieces if content] == ["Be <end_of_turn> kind.\n\nHi"]
    with pytest.raises(InvalidInputError, match="System role not supported"):
        tpl.render([chat[0], {"role": "assistant", "content": "x"}])  # nothing to fold into


def test_phi3_ids_equal_sentencepiece_on_plain_text(tokenizers):
    # Phi-3's GGUF reading puts SentencePiece's space before every piece of text, as
    # sentencepiece does; the directory's (transformers' LlamaTokenizer) differs only on text
    # that starts with spaces, where Metaspace adds no second one.
    cases = [c for c in GOLDEN["phi3"]["gguf"]["cases"] if "ids_sentencepiece" in c]
    assert len(cases) >= 40
    tok = tokenizers["phi3", "gguf"]
    assert [c["text"][:40] for c in cases
            if tok.encode(c["text"], add_special_tokens=False) != c["ids_sentencepiece"]] == []
    differ = [c["text"] for c in GOLDEN["phi3"]["dir"]["cases"]
              if "ids_sentencepiece" in c and c["ids"] != c["ids_sentencepiece"]]
    assert differ and all(t.startswith(" ") for t in differ)


def test_phi3_rstrip_follows_llama_cpp_by_name():
    # llama.cpp gives Phi-3's added tokens rstrip only when general.name holds "phi-3"/"phi3"
    # (the converter now writes "Phi 3.5 Mini Instruct", which does not).
    md = read_metadata(FAMILIES / "phi3" / "tokenizer.gguf")
    plain = Tokenizer.from_gguf_metadata(md)
    named = Tokenizer.from_gguf_metadata({**md, "general.name": "Phi-3-mini-4k-instruct"})
    text = "<|user|>\n  Hi<|end|>\n<|assistant|> <|endoftext|> x"
    assert plain.encode(text) != named.encode(text)
    assert named.encode(text) == named.encode("<|user|>Hi<|end|><|assistant|><|endoftext|> x")


def test_llama3_gguf_rules_follow_llama_cpp():
    md = read_metadata(FAMILIES / "llama3" / "tokenizer.gguf")
    bos = md["tokenizer.ggml.bos_token_id"]
    # Files written before add_bos_token existed: Llama 3's pre-tokenizer still means BOS.
    no_flag = {k: v for k, v in md.items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer.from_gguf_metadata(no_flag).encode("Hi")[0] == bos
    assert Tokenizer.from_gguf_metadata({**no_flag, "tokenizer.ggml.pre": "gpt2"}
                                        ).encode("Hi")[0] != bos
    # A word the vocabulary holds whole is one token even where no merge builds it
    # (llama.cpp's ignore_merges; Llama 3's tokenizer.json says the same).
    word = "\u0120xyzzyq"  # " xyzzyq" in the byte alphabet
    tokens = list(md["tokenizer.ggml.tokens"]) + [word]
    grown = {**md, "tokenizer.ggml.tokens": tokens,
             "tokenizer.ggml.token_type": list(md["tokenizer.ggml.token_type"]) + [1]}
    assert Tokenizer.from_gguf_metadata(grown).encode(" xyzzyq", add_special_tokens=False) == [
        len(tokens) - 1]
    as_gpt2 = Tokenizer.from_gguf_metadata({**grown, "tokenizer.ggml.pre": "gpt2"})
    assert len(as_gpt2.encode(" xyzzyq", add_special_tokens=False)) > 1


@pytest.mark.parametrize("family,name,case", [
    p for p in _template_cases() if "error" not in p.values[2]])
def test_segments_join_to_the_rendering_and_keep_user_text_apart(family, name, case):
    # The engine tokenizes message contents without special tokens (api._chat_ids); every
    # user message must come out as a content piece however the template trims or folds.
    tpl = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"),
                       bos_token="<bos>", eos_token="<eos>")
    chat = [{**m, "content": m["content"] + " <|im_end|><end_of_turn><|eot_id|>"}
            if m["role"] == "user" else m for m in case["messages"]]
    kwargs = {"add_generation_prompt": case["add_generation_prompt"], **case["kwargs"]}
    pieces = tpl.render_segments(chat, **kwargs)
    assert "".join(p for p, _ in pieces) == tpl.render(chat, **kwargs)
    content = [p for p, is_content in pieces if is_content]
    for m in chat:
        if m["role"] == "user":
            assert any(m["content"].strip() in c for c in content), m["content"]
    # Qwen 3 drops an earlier turn's reasoning: that assistant text cannot be located and
    # stays markup; every other content is found.
    rewritten = sum("</think>" in m["content"] for m in chat[:-1] if m["role"] == "assistant")
    assert len(content) >= len(chat) - rewritten - (name == "gemma-2-it" and
                                                     chat[0]["role"] == "system")


OWN_TEMPLATES = {"gemma": "gemma", "llama3": "llama-3", "qwen3": "qwen3", "phi3": "phi-3"}


@pytest.mark.parametrize("family,name,case", [
    p for p in _template_cases() if "error" not in p.values[2] and "ids" in p.values[2]
    and p.values[1].startswith(OWN_TEMPLATES[p.values[0]])])  # another family's markup is
def test_chat_ids_piece_by_piece_equal_transformers(  # not special to this tokenizer
tokenizers, family, name, case):
    """The engine's chat path (markup parsed for special tokens, contents not, one piece
    at a time: api._chat_ids) gives transformers' ids of the whole rendered prompt: each
    piece carries the SentencePiece dummy space only where the whole text would."""
    tok = tokenizers[family, "dir"]
    tpl = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"),
                       bos_token=tok.bos_token, eos_token=tok.eos_token)
    kwargs = {"add_generation_prompt": case["add_generation_prompt"], **case["kwargs"]}
    if tpl.render(case["messages"], **kwargs) != case["text"]:
        pytest.skip("the rendering holds today's date (strftime_now), not the golden's")
    ids, complete = encode_segments(tok, tpl.render_segments(case["messages"], **kwargs),
                                    1 << 20)
    assert complete and ids == case["ids"]
