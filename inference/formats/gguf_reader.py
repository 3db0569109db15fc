"""The guarded GGUF reader: gguf-py's ``GGUFReader`` with metadata arrays read in one pass
and sanity checks against corrupt input (:mod:`.gguf_file` parses a header with it when no
cached parse of the file exists)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from inference.errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from inference.formats.strings import U64, StringArray

# Smallest encodings, used to reject counts that cannot fit in the file (a corrupt count
# would otherwise make the reader loop for a very long time before running off the end).
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
_ARRAY = int(GGUFValueType.ARRAY)
_STRING = int(GGUFValueType.STRING)
# A u64 in the file's byte order ("I": the host's, "S": swapped), as GGUFReader names them.


class _UnknownType(Exception):
    def __init__(self, tensor: str, type_id: int):
        super().__init__(tensor, type_id)
        self.tensor, self.type_id = tensor, type_id


class _Reader(GGUFReader):
    """GGUFReader with plain-ndarray views of its memory map and sanity guards.

    ``np.memmap`` slices cost a Python-level ``__array_finalize__`` each; the reader
    slices once per string of the vocabulary, so viewing the map as a plain ndarray
    (still memory-mapped, no copy) makes opening ~5x faster.
    """

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    def _build_fields(self, offs: int, count: int) -> int:
        if int(count) > (len(self._data) - offs) // _MIN_KV_BYTES:
            raise ValueError(f"metadata count {int(count)} does not fit in the file")
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int) -> Any:
        if int(count) > (len(self._data) - offs) // _MIN_TENSOR_INFO_BYTES:
            raise ValueError(f"tensor count {int(count)} does not fit in the file")
        return super()._build_tensor_info(offs, count)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
        if raw_type != _ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        length, item_type = int(alen[0]), int(raw_itype[0])
        if length > len(self._data) - orig_offs:
            raise ValueError(f"array length {length} does not fit in the file")
        offs = orig_offs + 12
        if item_type == _STRING:
            if self._nested:  # inside an array of arrays: the reader's parts, a string each
                size, strings = self._strings(offs, length)
                parts: list[Any] = [raw_itype, alen, *strings]
                data = list(range(2, 2 + length))
            else:  # one part, the array's bytes: decoded at first use (StringArray)
                size = self._extent(offs, length)
                parts, data = [raw_itype, alen, self._data[offs:offs + size]], [2]
            types = [GGUFValueType.ARRAY, GGUFValueType.STRING] if length else [
                GGUFValueType.ARRAY]
            return offs - orig_offs + size, parts, data if length else [], types
        nptype = self.gguf_scalar_to_np.get(GGUFValueType(item_type))
        if nptype is None:  # nested arrays: rare and short, the reader's own walk
            self._nested += 1
            try:
                return super()._get_field_parts(orig_offs, raw_type)
            finally:
                self._nested -= 1
        values = self._get(offs, nptype, length)
        if len(values) != length:
            raise ValueError(f"array of {length} values does not fit in the file")
        types = [GGUFValueType.ARRAY, GGUFValueType(item_type)] if length else [
            GGUFValueType.ARRAY]
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2] if length else [], types

    _nested = 0  # arrays of arrays being read

    def _extent(self, offs: int, count: int) -> int:
        """Bytes of ``count`` length-prefixed strings from ``offs`` (lengths checked)."""
        buf = memoryview(self._data)
        unpack = U64[self.byte_order].unpack_from
        end, pos = len(buf), offs
        for _ in range(count):
            if pos + 8 > end:
                raise ValueError("a string length does not fit in the file")
            pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            raise ValueError("a string does not fit in the file")
        return pos - offs

    def _strings(self, offs: int, count: int) -> tuple[int, list[memoryview]]:
        """``count`` length-prefixed strings from ``offs``: their bytes and memoryviews of them.

        One slice per string (the reader makes two NumPy views, ~60x slower); the views
        support ``tobytes`` and ``nbytes``, as the reader's parts do."""
        buf = memoryview(self._data)
        u64 = U64[self.byte_order]
        end, pos, out = len(buf), offs, []
        for _ in range(count):
            if pos + 8 > end:
                raise ValueError("a string length does not fit in the file")
            (n,) = u64.unpack_from(buf, pos)
            pos += 8
            if n > end - pos:
                raise ValueError(f"string length {n} does not fit in the file")
            out.append(buf[pos:pos + n])
            pos += n
        return pos - offs, out

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        for f in fields:
            raw_type = int(f.parts[4][0])
            if raw_type not in _GGML_IDS:
                raise _UnknownType(bytes(f.parts[1]).decode("utf-8", "replace"), raw_type)
        super()._build_tensors(start_offs, fields)


_GGML_IDS = frozenset(int(t) for t in GGMLQuantizationType)


def open_reader(path: str | Path) -> GGUFReader:
    """Open ``path`` with the guarded reader; typed errors for every way it can fail."""
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise CorruptModelError(f"{path} is not a file, so it cannot be read as GGUF.")
        raise ModelNotFoundError(f"Model file {path} does not exist.")
    try:
        return _Reader(path)
    except _UnknownType as e:
        raise UnsupportedModelError(
            f"{path}: tensor {e.tensor} has GGML type id {e.type_id}, which is unknown."
        ) from None
    except OSError as e:
        raise CorruptModelError(f"Cannot read {path}: {e.strerror or e}.") from None
    except (ValueError, IndexError, KeyError, OverflowError, TypeError, UnicodeDecodeError,
            MemoryError) as e:
        raise CorruptModelError(f"{path} is not a valid GGUF file ({describe_error(e)}).") from None



def field_value(f: Any) -> Any:
    """A metadata field as plain Python (arrays of numbers: read-only ndarrays)."""
    types = f.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        if len(types) == 1:  # empty array: no element type recorded
            return []
        if types[-1] == GGUFValueType.STRING:
            blob = f.parts[f.data[0]]
            if isinstance(blob, np.ndarray):  # the array's bytes (_Reader), after its length
                alen = f.parts[f.data[0] - 1]
                return StringArray(blob.tobytes(), int(alen[0]), not alen.dtype.isnative)
            return [str(f.parts[i], "utf-8", "surrogateescape") for i in f.data]
        if types[-1] == GGUFValueType.ARRAY:  # nested arrays: rare, keep the reader's view
            return f.contents()
        if not f.data:
            return np.empty(0, dtype=f.parts[-1].dtype)
        values = np.concatenate([f.parts[i] for i in f.data]).astype(
            f.parts[f.data[0]].dtype.newbyteorder("="))
        values.flags.writeable = False  # shared by every read of the cached header
        return values
    if types[0] == GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode("utf-8", "surrogateescape")
    return f.parts[-1].tolist()[0]


def describe_error(e: Exception) -> str:
    """The reader's exception as a short reason; NumPy's own messages mean "ran off the end"."""
    msg = str(e).strip().rstrip(".")
    if "magic" in msg:
        return "bad magic; it is not a GGUF file"
    version = re.search(r"version (\d+)", msg)
    if version:
        return f"GGUF version {version.group(1)} is not supported"
    if "does not fit" in msg:
        return f"it is truncated or corrupt: {msg}"
    if (isinstance(e, IndexError) or "reshape" in msg or "dtype" in msg
            or "empty file" in msg):
        return "it is truncated"
    return msg or type(e).__name__
