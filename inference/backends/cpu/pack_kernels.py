"""GGUF blocks written straight into lane blocks (:mod:`.layout`): the packing of
:func:`.pack._pack_shared` for every GGML type :mod:`.pack` packs, one pass over the file's
bytes with no temporaries.

The bytes are those of :func:`.pack._pack` (NumPy, the reference the tests compare with):
codes in the nibble / high-bit planes of their width, then the scale row of the type's kind
(``SYMMETRIC_F16``: ``d``'s bits in the block's own super row; ``AFFINE_F16``: float16
``d`` then ``m``, the file's bits;
``SUPER6``: the 6-bit scale and min as bytes, and in the super-block's super row its ``d``
and ``dmin`` bits; ``SUB16``: the two int8 scales, and ``d``'s bits in the super row).
Rows past the tensor's end, up to a whole tile, hold zero codes and scales (Q6_K: code 32,
its zero).
"""

from __future__ import annotations

import numpy as np

from inference.backends.cpu.ir import _jit
from inference.backends.cpu.layout import GROUP, LANES, SUPER_GROUPS, super_row

# The kernels' type codes.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K = range(8)
TYPE_CODES = {"Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0, "Q5_1": Q5_1, "Q8_0": Q8_0,
              "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K}
_BLOCK_BYTES = (18, 20, 22, 24, 34, 144, 176, 210)  # a GGML block of each, in the file
_BITS = (4, 4, 5, 5, 8, 4, 5, 6)


@_jit(inline="always")
def _u16(raw: np.ndarray, row: int, at: int) -> np.uint16:
    return np.uint16(raw[row, at]) | (np.uint16(raw[row, at + 1]) << np.uint16(8))


@_jit(inline="always")
def _plane_byte(m: np.uint32, i: int) -> np.uint8:
    """Byte ``i`` of a plane of high bits from ``m`` (bit j: code j's): bit p is code
    ``first + 2p``'s, ``first`` 0 / 1 / 16 / 17 (every second bit, gathered)."""
    x = (m >> np.uint32(16 * (i >> 1) + (i & 1))) & np.uint32(0x5555)
    x = (x | (x >> np.uint32(1))) & np.uint32(0x3333)
    x = (x | (x >> np.uint32(2))) & np.uint32(0x0F0F)
    x = (x | (x >> np.uint32(4))) & np.uint32(0x00FF)
    return np.uint8(x)


@_jit(inline="always")
def _put_codes(out8: np.ndarray, blk: int, lane: int, q: np.ndarray, bits: int,
               m4: np.uint32, m5: np.uint32) -> None:
    """The 32 codes of one lane of block ``blk``: ``q`` one byte each (8-bit), else their
    low 4 bits in ``q`` as 16 nibble bytes (code j low, j + 16 high), then for 5 and 6 bits
    the planes of bit 4 (``m4``: bit j is code j's) and bit 5 (``m5``)."""
    if bits == 8:
        for j in range(GROUP):
            out8[blk, j, lane] = q[j]
        return
    for j in range(16):
        out8[blk, j, lane] = q[j] | (q[j + 16] << np.uint8(4))
    if bits >= 5:
        for i in range(4):
            out8[blk, 16 + i, lane] = _plane_byte(m4, i)
    if bits == 6:
        for i in range(4):
            out8[blk, 20 + i, lane] = _plane_byte(m5, i)


@_jit(inline="always")
def _group_codes(raw: np.ndarray, row: int, t: int, g: int, q: np.ndarray
                 ) -> tuple[np.uint32, np.uint32]:
    """The 32 codes of group ``g`` of a row of type ``t`` as :func:`_put_codes` takes them:
    ``q`` (low 4 bits; Q8_0: its int8 bytes), and the masks of bits 4 and 5 (Q6_K's
    unsigned ``q`` standing for ``q - 32``)."""
    m4 = np.uint32(0)
    m5 = np.uint32(0)
    if t <= Q5_1:  # one GGML block a group: d[, m][, qh], 16 bytes of nibbles
        base = g * _BLOCK_BYTES[t]
        qs = base + (2, 4, 6, 8)[t]
        for j in range(16):
            b = raw[row, qs + j]
            q[j] = b & np.uint8(15)
            q[j + 16] = b >> np.uint8(4)
        if t == Q5_0 or t == Q5_1:  # qh: bit j is code j's bit 4
            h = base + (2 if t == Q5_0 else 4)
            m4 = (np.uint32(raw[row, h]) | (np.uint32(raw[row, h + 1]) << np.uint32(8))
                  | (np.uint32(raw[row, h + 2]) << np.uint32(16))
                  | (np.uint32(raw[row, h + 3]) << np.uint32(24)))
    elif t == Q8_0:
        base = g * 34 + 2
        for j in range(GROUP):
            q[j] = raw[row, base + j]
    elif t == Q4_K or t == Q5_K:
        sub = g % SUPER_GROUPS
        base = (g // SUPER_GROUPS) * _BLOCK_BYTES[t]
        qs = base + (16 if t == Q4_K else 48) + 32 * (sub >> 1)
        shift = np.uint8(4 * (sub & 1))
        for j in range(GROUP):
            q[j] = (raw[row, qs + j] >> shift) & np.uint8(15)
        if t == Q5_K:  # qh[j] bit ``sub``: code j's bit 4
            for j in range(GROUP):
                m4 |= np.uint32((raw[row, base + 16 + j] >> np.uint8(sub)) & np.uint8(1)
                                ) << np.uint32(j)
    else:  # Q6_K: per half h of 128, ql[64h + r % 64] nibble r // 64, qh[32h + r % 32] bits
        sub = g % SUPER_GROUPS
        base = (g // SUPER_GROUPS) * 210
        h, s4 = sub >> 2, sub & 3
        ql = base + 64 * h + 32 * (s4 & 1)
        qh = base + 128 + 32 * h
        shift = np.uint8(4 * (s4 >> 1))
        hs = np.uint8(2 * s4)
        for j in range(GROUP):
            q[j] = (raw[row, ql + j] >> shift) & np.uint8(15)
            two = np.uint32(raw[row, qh + j] >> hs)
            m4 |= (two & np.uint32(1)) << np.uint32(j)
            m5 |= ((two >> np.uint32(1)) & np.uint32(1)) << np.uint32(j)
    return m4, m5


@_jit(inline="always")
def _group_scales(raw: np.ndarray, row: int, t: int, g: int, out8: np.ndarray,
                  out16: np.ndarray, blk: int, lane: int, c: int) -> None:
    """Row ``c`` (the scale row) of block ``blk`` for one lane, from group ``g`` of a row;
    K-quants: byte rows ``4c``, ``4c + 1`` and the block's super row (in ``out16``)."""
    if t == Q4_0 or t == Q5_0 or t == Q8_0:
        out16[blk, 0, lane] = _u16(raw, row, g * _BLOCK_BYTES[t])
    elif t == Q4_1 or t == Q5_1:
        base = g * _BLOCK_BYTES[t]
        out16[blk, c, lane] = _u16(raw, row, base)
        out16[blk, c, LANES + lane] = _u16(raw, row, base + 2)
    elif t == Q4_K or t == Q5_K:  # get_scale_min_k4 over the 12 bytes after d, dmin
        sub = g % SUPER_GROUPS
        base = (g // SUPER_GROUPS) * _BLOCK_BYTES[t]
        s = base + 4
        if sub < 4:
            sc = raw[row, s + sub] & np.uint8(63)
            mn = raw[row, s + sub + 4] & np.uint8(63)
        else:
            sc = (raw[row, s + sub + 4] & np.uint8(15)) | ((raw[row, s + sub - 4] >> np.uint8(6))
                                                          << np.uint8(4))
            mn = (raw[row, s + sub + 4] >> np.uint8(4)) | ((raw[row, s + sub] >> np.uint8(6))
                                                         << np.uint8(4))
        out8[blk, 4 * c, lane] = sc
        out8[blk, 4 * c + 1, lane] = mn
        if sub == 0:
            out16[super_row(blk), 0, lane] = _u16(raw, row, base)  # d
            out16[super_row(blk), 0, LANES + lane] = _u16(raw, row, base + 2)  # dmin
    else:  # Q6_K: int8 scales of codes 0-15 and 16-31, then d
        sub = g % SUPER_GROUPS
        base = (g // SUPER_GROUPS) * 210
        out8[blk, 4 * c, lane] = raw[row, base + 192 + 2 * sub]
        out8[blk, 4 * c + 1, lane] = raw[row, base + 193 + 2 * sub]
        if sub == 0:
            out16[super_row(blk), 0, lane] = _u16(raw, row, base + 208)


@_jit(inline="always")
def _zero_scales(t: int, out8: np.ndarray, out16: np.ndarray, blk: int,
                 lane: int, c: int) -> None:
    """The bytes of one lane's scale row that :func:`_group_scales` writes, as zeros."""
    if t == Q4_0 or t == Q5_0 or t == Q8_0:
        out16[blk, 0, lane] = np.uint16(0)
    elif t == Q4_1 or t == Q5_1:
        out16[blk, c, lane] = np.uint16(0)
        out16[blk, c, LANES + lane] = np.uint16(0)
    else:
        out8[blk, 4 * c, lane] = np.uint8(0)
        out8[blk, 4 * c + 1, lane] = np.uint8(0)
        if (blk & (SUPER_GROUPS - 1)) == 0:
            out16[super_row(blk), 0, lane] = np.uint16(0)
            if t != Q6_K:
                out16[super_row(blk), 0, LANES + lane] = np.uint16(0)


@_jit(inline="always")
def _pack_rows(raw: np.ndarray, t: int, out8: np.ndarray, blocks: np.ndarray, row0: int
               ) -> None:
    """:func:`pack_rows` for type code ``t`` (a constant where it is inlined)."""
    rows = raw.shape[0]
    bits = _BITS[t]
    c = bits  # the scale row
    out16 = blocks.view(np.uint16)
    groups = raw.shape[1] // _BLOCK_BYTES[t] * (SUPER_GROUPS if t >= Q4_K else 1)
    q = np.empty(GROUP, np.uint8)
    for r in range(rows + (-rows) % LANES):
        tile, lane = (row0 + r) // LANES, (row0 + r) % LANES
        b0 = tile * groups
        if r < rows:
            for g in range(groups):
                m4, m5 = _group_codes(raw, r, t, g, q)
                _put_codes(out8, b0 + g, lane, q, bits, m4, m5)
                _group_scales(raw, r, t, g, out8, out16, b0 + g, lane, c)
        else:
            q[:] = np.uint8(0)
            m5 = np.uint32(0xFFFFFFFF if t == Q6_K else 0)  # Q6_K: code 32, its zero
            for g in range(groups):
                _put_codes(out8, b0 + g, lane, q, bits, np.uint32(0), m5)
                _zero_scales(t, out8, out16, b0 + g, lane, c)


# One kernel a type: its code a constant, the branches on it folded away.
@_jit
def _q4_0(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q4_0, out8, blocks, row0)


@_jit
def _q4_1(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q4_1, out8, blocks, row0)


@_jit
def _q5_0(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q5_0, out8, blocks, row0)


@_jit
def _q5_1(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q5_1, out8, blocks, row0)


@_jit
def _q8_0(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q8_0, out8, blocks, row0)


@_jit
def _q4_k(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q4_K, out8, blocks, row0)


@_jit
def _q5_k(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q5_K, out8, blocks, row0)


@_jit
def _q6_k(raw: np.ndarray, out8: np.ndarray, blocks: np.ndarray, row0: int) -> None:
    _pack_rows(raw, Q6_K, out8, blocks, row0)


_BY_CODE = (_q4_0, _q4_1, _q5_0, _q5_1, _q8_0, _q4_k, _q5_k, _q6_k)


def pack_rows(raw: np.ndarray, t: int, out8: np.ndarray, blocks: np.ndarray, row0: int
              ) -> None:
    """Rows ``row0 .. row0 + len(raw)`` of a tensor of type code ``t`` (``raw``: their file
    bytes, (rows, bytes a row) uint8) into the whole tensor's lane blocks: ``out8`` their
    bytes (tiles * groups, rows of LANES bytes, LANES) uint8 and ``blocks`` the float32
    array the kernels read scales from (:class:`.pack.PackedWeight`'s ``codes`` as uint8
    and ``blocks``); ``row0`` a multiple of LANES. The tile holding the last row is
    completed with padding rows. Releases the GIL.

    ``raw`` is taken read-only whatever it is (a model file's map is): one compiled
    signature a type, the one the install's warm-up compiles."""
    if raw.flags.writeable:
        raw = raw.view()
        raw.flags.writeable = False
    _BY_CODE[t](raw, out8, blocks, row0)
