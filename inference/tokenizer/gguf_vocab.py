"""Turn the vocabulary a GGUF file embeds into a ``tokenizers.Tokenizer``.

A GGUF carries no tokenizer.json, only llama.cpp's description of one: ``tokenizer.ggml.*``
keys. Three families cover the decoders (Llama, SmolLM2, Mistral, Qwen, Gemma, Phi-3) and
BERT embedders:

* ``gpt2``: byte-level BPE. Tokens are already spelled in GPT-2's byte alphabet and the merges
  are listed; only the pre-tokenizer split regex is implicit, named by ``tokenizer.ggml.pre``.
* ``llama``: SentencePiece BPE. Tokens carry scores (higher merges first), ``<0xNN>`` byte
  tokens stand in for characters outside the vocabulary, and a space is prepended to the text
  (to every piece of text between added tokens for Phi-3, once for the others).
* ``bert``: WordPiece (BERT embedders). llama.cpp's converter stores a word-initial piece
  as ``"\u2581word"`` and a continuation ``"##ing"`` as ``"ing"`` (control tokens as they are);
  the text is lower-cased and accents stripped, as llama.cpp's WPM tokenizer always does.

Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import chain, repeat
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from inference.errors import CorruptModelError, UnsupportedModelError
from inference.tokenizer.kept import ModelRecipe

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The split regexes of llama.cpp's pre-tokenizer types, applied one after the other (each
# splits the pieces the previous one made). Written in the tokenizers (Oniguruma) dialect.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    # llama.cpp's own "default" is a heuristic of four regexes for files that predate the
    # key; the vocabularies that say "default" are in practice GPT-2's, so we split as GPT-2.
    "default": (_GPT2,),
    "gpt2": (_GPT2,),
    "gpt-2": (_GPT2,),
    "mpt": (_GPT2,),
    "olmo": (_GPT2,),
    # Code-trained vocabularies split every digit on its own first.
    "smollm": (r"\p{N}", _GPT2),
    "starcoder": (r"\p{N}", _GPT2),
    "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2),
    "llama3": (_LLAMA3,),
    "llama-v3": (_LLAMA3,),
    "llama-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,),
    "dbrx": (_LLAMA3,),
    "smaug-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "stablelm2": (_QWEN2,),
    "deepseek-r1-qwen": (_QWEN2,),
}

# Pre-tokenizers of Llama 3's family, for which llama.cpp takes a word found whole in the
# vocabulary as one token before any merge (as Llama 3's tokenizer.json says with
# "ignore_merges") and adds BOS unless the file says not to.
LLAMA3_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3"})

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (spaces and controls shifted)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def byte_token_value(token: str) -> int | None:
    """The byte a SentencePiece ``<0xNN>`` fallback token stands for, else None."""
    m = _BYTE_TOKEN.match(token)
    return int(m.group(1), 16) if m else None


def check_supported(md: Mapping[str, Any]) -> None:
    """Raise UnsupportedModelError, as :func:`build_from_gguf` would, if the file's tokenizer
    type or pre-tokenizer is one we cannot build; cheap (no vocabulary is read)."""
    model = md.get("tokenizer.ggml.model")
    if model is None:
        raise UnsupportedModelError("This GGUF file embeds no tokenizer (no tokenizer.ggml.model).")
    if model not in ("gpt2", "llama", "bert"):
        raise UnsupportedModelError(
            f"GGUF tokenizer type {model!r} is not supported (only 'gpt2' BPE, 'llama' "
            "SentencePiece and 'bert' WordPiece are).")
    pre = str(md.get("tokenizer.ggml.pre") or "default")
    if model == "gpt2" and pre not in PRE_TOKENIZER_SPLITS:
        raise UnsupportedModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: "
            f"{', '.join(sorted(PRE_TOKENIZER_SPLITS))}.")


def build_from_gguf(md: Mapping[str, Any]) -> tuple[HFTokenizer, dict[str, Any]]:
    """A tokenizers.Tokenizer and facts about it (kind, add_bos, ..., and under "model"
    the :class:`ModelRecipe` of its model) from GGUF metadata."""
    check_supported(md)
    model = md.get("tokenizer.ggml.model")
    tokens = list(md.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise CorruptModelError("This GGUF file's tokenizer has no tokens.")
    types = list(md.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise CorruptModelError(
            f"This GGUF file lists {len(tokens)} tokens but {len(types)} token types.")
    if model == "bert":
        tk, recipe = _wordpiece(md, tokens, types)
        info = {"kind": "generic", "strip_space": False, "model": recipe,
                "add_bos": bool(md.get("tokenizer.ggml.add_bos_token", True)),
                "add_eos": bool(md.get("tokenizer.ggml.add_eos_token", True))}
        cls = md.get("tokenizer.ggml.cls_token_id", md.get("tokenizer.ggml.bos_token_id"))
        sep = md.get("tokenizer.ggml.seperator_token_id", md.get("tokenizer.ggml.eos_token_id"))
        set_template_processor(  # [CLS] text [SEP]
            tk, bos=(tokens[int(cls)], int(cls)) if info["add_bos"] and cls is not None else None,
            eos=(tokens[int(sep)], int(sep)) if info["add_eos"] and sep is not None else None)
        return tk, info
    if model == "gpt2":
        tk, recipe = _byte_level_bpe(md, tokens, types)
        info = {"kind": "byte_level", "strip_space": False, "model": recipe}
        default_bos = md.get("tokenizer.ggml.pre") in LLAMA3_PRE
    else:  # "llama"
        add_space = bool(md.get("tokenizer.ggml.add_space_prefix", True))
        # Phi-3 (llama.cpp and transformers alike) puts the space in front of every piece of
        # text, after each added token too; the others once, in front of the whole text.
        each = add_space and md.get("general.architecture") == "phi3"
        tk, recipe = _sentencepiece_bpe(md, tokens, types, add_space, each)
        info = {"kind": "sentencepiece", "strip_space": add_space, "model": recipe,
                "prefix_space": add_space and not each}
        default_bos = True  # llama.cpp and transformers add BOS unless the file says not to
    info["add_bos"] = bool(md.get("tokenizer.ggml.add_bos_token", default_bos))
    info["add_eos"] = bool(md.get("tokenizer.ggml.add_eos_token", False))
    _set_post_processor(tk, tokens, md, info["add_bos"], info["add_eos"])
    return tk, info


def _byte_level_bpe(md: Mapping[str, Any], tokens: list[str], types: list[int]
                    ) -> tuple[HFTokenizer, ModelRecipe]:
    pre = str(md.get("tokenizer.ggml.pre") or "default")
    splits = PRE_TOKENIZER_SPLITS[pre]  # known: check_supported ran
    merges = md.get("tokenizer.ggml.merges")
    if not merges:
        raise CorruptModelError("This GGUF file's BPE tokenizer lists no merges.")
    outside = _outside_byte_alphabet()
    spell = byte_alphabet()
    # Real BPE tokens are spelled in the byte alphabet; anything else (a raw added token
    # such as "<think>" with a space) is respelled so the vocabulary stays consistent.
    keys = tokens if not outside.search("".join(tokens)) else [
        tok if not outside.search(tok) else "".join(spell[b] for b in tok.encode("utf-8"))
        for tok in tokens]
    # The first id of a piece listed twice, as dict.setdefault would keep.
    vocab = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
    recipe = ModelRecipe("BPE", vocab, _merge_pairs(merges), {
        "fuse_unk": False, "byte_fallback": False, "ignore_merges": pre in LLAMA3_PRE})
    try:
        tk = HFTokenizer(recipe.build())
    except Exception as e:  # tokenizers raises plain Exception for merges of unknown tokens
        raise CorruptModelError(f"This GGUF file's BPE merges do not fit its vocabulary "
                                f"({str(e).splitlines()[0] if str(e) else e!r}).") from None
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a converter's mislabel, as
    # transformers also judges; user-defined ones are matched whole, as llama.cpp does.
    _add_tokens(tk, tokens, types, special_types={CONTROL}, plain_types={USER_DEFINED},
                keep=lambda t: not outside.search(t))
    return tk, recipe


@lru_cache(maxsize=1)
def _outside_byte_alphabet() -> re.Pattern[str]:
    """Matches a character GPT-2's byte alphabet does not have."""
    return re.compile("[^" + re.escape("".join(byte_alphabet().values())) + "]")


