"""The engine's tokenizer: a ``tokenizers.Tokenizer`` plus the facts generation needs."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import __version__ as tokenizers_version
from tokenizers import pre_tokenizers

from inference.errors import CorruptModelError, ModelNotFoundError
from inference.formats.cache import key_path, load_pickle, save_pickle
from inference.tokenizer import gguf_vocab
from inference.tokenizer import kept as kept_form
from inference.tokenizer.stream import StreamDecoder

# Control tokens that end a turn in the chat formats we know; a model that emits one is done,
# whatever its GGUF names as EOS (SmolLM2 ends turns with <|im_end|> and documents with
# <|endoftext|>). llama.cpp keeps a similar list.
END_OF_TURN = frozenset({
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
    "<end_of_turn>", "<|end|>", "</s>",
})

# A kept GGUF tokenizer (Tokenizer.from_gguf_metadata) is read back only under the same
# version: of this conversion (raise it when gguf_vocab builds tokenizers differently), of
# the kept form (kept.FORM) and of the tokenizers library that serialized it.
_CACHE_VERSION = f"1|form {kept_form.FORM}|tokenizers {tokenizers_version}"
MIN_CACHED_TOKENS = 4096  # smaller vocabularies build in milliseconds: not worth a file


class Tokenizer:
    """Text <-> ids for one model. Build with :meth:`from_dir`, :meth:`from_file`,
    :meth:`from_gguf_metadata` or :meth:`from_gguf`."""

    def __init__(self, backend: HFTokenizer, *, kind: str = "generic", strip_space: bool = False,
                 prefix_space: bool = False,
                 bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, unk_token: str | None = None,
                 extra_eos_ids: Iterable[int] = (), chat_template: str | None = None) -> None:
        backend.no_padding()
        backend.no_truncation()  # tokenizer.json files may carry a max_length; callers truncate
        self.backend = backend
        self._max_id: int | None = None  # max_id, once read (the vocabulary does not change)
        self.kind = kind  # "byte_level" | "sentencepiece" | "generic": how to stream-decode
        self.strip_space = strip_space  # decode drops the space SentencePiece put in front
        self.prefix_space = prefix_space  # encode puts SentencePiece's dummy space in front
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token, self.unk_token = pad_token, unk_token
        self.bos_id = self._id(bos_token)
        self.eos_id = self._id(eos_token)
        self.pad_id = self._id(pad_token)
        self.eos_ids = self._end_ids(extra_eos_ids)
        self._added = {i: (t.content, t.special)
                       for i, t in backend.get_added_tokens_decoder().items()}
        self._added_text = tuple(c for c, _ in self._added.values())
        # Added tokens that swallow the whitespace after them (Phi-3's markup).
        self._rstrip = {i for i, t in backend.get_added_tokens_decoder().items() if t.rstrip}
        self._plain_added_text = tuple(c for c, sp in self._added.values() if not sp)
        self._settings = threading.Lock()
        pre = backend.pre_tokenizer
        # A Metaspace that adds SentencePiece's dummy space: "first" puts it before the start
        # of the input only, "always" also after each added token; ``_no_prefix`` is the
        # same without it, for a piece that continues a prompt.
        self._scheme = (pre.prepend_scheme if isinstance(pre, pre_tokenizers.Metaspace)
                        and pre.prepend_scheme != "never" else None)
        self._no_prefix = None if self._scheme is None else pre_tokenizers.Metaspace(
            replacement=pre.replacement, prepend_scheme="never", split=pre.split)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_file(cls, tokenizer_json: str | Path,
                  config_json: str | Path | None = None) -> Tokenizer:
        """From a tokenizer.json, with tokenizer_config.json for special tokens and template."""
        path = Path(tokenizer_json)
        if not path.is_file():
            raise ModelNotFoundError(f"{path}: no such tokenizer file.")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception on bad JSON
            raise CorruptModelError(f"{path}: not a readable tokenizer.json ({e}).") from e
        config = _read_json(Path(config_json)) if config_json else {}
        special_map = _read_json(path.with_name("special_tokens_map.json"))
        gen = _read_json(path.with_name("generation_config.json"))
        tok = {k: _token_text(config.get(k, special_map.get(k)))
               for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        if tok["pad_token"] is None and backend.padding:
            tok["pad_token"] = backend.padding.get("pad_token")
        if config.get("tokenizer_class") in ("LlamaTokenizer", "LlamaTokenizerFast"):
            _as_llama_tokenizer(backend, config)
        if "add_bos_token" in config or "add_eos_token" in config:
            # transformers rebuilds the post-processor from these flags; so do we.
            bos = _pair(backend, tok["bos_token"]) if config.get("add_bos_token") else None
            eos = _pair(backend, tok["eos_token"]) if config.get("add_eos_token") else None
            gguf_vocab.set_template_processor(backend, bos, eos)
        extra = gen.get("eos_token_id", [])
        extra = [extra] if isinstance(extra, int) else list(extra)
        kind, strip = _stream_kind(json.loads(backend.to_str()).get("decoder"))
        template = _template_text(config.get("chat_template"))
        jinja = path.with_name("chat_template.jinja")  # where transformers now saves it
        if template is None and jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        return cls(backend, kind=kind, strip_space=strip, extra_eos_ids=extra,
                   chat_template=template, **tok)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """From a model directory holding tokenizer.json (and tokenizer_config.json)."""
        path = Path(path)
        if path.is_file():
            path = path.parent
        cfg = path / "tokenizer_config.json"
        return cls.from_file(path / "tokenizer.json", cfg if cfg.is_file() else None)

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any],
                           identity: str | None = None) -> Tokenizer:
        """From a GGUF file's raw key/values (``tokenizer.ggml.*``, original key names).

        ``identity`` (the file's, :attr:`Checkpoint.identity`): the tokenizer is kept in
        the weight cache (:mod:`inference.formats.cache`) under it, in the form of
        :mod:`.kept`, and read back by later loads of the same file, skipping the Python
        passes over the vocabulary and the parse of a tokenizer.json."""
        tokens = metadata.get("tokenizer.ggml.tokens")
        big = tokens is not None and len(tokens) >= MIN_CACHED_TOKENS
        path = key_path("tokenizer", f"{identity}|{_CACHE_VERSION}") if identity and big \
            else None
        kept = load_pickle(path)
        backend = kept_form.restore(kept.get("tokenizer")) if isinstance(kept, dict) \
            and kept.get("version") == _CACHE_VERSION else None
        if backend is not None:
            try:
                tok = cls(backend, **kept["args"])
            except (KeyError, TypeError, ValueError, AttributeError):  # a damaged entry: rebuilt
                pass
            else:
                if isinstance(kept.get("max_id"), int):  # kept by the load that built it
                    tok._max_id = kept["max_id"]
                else:  # an entry without max_id: added once
                    save_pickle(path, {**kept, "max_id": tok.max_id})
                return tok
        md = {k: _plain(v) for k, v in metadata.items()
              if k.startswith("tokenizer.") or k.startswith("general.")}
        backend, info = gguf_vocab.build_from_gguf(md)
        tokens = md["tokenizer.ggml.tokens"]

        def text(key: str) -> str | None:
            i = md.get(f"tokenizer.ggml.{key}")
            return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

        extra = [int(md[k]) for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                 if md.get(k) is not None]
        args = {"kind": info["kind"], "strip_space": info["strip_space"],
                "prefix_space": info.get("prefix_space", False),
                "bos_token": text("bos_token_id"), "eos_token": text("eos_token_id"),
                "pad_token": text("padding_token_id"), "unk_token": text("unknown_token_id"),
                "extra_eos_ids": extra, "chat_template": md.get("tokenizer.chat_template")}
        tok = cls(backend, **args)
        # The largest id: the model's vocabulary's or an added token's.
        tok._max_id = max(max(info["model"].vocab.values(), default=-1),
                          max(tok._added, default=-1))
        if path is not None:  # max_id too: reading it from the backend walks the vocabulary
            save_pickle(path, {"version": _CACHE_VERSION, "args": args, "max_id": tok.max_id,
                               "tokenizer": kept_form.dump(backend, info["model"])})
        return tok

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """From a .gguf file, reading only its metadata."""
        from inference.tokenizer.gguf_meta import read_metadata

        return cls.from_gguf_metadata(read_metadata(path))

    # -- use ------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def max_id(self) -> int:
        """The largest id this tokenizer can produce (-1 for an empty vocabulary)."""
        if self._max_id is None:
            self._max_id = max(self.backend.get_vocab(with_added_tokens=True).values(),
                               default=-1)
        return self._max_id

    def encode(self, text: str, add_special_tokens: bool = True,
               parse_special: bool = True, after: int | None = None) -> list[int]:
        """Ids of ``text``. Special tokens written in the text ("<|im_start|>") become their
        single id unless ``parse_special`` is False (then they are ordinary text, which is
        what untrusted user content should get). ``add_special_tokens`` adds the model's
        BOS/EOS (or [CLS]/[SEP]). ``after``: the id of the token just before ``text`` when
        it continues a prompt tokenized piece by piece; SentencePiece's dummy space then
        goes in only where tokenizing the whole prompt would put it (after an added token,
        or only at the very start, by the tokenizer's rule), not before every piece, and an
        added token that strips the whitespace after it strips this text's."""
        fresh = after is None or (self._scheme != "first" and int(after) in self._added)
        if after is not None and int(after) in self._rstrip:
            text = text.lstrip()
        if fresh:
            text = self._prefixed(text, parse_special)
        with self._settings:  # the switches below are the backend's state: one call at a time
            pre = self.backend.pre_tokenizer
            if not fresh and self._no_prefix is not None:
                self.backend.pre_tokenizer = self._no_prefix
            self.backend.encode_special_tokens = not parse_special
            try:
                return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
            finally:
                self.backend.encode_special_tokens = False
                self.backend.pre_tokenizer = pre

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True
                     ) -> list[list[int]]:
        """:meth:`encode` of many texts at once (tokenizers spreads them over threads)."""
        texts = [self._prefixed(t, True) for t in texts]
        encs = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encs]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; bytes split across tokens come out whole or as U+FFFD."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        """A decoder that takes generated ids one at a time and returns text deltas."""
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def added_token(self, token_id: int) -> tuple[str, bool] | None:
        """(content, is_special) of an added token (control or user-defined), else None."""
        return self._added.get(int(token_id))

    # -- internals ------------------------------------------------------------------------

    def _prefixed(self, text: str, parse_special: bool) -> str:
        """SentencePiece's dummy prefix: one space before any non-empty text, even text that
        starts with a space. Text that opens with an added token ("<|im_start|>") gets none,
        as in transformers; SentencePiece would put a lone "▁" token there."""
        if not self.prefix_space or not text:
            return text
        opening = self._added_text if parse_special else self._plain_added_text
        return text if opening and text.startswith(opening) else " " + text

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def _end_ids(self, extra: Iterable[int]) -> set[int]:
        ids = {int(i) for i in extra}
        if self.eos_id is not None:
            ids.add(self.eos_id)
        # By text, special or not: some files mark <end_of_turn> user-defined.
        for i, tok in self.backend.get_added_tokens_decoder().items():
            if tok.content in END_OF_TURN:
                ids.add(int(i))
        return ids


def _as_llama_tokenizer(backend: HFTokenizer, config: Mapping[str, Any]) -> None:
    """What transformers' LlamaTokenizer makes of a tokenizer.json, whatever the file's own
    normalizer says: no normalizer, and the SentencePiece space put in by Metaspace, in
    front of the first piece of text only unless the config says ``legacy`` (then in front
    of every piece), never if ``add_prefix_space`` is false. Phi-3 and Llama 2's files
    carry a Prepend normalizer that transformers replaces this way."""
    if json.loads(backend.to_str())["model"].get("type") != "BPE":
        return
    add_space = config.get("add_prefix_space")
    scheme = ("never" if add_space is False else
              "always" if config.get("legacy", False) else "first")
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme=scheme, split=False)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptModelError(f"{path}: not valid JSON ({e}).") from e
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _template_text(value: Any) -> str | None:
    """A chat_template entry is a string or a list of {"name", "template"}; take "default"."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default", next(iter(named.values()), None))
    return value if isinstance(value, str) else None


