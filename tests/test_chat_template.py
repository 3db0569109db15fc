"""Chat templates render exactly as transformers' apply_chat_template (goldens), come from
the right source, and fail with typed one-sentence errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference.chat_template import CHATML_PATH, ChatTemplate
from inference.errors import InvalidInputError, UnsupportedModelError
from inference.tokenizer import Tokenizer

GOLDEN = json.loads((Path(__file__).parent / "goldens" / "tokenizer_smollm2.json")
                    .read_text(encoding="utf-8"))
SPM_MD = json.loads((Path(__file__).parent / "goldens" / "tokenizer_spm.json")
                    .read_text(encoding="utf-8"))["metadata"]
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def spm() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(SPM_MD)


def test_renders_equal_transformers():
    assert GOLDEN["chat"] and {c["template"] for c in GOLDEN["chat"]} == {
        "model", "chatml", "features"}
    tokens = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "special_tokens": {"unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"}}
    templates = {
        "model": ChatTemplate(GOLDEN["chat_model_template"], origin="gguf", **tokens),
        "chatml": ChatTemplate(CHATML_PATH.read_text(encoding="utf-8"), **tokens),
        "features": ChatTemplate(GOLDEN["chat_features_template"], **tokens),
    }
    for case in GOLDEN["chat"]:
        got = templates[case["template"]].render(
            case["messages"], add_generation_prompt=case["add_generation_prompt"])
        assert got == case["text"], case["template"]


def test_gguf_template_wins_then_config_then_chatml(tmp_path):
    gguf_md = {"tokenizer.chat_template": "G{{ messages[0].content }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"},
                           {"name": "default", "template": "C{{ messages[0].content }}"}]}))
    assert ChatTemplate.resolve(gguf_metadata=gguf_md, model_dir=tmp_path).render(HI) == "GHi"
    from_dir = ChatTemplate.resolve(gguf_metadata={}, model_dir=tmp_path)
    assert from_dir.origin == "tokenizer_config.json" and from_dir.render(HI) == "CHi"
    fallback = ChatTemplate.resolve(model_dir=tmp_path / "nowhere")
    assert fallback.origin == "chatml" and fallback.fallback_reason is None
    assert fallback.render(HI) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert fallback.render(HI, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_for_checkpoint_uses_metadata_and_tokenizer_strings(spm, tmp_path):
    ckpt = SimpleNamespace(path=tmp_path / "m.gguf", chat_template=None, metadata={
        "tokenizer.chat_template": "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}"})
    tpl = ChatTemplate.for_checkpoint(ckpt, spm)
    text = tpl.render(HI)
    assert text == "<s>[Hi]</s>"
    assert spm.encode(text, add_special_tokens=False)[0] == spm.bos_id  # one BOS, from the text


def test_broken_template_falls_back_or_raises():
    md = {"tokenizer.chat_template": "{% for m in messages %}{{ m.content }"}
    tpl = ChatTemplate.resolve(gguf_metadata=md)
    assert tpl.origin == "chatml" and "does not compile" in tpl.fallback_reason
    with pytest.raises(UnsupportedModelError, match="from gguf does not compile"):
        ChatTemplate.resolve(gguf_metadata=md, strict=True)


def test_template_errors_are_typed():
    strict_roles = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('First message must be from the"
        " user') }}{% endif %}ok")
    assert strict_roles.render(HI) == "ok"
    with pytest.raises(InvalidInputError, match="First message must be from the user"):
        strict_roles.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(UnsupportedModelError, match="failed to render"):
        ChatTemplate("{{ messages[5].content.upper() }}").render(HI)
    with pytest.raises(UnsupportedModelError, match="failed to render"):
        ChatTemplate("{{ messages.append(1) }}").render(HI)  # the sandbox is immutable
    with pytest.raises(InvalidInputError):
        ChatTemplate.chatml().render([{"role": "user"}])
    with pytest.raises(InvalidInputError):
        ChatTemplate.chatml().render("Hi")


def test_tojson_keeps_unicode_and_html():
    out = ChatTemplate("{{ messages[0] | tojson }}").render([{"role": "u", "content": "é<b>"}])
    assert out == '{"role": "u", "content": "é<b>"}'
    assert len(ChatTemplate("{{ strftime_now('%Y') }}").render(HI)) == 4