def _merge_pairs(merges: Sequence[str]) -> list[tuple[str, str]]:
    """``"left right"`` merges as (left, right) pairs."""
    if list(map(str.count, merges, repeat(" "))).count(1) == len(merges):
        parts = " ".join(merges).split(" ")  # one space in each, the usual case: split at once
        return list(zip(parts[0::2], parts[1::2], strict=True))
    return [tuple(m.split(" ", 1)) for m in merges]


def _sentencepiece_bpe(md: Mapping[str, Any], tokens: list[str], types: list[int],
                       add_space: bool, space_each: bool = False
                       ) -> tuple[HFTokenizer, ModelRecipe]:
    scores = list(md.get("tokenizer.ggml.scores") or [])
    if len(scores) != len(tokens):
        raise CorruptModelError(
            f"This GGUF file lists {len(tokens)} tokens but {len(scores)} scores.")
    # Gemma's files spell a piece of several spaces with real spaces; the text reaches the
    # model with U+2581 for each space, so respell them.
    tokens = ["\u2581" * len(t) if len(t) > 1 and not t.strip(" ") else t for t in tokens]
    if str(md.get("general.architecture", "")).startswith("gemma"):
        # Gemma's scores do not order its merges; its pieces are stored in merge order.
        scores = [-float(i) for i in range(len(tokens))]
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None:
        unk_id = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    unk = tokens[int(unk_id)] if unk_id is not None else None
    merges, merge_ids = _merges_from_scores(tokens, scores, types, vocab)
    recipe = ModelRecipe("BPE", vocab, merges,
                         {"unk_token": unk, "fuse_unk": True, "byte_fallback": True}, merge_ids)
    tk = HFTokenizer(recipe.build())
    # SentencePiece writes spaces as U+2581 and does not split on them. Its dummy prefix is
    # added by Tokenizer.encode, not by Metaspace: Metaspace skips it when the text already
    # starts with a space, where SentencePiece (and llama.cpp) add it all the same.
    tk.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="never", split=False)
    if space_each:  # a normalizer runs on each piece of text between added tokens
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                              normalizers.Replace(" ", "\u2581")])
        tk.pre_tokenizer = None
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tk.decoder = decoders.Sequence(steps)
    _add_tokens(tk, tokens, types, special_types={CONTROL, UNKNOWN}, plain_types={USER_DEFINED},
                keep=lambda t: True, rstrip=_rstrip_tokens(md))
    return tk, recipe