def _pair(backend: HFTokenizer, token: str | None) -> tuple[str, int] | None:
    tid = backend.token_to_id(token) if token else None
    return (token, tid) if tid is not None else None


def _stream_kind(decoder: dict | None) -> tuple[str, bool]:
    """Which incremental decoding a tokenizer.json's decoder allows, and whether it strips
    the SentencePiece leading space."""
    if not decoder:
        return "generic", False
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    names = [s.get("type") for s in steps]
    if "ByteLevel" in names:
        return "byte_level", False
    if "Metaspace" in names:
        meta = steps[names.index("Metaspace")]
        scheme = meta.get("prepend_scheme", "always" if meta.get("add_prefix_space") else "never")
        return "sentencepiece", scheme != "never"
    replaces_space = any(s.get("type") == "Replace" and s.get("content") == " " for s in steps)
    if "ByteFallback" in names and replaces_space:
        strip = any(s.get("type") == "Strip" and s.get("start", s.get("left", 0)) for s in steps)
        return "sentencepiece", strip
    return "generic", False


def _plain(value: Any) -> Any:
    """Metadata values as plain Python: readers may hand numpy arrays, scalars or bytes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Sequence) and not isinstance(value, str):  # lists, lazy arrays
        kinds = set(map(type, value))
        if kinds <= {int, float, bool}:
            return list(value)
        if kinds == {str} and _valid_utf8("".join(value)):  # a vocabulary: checked at once
            return list(value)
        return [_plain(v) for v in value]
    if isinstance(value, str) and not _valid_utf8(value):
        # invalid UTF-8 kept by the reader as surrogate escapes
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def _valid_utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (holds no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
