"""A GGUF array of strings kept as the file's bytes (:class:`StringArray`), in a module of
its own: a parsed header kept on disk holds them, and reading it back imports this module
only, not gguf-py's reader (~20 ms of imports a process's load needs nothing else of)."""

from __future__ import annotations

import struct
import sys
from collections import UserList
from typing import Any

# A GGUF length (uint64): "I" in the machine's order, "S" in the other (a swapped file).
U64 = {"I": struct.Struct("=Q"), "S": struct.Struct("<Q" if sys.byteorder == "big" else ">Q")}


class StringArray(UserList):
    """A GGUF array of strings (the vocabulary's tokens, its merges), kept as the file's
    bytes and decoded to ``str`` (invalid UTF-8 kept with ``surrogateescape``) the first
    time an item is read: reading a header, listing a model or loading one whose tokenizer
    is cached never decodes its 128k-400k strings, and the header pickles as one bytes
    object. ``len`` needs no decoding. Behaves as the list it decodes to (slices,
    ``+`` and copies are plain lists)."""

    def __init__(self, blob: bytes, count: int, swapped: bool = False) -> None:
        self._blob, self._count, self._swapped = blob, count, swapped
        self._items: list[str] | None = None

    @property  # type: ignore[override]
    def data(self) -> list[str]:
        if self._items is None:
            self._items = _decode_strings(self._blob, self._count, self._swapped)
        return self._items

    @data.setter
    def data(self, value: list[str]) -> None:
        self._items = list(value)

    def __len__(self) -> int:
        return self._count if self._items is None else len(self._items)

    def __getitem__(self, i: Any) -> Any:
        return self.data[i]

    def __add__(self, other: Any) -> list[str]:
        return self.data + list(other)

    def __radd__(self, other: Any) -> list[str]:
        return list(other) + self.data

    def __mul__(self, n: int) -> list[str]:
        return self.data * n

    __rmul__ = __mul__

    def copy(self) -> list[str]:
        return list(self.data)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._items is not None and len(self._items) != self._count:  # changed: as a list
            return (list, (self._items,))
        return (StringArray, (self._blob, self._count, self._swapped))


def _decode_strings(blob: bytes, count: int, swapped: bool) -> list[str]:
    u64 = U64["S" if swapped else "I"].unpack_from
    out, pos = [], 0
    for _ in range(count):
        (n,) = u64(blob, pos)
        out.append(str(blob[pos + 8:pos + 8 + n], "utf-8", "surrogateescape"))
        pos += 8 + n
    return out
