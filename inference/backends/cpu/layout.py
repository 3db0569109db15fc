"""The lane-block layout of packed weights (made by :mod:`.pack`).

Output rows are grouped in tiles of ``LANES`` rows and the input dimension in groups of
``GROUP``; one block holds one (tile, group) pair as a float32 array ``(R, LANES)``:

- rows ``0 .. C-1`` are the codes as bytes, viewed as ``codes[blk, j, lane]``: 4-bit
  (C=4): byte ``j`` holds code ``j`` in its low and code ``j + 16`` in its high nibble,
  as in GGML's Q4_0/Q4_1; 5-bit (C=5): the same 16 nibble bytes for bits 0-3, then the
  plane of bit 4 in bytes 16-19: bit ``p`` of byte 16 / 17 / 18 / 19 belongs to code
  ``2p`` / ``2p+1`` / ``2p+16`` / ``2p+17`` (Q5_0, Q5_1, Q5_K: as small as the file's
  ``qh``); 6-bit (C=6, Q6_K): the 5-bit layout's 20 bytes, then the plane of bit 5 in
  bytes 20-23 in the same arrangement (bit ``p`` of byte 20 / 21 / 22 / 23: code ``2p`` /
  ``2p+1`` / ``2p+16`` / ``2p+17``), the codes unsigned ``q`` (0..63) standing for
  ``q - 32``: 6 bits a weight, as the file's ``ql`` and ``qh``; 8-bit (C=8): one code
  per byte (int8 for Q8_0);
- then the scale and bias of each lane, ``w = scale * code + bias``, in one of three
  layouts (``kind``): ``SYMMETRIC`` row ``C`` holds float32 scales and
  ``bias = -zero * scale``; ``AFFINE`` rows ``C`` and ``C + 1`` hold float32 scales and
  biases; ``AFFINE_F16`` row ``C`` holds float16 scales then float16 biases, for types
  whose file stores them so (Q4_1, MLX with float16 scales): one row fewer, so a Q4_1
  block is as large as in the file; ``SUB16`` (Q6_K, 6-bit codes standing for ``q - 32``)
  byte rows ``4C`` and ``4C + 1`` hold an int8 scale for codes 0-15 and one for codes
  16-31 of each lane, under the super-block's float16 ``d``: ``w = (d * scale) * (q -
  32)``, as in the file (the kernels also take it over 8-bit int8 codes ``q - 32``, the
  layout before the 6-bit one: the tests' reference); ``SUPER6`` (Q4_K, Q5_K: 6-bit
  sub-block scales under a float16 super-block scale) byte rows ``4C`` and ``4C + 1``
  hold each lane's 6-bit scale ``sc`` and min ``m``; ``scale = f32(d) * sc`` and ``bias =
  -(f32(dmin) * m)`` are exact in float32 (11-bit times 6-bit mantissas), the values
  ``AFFINE`` stores in two float32 rows.

The K-quant kinds (``SUB16``, ``SUPER6``) keep a block to its bytes: its ``4C`` code byte
rows, then the two byte rows of scales, ``4C + 2`` rows of LANES bytes (:func:`block_rows`),
not padded to whole float32 rows. The float16 scales that a super-block's 8 groups share
(:data:`SUPER_GROUPS` consecutive blocks of one tile: a tile's groups are consecutive
blocks) sit after all the blocks, one super row a super-block (:func:`super_row`):
SUPER6 LANES float32 words, the lanes' ``d`` as float16 then their ``dmin``; SUB16
LANES / 2 words, the lanes' ``d``. The kernels read the blocks through the byte view
``codes`` (nblk, 4C + 2, LANES) and the super rows through ``blocks`` (nsb, 1, words)
float32, the array that holds the float rows of scales of the other kinds.
``SYMMETRIC_F16`` (Q4_0, Q5_0, Q8_0: ``SYMMETRIC`` with the file's float16 ``d``) keeps a
block to its code bytes and its lanes' ``d`` in a super row of its own (LANES / 2 words, row
``blk``): ``w = f32(d) * (code - zero)``, the value ``SYMMETRIC``'s float32 row held.

Bytes a weight against the file: Q4_K 592 a 1024 weights against 576 (1.028x), Q5_K 720
against 704 (1.023x), Q6_K 840 as the file (1.0x), Q4_0 / Q5_0 / Q8_0 as the file.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from inference.backends.cpu.ir import _f32, _half, _jit

LANES = 32
GROUP = 32
SYMMETRIC, AFFINE, AFFINE_F16, SUB16, SUPER6, SYMMETRIC_F16 = range(6)  # scale layouts
SPLIT = (SUB16, SUPER6, SYMMETRIC_F16)  # kinds whose float16 scales sit after the blocks
SUPER_GROUPS = 8  # SUB16, SUPER6: groups of 32 in a K-quant super-block
SUPER_SHIFT = 3  # log2(SUPER_GROUPS)


def block_rows(bits: int, kind: int) -> int:
    """:data:`SPLIT` kinds: rows of LANES bytes a block of ``bits``-bit codes takes (its
    codes, then SUB16's / SUPER6's two rows of scale bytes)."""
    return 4 * bits + (0 if kind == SYMMETRIC_F16 else 2)


def super_words(kind: int) -> int:
    """Float32 words of a super row: SUPER6 the lanes' ``d`` and ``dmin`` as float16,
    SUB16 and SYMMETRIC_F16 their ``d``; other kinds have none."""
    return LANES if kind == SUPER6 else LANES // 2 if kind in SPLIT else 0


def super_blocks(kind: int) -> int:
    """Blocks a super row serves: a K-quant super-block's 8, SYMMETRIC_F16's one."""
    return 1 if kind == SYMMETRIC_F16 else SUPER_GROUPS


@_jit(inline="always")
def super_row(blk: int) -> int:
    """SUB16 / SUPER6: the super row holding block ``blk``'s float16 ``d`` (and ``dmin``)."""
    return blk >> SUPER_SHIFT


