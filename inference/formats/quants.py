"""GGML block types in one table, and NumPy dequantization of raw rows.

Every quantized GGML type stores a row of ``n`` weights as ``n / block_size`` blocks of
``type_size`` bytes. :data:`BLOCK_TYPES` describes each block (byte layout included) so
backends and kernels read their constants from one place; the ``_dequant_*`` functions
turn raw ``uint8`` blocks into float32 with llama.cpp's arithmetic, operation for
operation, so the results equal ``gguf.quants.dequantize`` bit for bit (the tests use it
as the oracle). BF16 has no NumPy dtype, so BF16 tensors travel as raw bytes like a
block type with one element per block.

MLX affine quantization (``qtype == "MLX"``) is handled by :func:`dequantize_mlx`: the
weight is a little-endian bit stream of ``bits``-bit codes packed in uint32 words
(a code may straddle two words for 3, 5 and 6 bits), and ``w = scale * q + bias`` per
group of ``group_size`` consecutive elements of a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from inference.errors import UnsupportedModelError
from inference.formats.tensor import TensorData

QK_K = 256  # elements per K-quant super-block


@dataclass(frozen=True)
class BlockType:
    """One GGML storage type.

    ``sub_block`` is how many consecutive elements share one scale (the unit a kernel
    dequantizes at once); ``affine`` says whether blocks carry a minimum/offset
    (``w = d*q - m``) or are symmetric (``w = d*q``). ``layout`` maps each field of a
    block to ``(byte offset, byte length)``; fields named ``d``/``dmin`` are float16.
    """

    name: str
    ggml_id: int
    block_size: int
    type_size: int
    bits: int  # bits per stored code (16/32 for float types)
    sub_block: int
    affine: bool
    layout: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size

    @property
    def is_float(self) -> bool:
        return self.name in ("F32", "F16", "BF16")

    def row_bytes(self, n: int) -> int:
        """Bytes one row of ``n`` elements takes; ``n`` must be a whole number of blocks."""
        if n % self.block_size:
            raise ValueError(f"{self.name} rows must hold a multiple of {self.block_size} "
                             f"elements, not {n}")
        return n // self.block_size * self.type_size


def _bt(name: str, ggml_id: int, block: int, bits: int, sub: int, affine: bool,
        layout: dict[str, tuple[int, int]]) -> BlockType:
    size = max(off + n for off, n in layout.values())
    return BlockType(name, ggml_id, block, size, bits, sub, affine, layout)


# Byte layouts follow ggml-common.h (block_q4_0 ... block_q6_K).
BLOCK_TYPES: dict[str, BlockType] = {
    "F32": _bt("F32", 0, 1, 32, 1, False, {"value": (0, 4)}),
    "F16": _bt("F16", 1, 1, 16, 1, False, {"value": (0, 2)}),
    "BF16": _bt("BF16", 30, 1, 16, 1, False, {"value": (0, 2)}),
    "Q4_0": _bt("Q4_0", 2, 32, 4, 32, False, {"d": (0, 2), "qs": (2, 16)}),
    "Q4_1": _bt("Q4_1", 3, 32, 4, 32, True, {"d": (0, 2), "m": (2, 2), "qs": (4, 16)}),
    "Q5_0": _bt("Q5_0", 6, 32, 5, 32, False, {"d": (0, 2), "qh": (2, 4), "qs": (6, 16)}),
    "Q5_1": _bt("Q5_1", 7, 32, 5, 32, True,
                {"d": (0, 2), "m": (2, 2), "qh": (4, 4), "qs": (8, 16)}),
    "Q8_0": _bt("Q8_0", 8, 32, 8, 32, False, {"d": (0, 2), "qs": (2, 32)}),
    "Q2_K": _bt("Q2_K", 10, QK_K, 2, 16, True,
                {"scales": (0, 16), "qs": (16, 64), "d": (80, 2), "dmin": (82, 2)}),
    "Q3_K": _bt("Q3_K", 11, QK_K, 3, 16, False,
                {"hmask": (0, 32), "qs": (32, 64), "scales": (96, 12), "d": (108, 2)}),
    "Q4_K": _bt("Q4_K", 12, QK_K, 4, 32, True,
                {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qs": (16, 128)}),
    "Q5_K": _bt("Q5_K", 13, QK_K, 5, 32, True,
                {"d": (0, 2), "dmin": (2, 2), "scales": (4, 12), "qh": (16, 32),
                 "qs": (48, 128)}),
    "Q6_K": _bt("Q6_K", 14, QK_K, 6, 16, False,
                {"ql": (0, 128), "qh": (128, 64), "scales": (192, 16), "d": (208, 2)}),
}

# The bit widths and group sizes MLX affine quantization accepts.
MLX_BITS = (1, 2, 3, 4, 5, 6, 8)
MLX_GROUP_SIZES = (32, 64, 128)


def block_type(qtype: str) -> BlockType:
    """The table entry for ``qtype``; :class:`UnsupportedModelError` if there is none."""
    try:
        return BLOCK_TYPES[qtype]
    except KeyError:
        raise UnsupportedModelError(
            f"Tensor type {qtype} is not supported (supported: {', '.join(BLOCK_TYPES)})."
        ) from None


# --- per-type kernels: blocks (n, type_size) uint8 -> out (n, block_size) float32 ---------
# Each repeats llama.cpp's order of float32 operations (e.g. (d*sc)*q - dmin*m), because
# float multiplication is not associative and the oracle compares bit for bit.

def _f16(b: np.ndarray, off: int) -> np.ndarray:
    """The float16 field at byte ``off`` of each block, as a (n, 1) float32 column."""
    return b[:, off:off + 2].copy().view(np.float16).astype(np.float32)


_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) codes: low nibbles are elements 0-15, high 16-31."""
    return ((qs[:, None, :] >> _NIBBLE_SHIFTS) & 0x0F).reshape(len(qs), 32)


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: a little-endian uint32 holding bit 4 of each of the 32 codes -> (n, 32)."""
    bits = np.unpackbits(qh, axis=1, bitorder="little")
    return bits << np.uint8(4)


def _dequant_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _nibbles(b[:, 2:18]).view(np.int8) - np.int8(8)
    np.multiply(_f16(b, 0), q, out=out)


def _dequant_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_f16(b, 0), _nibbles(b[:, 4:20]), out=out)
    out += _f16(b, 2)


def _dequant_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = (_nibbles(b[:, 6:22]) | _high_bits32(b[:, 2:6])).view(np.int8) - np.int8(16)
    np.multiply(_f16(b, 0), q, out=out)


def _dequant_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_f16(b, 0), _nibbles(b[:, 8:24]) | _high_bits32(b[:, 4:8]), out=out)
    out += _f16(b, 2)


def _dequant_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b[:, 2:34].view(np.int8), _f16(b, 0), out=out)


def _dequant_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    sc = b[:, 0:16]
    dl = (_f16(b, 80) * (sc & 0x0F)).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4)).reshape(n, 16, 1)
    # 64 bytes = 2 halves x 32 bytes; shift s of byte l is element half*128 + s*32 + l.
    q = (b[:, 16:80].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    o = out.reshape(n, 16, 16)
    np.multiply(dl, q.reshape(n, 16, 16), out=o)
    o -= ml


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """12 bytes -> 16 signed 6-bit scales: low 4 bits from bytes 0-7, high 2 from 8-11."""
    n = len(s)
    lo = (s[:, None, 0:8] >> _NIBBLE_SHIFTS).reshape(n, 16) & 0x0F
    hi = (s[:, None, 8:12] >> _CRUMB_SHIFTS.reshape(1, 4, 1)).reshape(n, 16) & 0x03
    return (lo | (hi << np.uint8(4))).view(np.int8) - np.int8(32)


def _dequant_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    dl = (_f16(b, 108) * _q3_k_scales(b[:, 96:108])).reshape(n, 16, 1)
    low = (b[:, 32:96].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    # Bit j of hmask byte l belongs to element j*32 + l; a clear bit means "subtract 4".
    high = (b[:, None, 0:32] >> _BIT_SHIFTS.reshape(1, 8, 1)) & 1
    q = low.reshape(n, 8, 32).view(np.int8) - ((high ^ 1) << np.uint8(2)).view(np.int8)
    np.multiply(dl, q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (get_scale_min_k4)."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _k_sub_block_affine(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: per 32-element sub-block scale d*sc and offset dmin*m, shaped (n, 8, 1)."""
    n = len(b)
    sc, mn = _k_scale_min(b[:, 4:16])
    return (_f16(b, 0) * sc).reshape(n, 8, 1), (_f16(b, 2) * mn).reshape(n, 8, 1)