def _rstrip_tokens(md: Mapping[str, Any]) -> frozenset[str]:
    """Added tokens that swallow the whitespace after them. A GGUF cannot say so; llama.cpp
    gives Phi-3's the flag its tokenizer_config.json has, by the model's name (general.name
    holding "phi-3" or "phi3"): every added token but <unk>, <s> and <|endoftext|>."""
    name = str(md.get("general.name") or "").lower()
    if "phi-3" not in name and "phi3" not in name:
        return frozenset()
    tokens = md.get("tokenizer.ggml.tokens") or []
    types = md.get("tokenizer.ggml.token_type") or []
    added = {t for t, ty in zip(tokens, types, strict=False)
             if ty in (CONTROL, USER_DEFINED, UNKNOWN)} | {"</s>"}
    return frozenset(added - {"<unk>", "<s>", "<|endoftext|>"})


def _wordpiece(md: Mapping[str, Any], tokens: list[str], types: list[int]
               ) -> tuple[HFTokenizer, ModelRecipe]:
    """BERT's tokenizer from llama.cpp's "phantom space" vocabulary (see the module docstring)."""
    vocab: dict[str, int] = {}
    for i, (tok, ty) in enumerate(zip(tokens, types, strict=True)):
        word = tok if ty in (CONTROL, UNKNOWN) else tok[1:] if tok.startswith("\u2581") \
            else "##" + tok
        vocab.setdefault(word, i)
    unk_id = md.get("tokenizer.ggml.unknown_token_id")
    if unk_id is None or not 0 <= int(unk_id) < len(tokens):
        raise CorruptModelError("This GGUF file's WordPiece vocabulary names no unknown token.")
    recipe = ModelRecipe("WordPiece", vocab, (), {"unk_token": tokens[int(unk_id)],
                                                  "continuing_subword_prefix": "##"})
    tk = HFTokenizer(recipe.build())
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=True, lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece(prefix="##")
    _add_tokens(tk, tokens, types, special_types={CONTROL, UNKNOWN}, plain_types={USER_DEFINED},
                keep=lambda t: True)
    return tk, recipe


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int],
                        vocab: Mapping[str, int]) -> tuple[list[tuple[str, str]], array]:
    """SentencePiece BPE merges the pair whose joined piece scores highest; as ranked merges
    that is every split of every normal piece into two vocabulary pieces, best score first.
    The merges as pairs of pieces, and as their ids (left, right, left, ...)."""
    mergeable = {t for t, ty in zip(tokens, types, strict=True) if ty == NORMAL}
    found: list[tuple[float, int, int, str, str]] = []
    for tok, score, ty in zip(tokens, scores, types, strict=True):
        if ty != NORMAL or len(tok) < 2:
            continue
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in mergeable and right in mergeable:
                found.append((-float(score), vocab[left], vocab[right], left, right))
    found.sort()
    ids = array("I", chain.from_iterable((a, b) for _, a, b, _, _ in found))
    return [(left, right) for _, _, _, left, right in found], ids


