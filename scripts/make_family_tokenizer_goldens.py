"""Write tests/goldens/families/: tokenizers shaped like Gemma's, Llama 3's and Qwen 3's, each
as a Hugging Face directory and as a GGUF, with transformers' ids and chat renderings.

Run with the reference environment (transformers, tokenizers, sentencepiece, gguf):

    .venv-ref/bin/python scripts/make_family_tokenizer_goldens.py

No real vocabulary of these families can be downloaded here, so each is trained small, in
that family's shape:

* gemma: SentencePiece BPE with byte fallback and no dummy prefix, Gemma's special ids
  (<pad> 0, <eos> 1, <bos> 2, <unk> 3), <start_of_turn>/<end_of_turn> as control tokens.
  The GGUF is written the way llama.cpp writes Gemma's: architecture "gemma3", tokenizer
  "llama", no space prefix, runs of spaces spelled with real spaces, scores that do not give
  the merge order (all 0). References: sentencepiece itself, transformers' conversion of the
  GGUF, and transformers on the directory that conversion saves.
* llama3: byte-level BPE split by Llama 3's regex, <|begin_of_text|> added in front by the
  post-processor, <|eot_id|>/<|eom_id|>/<|end_of_text|> ending turns, GGUF pre "llama-bpe".
* qwen3: byte-level BPE with NFC and Qwen's regex, ChatML specials, <think> as a plain added
  token, no BOS, GGUF pre "qwen2".
* phi3: Llama 2's SentencePiece BPE (byte fallback, digits split, dummy prefix; <unk> 0,
  <s> 1, </s> 2) with Phi-3's eleven added tokens after the vocabulary in Phi-3's order
  (<|endoftext|>, <|assistant|>, placeholders, <|system|>, <|end|>, <|user|>), each but
  <|endoftext|> stripping the whitespace after it (rstrip), as Phi-3.5-mini's
  tokenizer_config.json says; its tokenizer.json in Phi-3's shape (Prepend/Replace
  normalizer, no pre-tokenizer). The GGUF as llama.cpp's Phi3MiniModel.set_vocab writes it:
  architecture "phi3", tokenizer "llama", added tokens scored -1000 and typed control,
  padding rows "[PADn]" unused up to the model's vocab_size, general.name as the converter
  derives it ("Phi 3.5 Mini Instruct"). transformers reads the two differently (the
  directory as its LlamaTokenizer: Metaspace, space before the first piece of text only,
  rstrip kept; the GGUF with a Prepend normalizer, a space before every piece, no rstrip,
  as llama.cpp does for a file of that name); each source is held to transformers' reading
  of it. sentencepiece's own ids are recorded for the plain texts.

``--only phi3`` rewrites the phi3 entry alone (the other families stay as they are).

Chat renderings use each family's real template (tests/fixtures/chat_templates/) through
``apply_chat_template``; Llama 3.2's is rendered without a date so ``strftime_now`` runs, and
the date it wrote is recorded for the test to substitute.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import gguf
import sentencepiece as spm
from make_tokenizer_goldens import CORPUS, LONG, _training_text, _write, tiny_model_keys
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "families"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"
VOCAB = 1200

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TEXTS = {
    "gemma": ["<bos>Hi<eos>", "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
              "text<end_of_turn>after", "<start_of_turn> spaced <end_of_turn> ",
              "<start_of_image> and <pad> and <unk>"],
    "llama3": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
               "text<|eot_id|>after<|eom_id|><|end_of_text|>",
               "<|start_header_id|> spaced <|end_header_id|> ",
               "almost: <|eot_id and <|begin_of_text |>"],
    "phi3": ["<|user|>\nHello!<|end|>\n<|assistant|>\n", "<s><|system|>\nBe brief.<|end|>",
             "text<|end|>after <|endoftext|> x", "<|user|>   spaced  \n\n<|end|>  \t",
             "</s> and <s> and <unk> and <|placeholder1|>", "<|assistant|>",
             "a<|user|>b<|assistant|> c<|end|>\n"],
    "qwen3": ["<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
              "<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
              "<|endoftext|><|endoftext|>", "text<|im_end|>after <tool_call>x</tool_call>"],
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a colour."}],
    [{"role": "system", "content": "  Answer in French.  "},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Bleu."},
     {"role": "user", "content": "Another, with ünïcode 🤖?\n"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
     {"role": "user", "content": "And 3+3?"}],
]
BAD_CONVERSATIONS = [
    [{"role": "assistant", "content": "I speak first."}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
]


def corpus(family: str) -> list[str]:
    return CORPUS + SPECIAL_TEXTS[family]


# -- training ---------------------------------------------------------------------------------

def train_gemma_spm(tmp: Path) -> spm.SentencePieceProcessor:
    text_file = tmp / "train.txt"
    text_file.write_text("\n".join(_training_text()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text_file), model_prefix=str(tmp / "gemma"), model_type="bpe",
        vocab_size=VOCAB, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False, allow_whitespace_only_pieces=True, character_coverage=0.9995,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>",
        control_symbols=["<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
        num_threads=1, hard_vocab_limit=False, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(tmp / "gemma.model"))


def gemma_gguf(sp: spm.SentencePieceProcessor, path: Path) -> dict:
    tokens, types = [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if len(piece) > 1 and set(piece) == {"\u2581"}:
            piece = " " * len(piece)  # how Gemma's GGUFs spell runs of spaces
        tokens.append(piece)
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    w = gguf.GGUFWriter(str(path), "gemma3")
    tiny_model_keys(w)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))  # Gemma's scores do not order its merges
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template((TEMPLATES / "gemma-3-it.jinja").read_text(encoding="utf-8"))
    _write(w)
    return {"tokens": len(tokens)}


def train_byte_level(split: str, nfc: bool) -> HFTokenizer:
    tk = HFTokenizer(BPE())
    if nfc:
        tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                         show_progress=False)
    tk.train_from_iterator(_training_text(), trainer)
    return tk


def llama3_dir(d: Path) -> None:
    tk = train_byte_level(LLAMA3_SPLIT, nfc=False)
    tk.model.ignore_merges = True  # as in Llama 3's tokenizer.json
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    tk.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    bos = tk.token_to_id("<|begin_of_text|>")
    tk.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    d.mkdir(parents=True)
    tk.save(str(d / "tokenizer.json"))
    _json(d / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "chat_template": (TEMPLATES / "llama-3.2-instruct.jinja").read_text(encoding="utf-8")})
    _json(d / "generation_config.json", {
        "bos_token_id": bos, "eos_token_id": [tk.token_to_id(t) for t in
                                              ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]})


def qwen3_dir(d: Path) -> None:
    tk = train_byte_level(QWEN2_SPLIT, nfc=True)
    tk.add_special_tokens([AddedToken(s, normalized=False, special=True)
                           for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tk.add_tokens([AddedToken(s, normalized=False, special=False)
                   for s in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    d.mkdir(parents=True)
    tk.save(str(d / "tokenizer.json"))
    _json(d / "tokenizer_config.json", {
        "tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "errors": "replace", "split_special_tokens": False,
        "clean_up_tokenization_spaces": False, "model_max_length": 131072,
        "chat_template": (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")})
    _json(d / "generation_config.json", {
        "bos_token_id": tk.token_to_id("<|endoftext|>"),
        "eos_token_id": [tk.token_to_id("<|im_end|>"), tk.token_to_id("<|endoftext|>")]})


PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
              "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>",
              "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
PHI3_PADDING = 5  # Phi-3's model rows past the tokenizer (32064 - 32011 = 53 there)


def train_llama2_spm(tmp: Path) -> spm.SentencePieceProcessor:
    text_file = tmp / "train.txt"
    text_file.write_text("\n".join(_training_text()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text_file), model_prefix=str(tmp / "phi3"), model_type="bpe",
        vocab_size=VOCAB, byte_fallback=True, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, allow_whitespace_only_pieces=True, character_coverage=0.9995,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, hard_vocab_limit=False,
        minloglevel=2)
    return spm.SentencePieceProcessor(model_file=str(tmp / "phi3.model"))


def phi3_dir(sp: spm.SentencePieceProcessor, d: Path) -> None:
    """tokenizer.json in Phi-3's shape: transformers' legacy Llama conversion of the
    SentencePiece model (merges ordered by score), Phi-3's added tokens and flags."""
    from transformers.tokenization_utils_base import generate_merges

    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = generate_merges(vocab, {sp.id_to_piece(i): sp.get_score(i) for i in range(n)})
    tk = HFTokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                         byte_fallback=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                          normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tk.add_special_tokens([AddedToken("<unk>", normalized=False, special=True),
                           AddedToken("<s>", normalized=False, special=True)])
    tk.add_tokens([AddedToken("</s>", normalized=False, special=False, rstrip=True)])
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True,
                                      rstrip=t != "<|endoftext|>") for t in PHI3_ADDED])
    assert tk.token_to_id("<|user|>") == n + len(PHI3_ADDED) - 1
    bos = tk.token_to_id("<s>")
    # No BOS, as add_bos_token says below (transformers 5 takes the post-processor from
    # this file, not from the flag).
    tk.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1")
    d.mkdir(parents=True)
    tk.save(str(d / "tokenizer.json"))
    decoder = {str(tk.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                         "rstrip": t not in ("<unk>", "<s>", "<|endoftext|>"),
                                         "single_word": False, "special": t != "</s>"}
               for t in ["<unk>", "<s>", "</s>", *PHI3_ADDED]}
    _json(d / "tokenizer_config.json", {
        "add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": decoder,
        "bos_token": "<s>", "chat_template": _template("phi-3.5-mini-instruct"),
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "legacy": False,
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "padding_side": "left",
        "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
        "use_default_system_prompt": False})
    _json(d / "generation_config.json", {
        "bos_token_id": bos, "eos_token_id": [tk.token_to_id(t) for t in
                                              ("<|endoftext|>", "<|end|>", "<|assistant|>")]})


