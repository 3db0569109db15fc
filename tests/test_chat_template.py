"""Chat templates render exactly as transformers' apply_chat_template (goldens), come from
the right source, and fail with typed one-sentence errors."""

from __future__ import annotations

import json
import os
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


# --- hostile templates: bounded at compile time and at render time ---------------------------

WIDE = 30_000_000  # past every bound; small enough that the unbounded old code stays cheap


@pytest.mark.parametrize("source", [
    f'{{{{ "x"|center({WIDE}) }}}}',
    f'{{{{ "x"|indent({WIDE}, true) }}}}',
    f'{{{{ "%{WIDE}s"|format("x") }}}}',
    f'{{{{ "%{WIDE}s" % "x" }}}}',
    f'{{{{ "{{:>{WIDE}}}".format("x") }}}}',
    f'{{{{ "x".ljust({WIDE}) }}}}',
    '{% set ns = namespace(s="x") %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}'
    '{% endfor %}{{ ns.s|length }}',
    '{% set ns = namespace(s="x") %}{% for i in range(30) %}{% set ns.s = ns.s + ns.s %}'
    '{% endfor %}{{ ns.s|length }}',
    '{{ ("x" * 1000000)|replace("x", "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyy") }}',
    f'{{{{ [1]|batch({WIDE}, 0)|list|length }}}}',
])
def test_widths_and_sizes_are_bounded_when_compiling_and_rendering(source):
    """Jinja folds constant expressions while compiling: a width check that held only at
    render time let ``"x"|center(10**9)`` take gigabytes before any chat."""
    import tracemalloc

    tracemalloc.start()
    try:
        tpl = ChatTemplate(source, origin="gguf")
        compiled_peak = tracemalloc.get_traced_memory()[1]
        with pytest.raises(UnsupportedModelError) as e:
            tpl.render(HI)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A doubling loop stops at the 16 M-character bound: a few copies of that at most.
    assert compiled_peak < 8 * 2**20 and peak < 64 * 2**20, (compiled_peak, peak)
    text = str(e.value)
    assert text.count(". ") == 0 and "chat template" in text


def _gguf_without_template(tmp_path, arch: str, tokens=None, template=None):
    from tests.hostile_models import write_gguf

    return write_gguf(tmp_path / f"{arch}.gguf", arch=arch, tokens=tokens,
                      chat_template=template)


def test_gemma_gguf_without_a_template_gets_gemma_turns(tmp_path):
    from inference.api import load_model

    m = load_model(str(_gguf_without_template(tmp_path, "gemma")), backend="numpy")
    text = m.chat_prompt([{"role": "system", "content": "Be brief."}, *HI])
    assert "<|im_start|>" not in text
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                         "<start_of_turn>model\n")
    assert m.template.template_source == "Gemma's, by architecture: the file has none"
    assert m.template.fallback_reason is None


def test_the_model_card_says_which_template_before_loading(tmp_path):
    from inference.store import spec_for_path
    from tests.hostile_models import VOCAB

    gemma = _gguf_without_template(tmp_path, "gemma")
    assert spec_for_path(gemma).chat_template == "Gemma's, by architecture: the file has none"
    tokens = ["t", "0", "<|start_header_id|>"] + [f"t{i}" for i in range(VOCAB - 3)]
    llama3 = _gguf_without_template(tmp_path, "llama", tokens=tokens)
    assert spec_for_path(llama3).chat_template == "Llama 3's, by vocabulary: the file has none"


def test_the_model_card_compiles_the_template_only_when_read(tmp_path, monkeypatch):
    from inference import store

    calls = []
    real = ChatTemplate.source_of
    monkeypatch.setattr(ChatTemplate, "source_of",
                        classmethod(lambda cls, ck: calls.append(ck.path) or real(ck)))
    spec = store.spec_for_path(_gguf_without_template(tmp_path, "gemma"), name="g")
    assert calls == []  # a load describes the model without compiling its template
    assert spec.chat_template == "Gemma's, by architecture: the file has none"
    again = store.spec_for_path(spec.path)  # from the spec cache: worked out once
    assert again.chat_template == spec.chat_template and len(calls) == 1
    assert again.name != spec.name and again == store.spec_for_path(spec.path)