def _dequant_q4_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    dl, ml = _k_sub_block_affine(b)
    # 4 chunks of 32 bytes; low nibbles are sub-block 2c, high nibbles sub-block 2c+1.
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & 0x0F
    o = out.reshape(n, 8, 32)
    np.multiply(dl, q.reshape(n, 8, 32), out=o)
    o -= ml


def _dequant_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    dl, ml = _k_sub_block_affine(b)
    low = (b[:, 48:176].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & 0x0F
    high = (b[:, None, 16:48] >> _BIT_SHIFTS.reshape(1, 8, 1)) & 1  # bit j -> sub-block j
    q = low.reshape(n, 8, 32) | (high << np.uint8(4))
    o = out.reshape(n, 8, 32)
    np.multiply(dl, q, out=o)
    o -= ml


def q6_k_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K blocks -> codes q - 32 (n, 256) int8, scales (n, 16) int8, d (n, 1) float32:
    ``w = (d * scale[e // 16]) * q[e]``."""
    n = len(b)
    # Per 128-element half h: ql[h*64 + r%64] nibble r//64, qh[h*32 + r%32] bits 2*(r//32).
    low = (b[:, 0:128].reshape(n, 2, 1, 64) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & 0x0F
    high = (b[:, 128:192].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(n, 8, 32) | (high.reshape(n, 8, 32) << np.uint8(4))).view(np.int8)
    return (q - np.int8(32)).reshape(n, 256), b[:, 192:208].view(np.int8), _f16(b, 208)


def _dequant_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    q, sc, d = q6_k_fields(b)
    dl = (d * sc).reshape(n, 16, 1)
    np.multiply(dl, q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "Q4_0": _dequant_q4_0, "Q4_1": _dequant_q4_1, "Q5_0": _dequant_q5_0,
    "Q5_1": _dequant_q5_1, "Q8_0": _dequant_q8_0, "Q2_K": _dequant_q2_k,
    "Q3_K": _dequant_q3_k, "Q4_K": _dequant_q4_k, "Q5_K": _dequant_q5_k,
    "Q6_K": _dequant_q6_k,
}

# Blocks handled per step: ~128K output elements (512 KB) keeps temporaries in cache.
_CHUNK_ELEMENTS = 1 << 17


def dequantize_raw(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Raw rows ``(..., bytes_per_row)`` of GGML type ``qtype`` -> float32 ``(..., n)``.

    F32/F16 may also come as float32/float16 arrays of the logical shape (as GGUFReader
    gives them); BF16 as uint8 bytes or uint16 bit patterns.
    """
    bt = block_type(qtype)
    if qtype == "F32" and raw.dtype == np.float32:
        return np.asarray(raw)
    if qtype == "F16" and raw.dtype == np.float16:
        return raw.astype(np.float32)
    if qtype == "BF16" and raw.dtype == np.uint16:
        raw = raw.view(np.uint8) if raw.ndim else raw.reshape(1).view(np.uint8)
    raw = np.ascontiguousarray(raw).view(np.uint8)
    if raw.shape[-1] % bt.type_size:
        raise ValueError(f"{qtype} rows must be a whole number of {bt.type_size}-byte blocks, "
                         f"not {raw.shape[-1]} bytes")
    out_shape = (*raw.shape[:-1], raw.shape[-1] // bt.type_size * bt.block_size)
    if qtype == "F32":
        return raw.view(np.float32).reshape(out_shape)
    if qtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(out_shape)
    if qtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(out_shape)

    blocks = raw.reshape(-1, bt.type_size)
    out = np.empty((len(blocks), bt.block_size), dtype=np.float32)
    kernel = _KERNELS[qtype]
    step = max(1, _CHUNK_ELEMENTS // bt.block_size)
    for start in range(0, len(blocks), step):
        kernel(blocks[start:start + step], out[start:start + step])
    return out.reshape(out_shape)


def unpack_mlx(w: np.ndarray, bits: int) -> np.ndarray:
    """MLX packed uint32 rows ``(..., k*bits/32)`` -> uint8 codes ``(..., k)``.

    The words form one little-endian bit stream per row; 8 codes take exactly ``bits``
    bytes, so each group of ``bits`` bytes is widened to a uint64 and shifted apart.
    """
    if bits not in MLX_BITS:
        raise ValueError(f"MLX quantization with {bits} bits is not supported")
    b = np.ascontiguousarray(w).astype("<u4", copy=False).view(np.uint8)
    lead, nbytes = b.shape[:-1], b.shape[-1]
    if bits == 8:
        return b
    if bits in (1, 2, 4):  # codes never straddle a byte
        per = 8 // bits
        shifts = (np.arange(per, dtype=np.uint8) * bits).reshape(*([1] * b.ndim), per)
        q = (b[..., None] >> shifts) & np.uint8((1 << bits) - 1)
        return q.reshape(*lead, nbytes * per)
    g = b.reshape(*lead, nbytes // bits, bits).astype(np.uint64)
    word = np.zeros(g.shape[:-1], dtype=np.uint64)
    for k in range(bits):
        word |= g[..., k] << np.uint64(8 * k)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))
    q = (word[..., None] >> shifts) & np.uint64((1 << bits) - 1)
    return q.astype(np.uint8).reshape(*lead, nbytes // bits * 8)


def dequantize_mlx(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int,
                   bits: int) -> np.ndarray:
    """MLX affine-quantized weight -> float32: ``scale * q + bias`` per group, in float32."""
    q = unpack_mlx(w, bits)
    s = np.asarray(scales, dtype=np.float32)
    z = np.asarray(biases, dtype=np.float32)
    n = q.shape[-1]
    if n % group_size or s.shape[-1] * group_size != n or z.shape != s.shape:
        raise ValueError(f"MLX scales/biases {s.shape} do not match {n} elements per row "
                         f"in groups of {group_size}")
    grouped = q.reshape(*q.shape[:-1], n // group_size, group_size)
    out = np.multiply(s[..., None], grouped, dtype=np.float32)
    out += z[..., None]
    return out.reshape(q.shape)


def dequantize(t: TensorData) -> np.ndarray:
    """A tensor as float32 with its logical shape (GGML block types, floats, or "MLX")."""
    if t.qtype == "MLX":
        x = t.extra
        out = dequantize_mlx(t.data, x["scales"], x["biases"], int(x["group_size"]),
                             int(x["bits"]))
    else:
        if t.qtype not in BLOCK_TYPES:
            raise UnsupportedModelError(
                f"Tensor {t.name} has type {t.qtype}, which this engine cannot dequantize."
            )
        out = dequantize_raw(t.data, t.qtype)
    return out.reshape(t.shape)