def phi3_gguf(sp: spm.SentencePieceProcessor, d: Path, path: Path) -> None:
    """As llama.cpp's Phi3MiniModel.set_vocab writes it (see the module docstring)."""
    n = sp.get_piece_size()
    size = n + len(PHI3_ADDED) + PHI3_PADDING
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores, types = [-10000.0] * size, [5] * size
    for i in range(n):
        tokens[i], scores[i] = sp.id_to_piece(i), float(sp.get_score(i))
        types[i] = (2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                    else 6 if sp.is_byte(i) else 1)
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    for i, t in cfg["added_tokens_decoder"].items():
        i = int(i)
        tokens[i], scores[i] = t["content"], -1000.0
        types[i] = 3 if t["special"] else 4
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_name("Phi 3.5 Mini Instruct")
    tiny_model_keys(w)
    w.add_vocab_size(size)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    ids = {t: tokens.index(t) for t in ("<s>", "<|endoftext|>", "<unk>")}
    w.add_bos_token_id(ids["<s>"])
    w.add_eos_token_id(ids["<|endoftext|>"])
    w.add_unk_token_id(ids["<unk>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(cfg["chat_template"])
    _write(w)


def phi3_golden(tmp: Path) -> dict:
    sp = train_llama2_spm(tmp)
    d = OUT / "phi3"
    shutil.rmtree(d, ignore_errors=True)
    phi3_dir(sp, d / "hf")
    phi3_gguf(sp, d / "hf", d / "tokenizer.gguf")
    from_dir = AutoTokenizer.from_pretrained(d / "hf")
    from_gguf = AutoTokenizer.from_pretrained(d, gguf_file="tokenizer.gguf")
    texts = corpus("phi3")
    return {
        "gguf": {"reference": "transformers AutoTokenizer(gguf_file)", "facts": facts(from_gguf),
                 "cases": cases(from_gguf, texts, sp)},
        "dir": {"reference": "transformers AutoTokenizer(dir)", "facts": facts(from_dir),
                "cases": cases(from_dir, texts, sp)},
        "chat": {"phi-3.5-mini-instruct": chats(from_dir, _template("phi-3.5-mini-instruct"))},
    }


def byte_level_gguf(d: Path, path: Path, arch: str, pre: str, md: dict) -> None:
    """The directory's tokenizer as llama.cpp's converter writes it: tokens by id, merges,
    control tokens for special added ones, user-defined for plain added ones."""
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    types = {i: 1 for i in vocab.values()}
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
        types[t["id"]] = 3 if t["special"] else 4
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(tokens) == max(vocab.values()) + 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    w = gguf.GGUFWriter(str(path), arch)
    tiny_model_keys(w)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([types[i] for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[md["bos"]])
    w.add_eos_token_id(vocab[md["eos"]])
    if md.get("pad"):
        w.add_pad_token_id(vocab[md["pad"]])
    w.add_add_bos_token(md["add_bos"])
    w.add_chat_template(cfg["chat_template"])
    _write(w)


# -- references -------------------------------------------------------------------------------

def cases(tok, texts: list[str], sp: spm.SentencePieceProcessor | None = None) -> list[dict]:
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        case = {"text": text, "ids": ids, "ids_special": tok.encode(text),
                "decoded": tok.decode(ids, skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False),
                "decoded_skip": tok.decode(ids, skip_special_tokens=True,
                                           clean_up_tokenization_spaces=False)}
        if sp is not None and text in CORPUS:
            case["ids_sentencepiece"] = sp.encode(text)
        out.append(case)
    return out


def chats(tok, template: str, extra: dict | None = None) -> list[dict]:
    out = []
    for conv in CONVERSATIONS + BAD_CONVERSATIONS:
        for gen in (True, False):
            for kwargs in [{}] + ([extra] if extra else []):
                case = {"messages": conv, "add_generation_prompt": gen, "kwargs": kwargs}
                try:
                    text = tok.apply_chat_template(conv, chat_template=template, tokenize=False,
                                                   add_generation_prompt=gen, **kwargs)
                    case |= {"text": text, "date": datetime.now().strftime("%d %b %Y"),
                             "ids": tok.encode(text, add_special_tokens=False)}
                except Exception as e:  # the template's own raise_exception
                    case["error"] = str(e)
                out.append(case)
    return out


def facts(tok) -> dict:
    return {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "pad_token": tok.pad_token,
            "vocab_size": len(tok), "class": type(tok).__name__}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["phi3"], help="rewrite one family's entry alone")
    if ap.parse_args().only == "phi3":
        path = OUT / "goldens.json"
        golden = json.loads(path.read_text(encoding="utf-8"))
        with tempfile.TemporaryDirectory() as t:
            golden["phi3"] = phi3_golden(Path(t))
        path.write_text(json.dumps(golden, ensure_ascii=False) + "\n", encoding="utf-8")
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    golden: dict = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)

        # gemma: GGUF first (as llama.cpp writes it), then the directory transformers makes.
        sp = train_gemma_spm(tmp)
        gemma = OUT / "gemma"
        gemma.mkdir()
        gemma_gguf(sp, gemma / "tokenizer.gguf")
        from_gguf = AutoTokenizer.from_pretrained(gemma, gguf_file="tokenizer.gguf")
        from_gguf.save_pretrained(gemma / "hf")
        from_dir = AutoTokenizer.from_pretrained(gemma / "hf")
        texts = corpus("gemma")
        golden["gemma"] = {
            "gguf": {"reference": "transformers AutoTokenizer(gguf_file)",
                     "facts": facts(from_gguf), "cases": cases(from_gguf, texts, sp)},
            "dir": {"reference": "transformers AutoTokenizer(dir)", "facts": facts(from_dir),
                    "cases": cases(from_dir, texts, sp)},
            "chat": {"gemma-3-it": chats(from_dir, _template("gemma-3-it")),
                     "gemma-2-it": chats(from_dir, _template("gemma-2-it"))},
        }

        for fam, build, arch, pre, md, extra, tpl in (
                ("llama3", llama3_dir, "llama", "llama-bpe",
                 {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "add_bos": True},
                 {"date_string": "26 Jul 2024"}, "llama-3.2-instruct"),
                ("qwen3", qwen3_dir, "qwen3", "qwen2",
                 {"bos": "<|endoftext|>", "eos": "<|im_end|>", "pad": "<|endoftext|>",
                  "add_bos": False}, {"enable_thinking": False}, "qwen3")):
            d = OUT / fam
            build(d / "hf")
            byte_level_gguf(d / "hf", d / "tokenizer.gguf", arch, pre, md)
            from_dir = AutoTokenizer.from_pretrained(d / "hf")
            from_gguf = AutoTokenizer.from_pretrained(d, gguf_file="tokenizer.gguf")
            texts = corpus(fam)
            golden[fam] = {
                "gguf": {"reference": "transformers AutoTokenizer(gguf_file)",
                         "facts": facts(from_gguf), "cases": cases(from_gguf, texts)},
                "dir": {"reference": "transformers AutoTokenizer(dir)", "facts": facts(from_dir),
                        "cases": cases(from_dir, texts)},
                "chat": {tpl: chats(from_dir, _template(tpl), extra)},
            }
        golden["llama3"]["chat"]["phi-3.5-mini-instruct"] = chats(
            AutoTokenizer.from_pretrained(OUT / "llama3" / "hf"),
            _template("phi-3.5-mini-instruct"))
        golden["phi3"] = phi3_golden(tmp)
    assert LONG in CORPUS
    path = OUT / "goldens.json"
    path.write_text(json.dumps(golden, ensure_ascii=False) + "\n", encoding="utf-8")
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(ROOT)} {p.stat().st_size // 1024} KiB")


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
