"""Incremental detokenization: ids in one at a time, text deltas out.

Decoding each new id on its own is wrong twice over: a character may be split across
byte-level tokens (an emoji is often 2-4 tokens), and SentencePiece tokens carry their
leading space as U+2581, which a whole-text decode drops only at the very start. So for
byte-level and SentencePiece vocabularies we map each id to the bytes it stands for and feed
them to an incremental UTF-8 decoder, which holds back an unfinished character until its
last byte arrives. Other decoders (WordPiece) fall back to re-decoding a short window.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol

from inference.tokenizer.gguf_vocab import byte_alphabet, byte_token_value


class DecodingTokenizer(Protocol):
    """What a :class:`StreamDecoder` reads of a tokenizer (``core.Tokenizer`` has it)."""

    kind: str
    strip_space: bool

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    def added_token(self, token_id: int) -> tuple[str, bool] | None: ...

_WINDOW = 32  # generic path: ids re-decoded per step before the window slides
_CONTEXT = 4  # ids kept as left context when it slides (WordPiece joins "##" pieces)


class StreamDecoder:
    """``add(id) -> str`` returns only complete characters; ``flush()`` returns the rest.

    The concatenated deltas equal ``tokenizer.decode(ids, skip_special_tokens=...)``.
    """

    def __init__(self, tokenizer: DecodingTokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending_space = tokenizer.strip_space  # drop one space before the first text
        self._cache: dict[int, bytes] = {}
        self._ids: list[int] = []  # generic path only
        self._ctx = 0
        self._seen = ""
        if tokenizer.kind == "byte_level":
            self._inverse = {c: b for b, c in byte_alphabet().items()}

    def add(self, token_id: int) -> str:
        """Text completed by this id (possibly empty)."""
        if self._tok.kind == "generic":
            return self._add_generic(int(token_id))
        data = self._cache.get(token_id)
        if data is None:
            data = self._cache[token_id] = self._bytes_of(int(token_id))
        if self._pending_space and data:
            self._pending_space = False
            if data[:1] == b" ":
                data = data[1:]
        return self._utf8.decode(data)

    def flush(self) -> str:
        """Whatever is held back (an unfinished character comes out as U+FFFD)."""
        if self._tok.kind == "generic":
            text = self._tok.decode(self._ids[self._ctx:], skip_special_tokens=self._skip)
            delta = text[len(self._seen):] if text.startswith(self._seen) else ""
            self._seen = text
            return delta
        return self._utf8.decode(b"", final=True)

    def _bytes_of(self, token_id: int) -> bytes:
        added = self._tok.added_token(token_id)
        if added is not None:
            content, special = added
            return b"" if special and self._skip else content.encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if self._tok.kind == "byte_level":
            inv = self._inverse
            return b"".join(bytes([inv[c]]) if c in inv else c.encode("utf-8") for c in piece)
        byte = byte_token_value(piece)
        if byte is not None:
            return bytes([byte])
        return piece.replace("\u2581", " ").encode("utf-8")

    def _add_generic(self, token_id: int) -> str:
        # Re-decode ids[ctx:] and emit what grew past the text already seen for that window.
        self._ids.append(token_id)
        text = self._tok.decode(self._ids[self._ctx:], skip_special_tokens=self._skip)
        if text.endswith("\ufffd"):
            return ""  # maybe half a character: wait for the next id
        delta = text[len(self._seen):] if text.startswith(self._seen) else ""
        self._seen = text
        if len(self._ids) - self._ctx > _WINDOW:
            self._ctx = len(self._ids) - _CONTEXT
            self._seen = self._tok.decode(self._ids[self._ctx:], skip_special_tokens=self._skip)
        return delta