def test_a_generate_imports_no_jinja():
    """What `inferdesk generate` imports before its model loads: Jinja comes with a chat."""
    import subprocess
    import sys

    code = ("import sys, inference.cli, inference.api, inference.store; "
            "inference.cli.build_parser(); print('jinja2' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("model_type", "vocab", "turn", "source"), [
    ("gemma3_text", [], "<start_of_turn>user\nHi<end_of_turn>\n", "Gemma's, by architecture"),
    ("qwen2", [], "<|im_start|>user\nHi<|im_end|>\n", "Qwen's, by architecture"),
    ("phi3", [], "<|user|>\nHi<|end|>\n<|assistant|>\n", "Phi-3's, by architecture"),
    ("mistral", [], "[INST] Hi[/INST]", "Mistral's, by architecture"),
    ("llama", ["<|start_header_id|>"], "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
     "Llama 3's, by vocabulary"),
    ("llama", ["<|im_start|>"], "<|im_start|>user\nHi<|im_end|>", "ChatML's, by vocabulary"),
    ("llama", [], "[INST] Hi [/INST]", "Llama 2's, by architecture"),
    ("starcoder2", [], "<|im_start|>user\nHi<|im_end|>", "ChatML: the file has none, and "
     "architecture 'starcoder2' has no known template"),
])
def test_family_templates_by_architecture(model_type, vocab, turn, source):
    tok = SimpleNamespace(token_to_id=lambda t: 7 if t in vocab else None, bos_token="<s>",
                          eos_token="</s>", unk_token=None, pad_token=None)
    tpl = ChatTemplate.resolve(gguf_metadata={}, tokenizer=tok, model_type=model_type)
    assert turn in tpl.render(HI)
    assert tpl.template_source.startswith(source)


def test_template_that_is_not_utf8_is_replaced_saying_so(tmp_path):
    """A GGUF template with bytes that are not UTF-8 raised a TypeError on every chat."""
    from inference.api import load_model

    path = _gguf_without_template(tmp_path, "gemma", template="XX{{ messages[0].content }}")
    path.write_bytes(path.read_bytes().replace(b"XX{{", b"\xff\xfe{{"))
    m = load_model(str(path), backend="numpy")
    assert "<start_of_turn>user\nHi<end_of_turn>" in m.chat_prompt(HI)
    assert m.template.template_source == \
        "Gemma's, by architecture: the file's own is not valid UTF-8"
    assert m.template.fallback_reason == ("The chat template from gguf is not valid UTF-8. "
                                          "Using Gemma's template.")
    assert list(m.generate(messages=HI, max_tokens=1))[-1].n_prompt > 0


@pytest.mark.parametrize(("family", "publisher"), [
    ("gemma", "gemma-3-it"), ("phi3", "phi-3.5-mini-instruct"), ("chatml", "qwen3"),
    ("llama3", "llama-3.2-instruct"),
])
def test_family_templates_render_as_the_publishers_do(family, publisher):
    """The reference: the publishers' own templates (tests/fixtures/chat_templates). Llama
    3.2's adds a dated preamble to the system turn that Llama 3's first template did not."""
    import re

    from inference.chat_template import TEMPLATES_DIR

    fixtures = Path(__file__).parent / "fixtures" / "chat_templates"
    chat = [{"role": "system", "content": "Be brief."}, *HI,
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]
    tokens = {"bos_token": "<bos>", "eos_token": "<eos>"}
    ours = ChatTemplate((TEMPLATES_DIR / f"{family}.jinja").read_text(encoding="utf-8"),
                        **tokens)
    theirs = ChatTemplate((fixtures / f"{publisher}.jinja").read_text(encoding="utf-8"),
                          **tokens)
    for generation_prompt in (True, False):
        want = re.sub(r"Cutting Knowledge Date: .*\nToday Date: .*\n\n", "",
                      theirs.render(chat, add_generation_prompt=generation_prompt))
        assert ours.render(chat, add_generation_prompt=generation_prompt) == want