def _add_tokens(tk: HFTokenizer, tokens: list[str], types: list[int], *, special_types: set[int],
                plain_types: set[int], keep, rstrip: frozenset[str] = frozenset()) -> None:
    special = [AddedToken(t, normalized=False, special=True, rstrip=t in rstrip)
               for t, ty in zip(tokens, types, strict=True) if ty in special_types and keep(t)]
    plain = [AddedToken(t, normalized=False, special=False, rstrip=t in rstrip)
             for t, ty in zip(tokens, types, strict=True) if ty in plain_types and keep(t)]
    if special:
        tk.add_special_tokens(special)
    if plain:
        tk.add_tokens(plain)


def _set_post_processor(tk: HFTokenizer, tokens: list[str], md: Mapping[str, Any],
                        add_bos: bool, add_eos: bool) -> None:
    bos_id, eos_id = md.get("tokenizer.ggml.bos_token_id"), md.get("tokenizer.ggml.eos_token_id")
    set_template_processor(
        tk,
        bos=(tokens[int(bos_id)], int(bos_id)) if add_bos and bos_id is not None else None,
        eos=(tokens[int(eos_id)], int(eos_id)) if add_eos and eos_id is not None else None)


def set_template_processor(tk: HFTokenizer, bos: tuple[str, int] | None,
                           eos: tuple[str, int] | None) -> None:
    """Make ``encode(add_special_tokens=True)`` add BOS and/or EOS around the text."""
    head = f"{bos[0]}:0 " if bos else ""
    tail = f" {eos[0]}:0" if eos else ""
    specials = [x for x in (bos, eos) if x is not None]
    tk.post_processor = processors.TemplateProcessing(
        single=f"{head}$A:0{tail}", pair=f"{head}$A:0{tail} {head}$B:1{tail}".strip(),
        special_tokens=list(dict.fromkeys(specials)))