@_jit(inline="always")
def _high(hb: np.ndarray, j: int, lane: int) -> np.int32:
    """Bit 4 of 5-bit code ``j`` of a lane, from a block's plane of high bits ``hb``
    (4, LANES): byte ``(j & 1) + 2 * (j >= 16)``, bit ``(j % 16) // 2``."""
    plane = (j & 1) + 2 * (j >> 4)
    return ((np.int32(hb[plane, lane]) >> np.int32((j & 15) >> 1)) & np.int32(1)) << np.int32(4)


def code_rows(high):  # type: ignore[no-untyped-def]  # numba only
    """Rows of codes (the row of scales' index) of a nibble layout by its ``high``: None
    (4-bit), one plane (nblk, 4, LANES: 5-bit) or two (nblk, 2, 4, LANES: 6-bit)."""
    raise NotImplementedError


@overload(code_rows, inline="always")
def _code_rows_ov(high):  # type: ignore[no-untyped-def]
    c = 4 if isinstance(high, types.NoneType) else 2 + high.ndim
    return lambda high: c


def code(nib, hb, j, lane):  # type: ignore[no-untyped-def]  # numba only
    """The value of code ``j`` of a lane from its low 4 bits ``nib`` (int32) and the
    block's planes of high bits ``hb``: (4, LANES) one plane, ``nib | bit 4``; (2, 4,
    LANES) two, ``(nib | bit 4 | bit 5) - 32`` (Q6_K's signed ``q - 32``)."""
    raise NotImplementedError


@overload(code, inline="always")
def _code_ov(nib, hb, j, lane):  # type: ignore[no-untyped-def]
    if hb.ndim == 3:
        return lambda nib, hb, j, lane: (
            nib | _high(hb[0], j, lane) | (_high(hb[1], j, lane) << np.int32(1))) - np.int32(32)
    return lambda nib, hb, j, lane: nib | _high(hb, j, lane)


@_jit(inline="always")
def scale_scratch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for :func:`_block_scales`' ``sg``, ``sg2`` and ``zg`` of ``n`` lanes."""
    return (np.empty(n, dtype=np.float32), np.empty(n, dtype=np.float32),
            np.empty(n, dtype=np.float32))


@_jit(inline="always")
def _block_scales(codes: np.ndarray, blocks: np.ndarray, halves: np.ndarray, blk: int,
                  c: int, kind: int, zero: float, sg: np.ndarray, sg2: np.ndarray,
                  zg: np.ndarray) -> None:
    """Scales of every lane of block ``blk`` for its codes 0-15 (``sg``) and 16-31
    (``sg2``), and its bias (``zg``), as float32."""
    n = sg.shape[0]
    if kind == SUB16:
        d = halves[super_row(blk), 0]
        for lane in range(n):
            dl = _half(d[lane])
            sg[lane] = dl * _f32(np.int32(np.int8(codes[blk, 4 * c, lane])))  # int8 scales
            sg2[lane] = dl * _f32(np.int32(np.int8(codes[blk, 4 * c + 1, lane])))
            zg[lane] = _f32(0.0)
        return
    if kind == SYMMETRIC_F16:
        d = halves[blk, 0]
        for lane in range(n):
            sg[lane] = _half(d[lane])
            zg[lane] = -_f32(zero) * sg[lane]
    elif kind == SUPER6:
        h = halves[super_row(blk), 0]
        for lane in range(n):
            sg[lane] = _half(h[lane]) * _f32(np.int32(codes[blk, 4 * c, lane]))
            zg[lane] = -(_half(h[n + lane]) * _f32(np.int32(codes[blk, 4 * c + 1, lane])))
    elif kind == AFFINE_F16:
        row = halves[blk, c]
        for lane in range(n):
            sg[lane] = _half(row[lane])
            zg[lane] = _half(row[n + lane])
    elif kind == AFFINE:
        for lane in range(n):
            sg[lane] = blocks[blk, c, lane]
            zg[lane] = blocks[blk, c + 1, lane]
    else:
        for lane in range(n):
            sg[lane] = blocks[blk, c, lane]
            zg[lane] = -_f32(zero) * blocks[blk, c, lane]
    sg2[:] = sg
