"""Tokenize with a length limit, in bounded pieces, so memory follows the limit, not the text.

Encoding 18 MB of text in one call costs ~2.5 GB (per-character offsets and alignments);
a model reads at most its context anyway. Text longer than :data:`PIECE_CHARS` is counted
piece by piece (pieces end just before a space that follows a non-space, which every
pre-tokenizer we use treats as a boundary), and counting stops once the limit is passed.
Text within the limit is then encoded whole, so its ids are exactly what one call gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

PIECE_CHARS = 1 << 16
# A token spans at most this many characters, except an overlong word read as one unknown
# token; a prefix this long per token is kept when truncating, whatever it holds.
MAX_CHARS_PER_TOKEN = 128


def _pieces(text: str, size: int) -> Iterator[tuple[int, int]]:
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + 1, end)
            while cut > start and text[cut - 1].isspace():
                cut = text.rfind(" ", start + 1, cut - 1)
            end = cut if cut > start else end
        yield start, end
        start = end


def encode_bounded(tokenizer: Any, text: str, limit: int, *, add_special_tokens: bool = True,
                   parse_special: bool = True, after: int | None = None
                   ) -> tuple[list[int], bool]:
    """``(ids, complete)``: the ids of ``text`` if it holds at most ``limit`` tokens
    (``complete`` True), else the ids of a prefix holding more than ``limit`` tokens
    (``complete`` False; callers truncate or refuse). Memory is bounded by ``limit``.
    ``after``: the id of the token just before ``text`` when it continues a prompt
    (:meth:`Tokenizer.encode`)."""
    extra = {} if after is None else {"after": after}

    def enc(s: str, special: bool) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=special, parse_special=parse_special,
                                **extra)

    if len(text) <= PIECE_CHARS:
        return enc(text, add_special_tokens), True
    count = 0
    cap = (limit + 1) * MAX_CHARS_PER_TOKEN + PIECE_CHARS
    for start, end in _pieces(text, PIECE_CHARS):
        count += len(enc(text[start:end], False))
        if count > limit or end >= cap:
            return enc(text[:min(end, cap)], add_special_tokens), False
    return enc(text, add_special_tokens), True


def encode_segments(tokenizer: Any, segments: Iterable[tuple[str, bool]], limit: int
                    ) -> tuple[list[int], bool]:
    """Ids of a prompt given as ``(text, is_content)`` pieces in order (a rendered chat):
    markup is parsed for special tokens, content is not, so "<|im_end|>" typed by a user
    stays text and cannot forge a turn. Each piece continues the one before it, so the
    tokenizer puts its dummy space only where tokenizing the whole text would. ``complete``
    as :func:`encode_bounded`."""
    ids: list[int] = []
    for text, is_content in segments:
        piece, complete = encode_bounded(tokenizer, text, limit - len(ids),
                                         add_special_tokens=False, parse_special=not is_content,
                                         after=ids[-1] if ids else None)
        ids += piece
        if not complete or len(ids) > limit:
            return ids, False
    return ids, True
