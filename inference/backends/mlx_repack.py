"""GGML blocks -> MLX affine groups of 32 (``w = scale * code + bias``), in NumPy.

Policy per type (group size 32 everywhere; MLX 0.32 accepts groups of 32/64/128 and
2/3/4/5/6/8 bits, not groups of 16):

=======  ====  ===============================================  =========================
type     bits  scale / bias per group of 32                      dequant vs NumPy reference
=======  ====  ===============================================  =========================
Q4_0     4     d / -8d                                           bit-exact
Q4_1     4     d / m                                             bit-exact
Q5_0     5     d / -16d                                          bit-exact
Q5_1     5     d / m                                             bit-exact
Q8_0     8     d / -128d  (code = q + 128)                       bit-exact
Q4_K     4     d*sc_j / -dmin*m_j  (one 32-element sub-block)    bit-exact
Q5_K     5     d*sc_j / -dmin*m_j                                bit-exact
Q3_K     8     d / d*lo  (two 16-element sub-blocks, see below)  bit-exact
Q2_K     8     requantized: (max-min)/255 / min                  |err| <= (max-min)/510
Q6_K     8     requantized: (max-min)/255 / min                  |err| <= (max-min)/510
=======  ====  ===============================================  =========================

Every exact row multiplies a float16 ``d`` (11-bit significand) by integers of at most
8 bits, so each product and the final ``scale*code + bias`` are exact in float32 and
equal llama.cpp's arithmetic bit for bit.

Q3_K: a 32-group holds two sub-blocks with signed 6-bit scales ``s`` (-32..31) and
codes ``q-4`` in -4..3, so every value is ``d * v`` with integer ``v = s*(q-4)`` in
[-124, 128]; ``code = v - lo`` spans at most 252 < 256, so 8 bits hold it exactly.

Q2_K and Q6_K cannot be exact at 8 bits (two sub-blocks with independent scales and,
for Q2_K, independent float mins), so each 32-group is requantized round-to-nearest over
its [min, max]. Measured on random blocks: Q6_K max error 0.12 x (d*max|s|), i.e. about
a quarter of the coarser sub-block's own step; Q2_K max error 0.2% of the group range
(tests/test_backend_mlx.py asserts the bound). The alternative, exact 6-bit groups with
the other sub-block zeroed in two matrices, costs twice the memory and matmuls.
"""

from __future__ import annotations

import numpy as np

from inference.formats.quants import BLOCK_TYPES, dequantize_raw

GROUP = 32
BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5,
        "Q3_K": 8, "Q2_K": 8, "Q6_K": 8}
EXACT = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q3_K"})

# Rows per repack step: bounds the uint64 packing temporaries (~rows x n x 10 bytes).
_CHUNK_ELEMENTS = 1 << 20

_NIB = np.array([0, 4], dtype=np.uint8)
_CRUMB = np.array([0, 2, 4, 6], dtype=np.uint8)
_BIT = np.arange(8, dtype=np.uint8)


def _f16(b: np.ndarray, off: int) -> np.ndarray:
    return b[:, off:off + 2].copy().view(np.float16).astype(np.float32)  # (n, 1)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) -> (n, 32): low nibbles are elements 0-15, high nibbles 16-31."""
    return ((qs[:, None, :] >> _NIB[None, :, None]) & 0x0F).reshape(len(qs), 32)


def _bits5(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: little-endian uint32 of high bits -> (n, 32) values 0 or 16."""
    return np.unpackbits(qh, axis=1, bitorder="little") << np.uint8(4)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 12 scale bytes -> 8 six-bit scales, 8 six-bit mins (get_scale_min_k4)."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


Groups = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes (n, bs), scales, biases (n, bs/32)


def _q4_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> Groups:
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return _nibbles(b[:, 6:22]) | _bits5(b[:, 2:6]), d, -16 * d


def _q5_1(b: np.ndarray) -> Groups:
    return _nibbles(b[:, 8:24]) | _bits5(b[:, 4:8]), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return b[:, 2:34] ^ np.uint8(0x80), d, -128 * d  # int8 q -> q + 128


def _q4_k(b: np.ndarray) -> Groups:
    n = len(b)
    sc, mn = _k_scale_min(b[:, 4:16])
    # 4 chunks of 32 bytes: low nibbles are sub-block 2c, high nibbles 2c+1.
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _NIB.reshape(1, 1, 2, 1)) & 0x0F
    return q.reshape(n, 256), _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q5_k(b: np.ndarray) -> Groups:
    n = len(b)
    sc, mn = _k_scale_min(b[:, 4:16])
    low = (b[:, 48:176].reshape(n, 4, 1, 32) >> _NIB.reshape(1, 1, 2, 1)) & 0x0F
    high = (b[:, None, 16:48] >> _BIT.reshape(1, 8, 1)) & 1  # bit j -> sub-block j
    q = low.reshape(n, 8, 32) | (high << np.uint8(4))
    return q.reshape(n, 256), _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q3_k(b: np.ndarray) -> Groups:
    n = len(b)
    s = b[:, 96:108]
    lo4 = (s[:, None, 0:8] >> _NIB.reshape(1, 2, 1)).reshape(n, 16) & 0x0F
    hi2 = (s[:, None, 8:12] >> _CRUMB.reshape(1, 4, 1)).reshape(n, 16) & 0x03
    sc = (lo4 | (hi2 << np.uint8(4))).astype(np.int16) - 32  # (n, 16) in -32..31
    low = (b[:, 32:96].reshape(n, 2, 1, 32) >> _CRUMB.reshape(1, 1, 4, 1)) & 3
    high = (b[:, None, 0:32] >> _BIT.reshape(1, 8, 1)) & 1  # clear bit: subtract 4
    q = low.reshape(n, 8, 32).astype(np.int16) - 4 * (1 - high.astype(np.int16))
    v = (sc.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, 8, 32)
    # Lowest value either sub-block can take (not the observed min): codes stay <= 252.
    pair = sc.reshape(n, 8, 2)
    lo = np.minimum(-4 * pair, 3 * pair).min(axis=2)  # (n, 8)
    codes = (v - lo[:, :, None]).astype(np.uint8).reshape(n, 256)
    d = _f16(b, 108)
    return codes, np.broadcast_to(d, (n, 8)), d * lo.astype(np.float32)


def _requant8(b: np.ndarray, qtype: str) -> Groups:
    """Exact dequant, then round-to-nearest 8-bit per 32-group over [min, max]."""
    v = dequantize_raw(b, qtype).reshape(len(b), -1, GROUP)
    lo, hi = v.min(axis=2), v.max(axis=2)
    scale = (hi - lo) / np.float32(255)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.rint((v - lo[..., None]) / safe[..., None])
    return np.clip(codes, 0, 255).astype(np.uint8).reshape(len(b), -1), scale, lo


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q3_K": _q3_k}


def block_groups(blocks: np.ndarray, qtype: str) -> Groups:
    """Raw blocks (n, type_size) -> codes (n, block_size), scales, biases (n, block/32)."""
    if qtype in _DECODERS:
        return _DECODERS[qtype](blocks)
    if qtype in ("Q2_K", "Q6_K"):
        return _requant8(blocks, qtype)
    raise ValueError(f"no MLX repack for {qtype}")


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes (rows, n) -> MLX packed uint32 (rows, n*bits/32).

    MLX packs each row as one little-endian bit stream: 8 codes fill exactly ``bits``
    bytes, so each run of 8 is assembled in a uint64 and its low ``bits`` bytes kept.
    """
    rows, n = codes.shape
    if bits == 8:
        return np.ascontiguousarray(codes).view("<u4")
    g = codes.reshape(rows, n // 8, 8).astype(np.uint64)
    word = np.zeros((rows, n // 8), dtype=np.uint64)
    for i in range(8):
        word |= g[:, :, i] << np.uint64(bits * i)
    out = word.astype("<u8").view(np.uint8).reshape(rows, n // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(out).reshape(rows, n // 8 * bits).view("<u4")


def repack(raw: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Raw GGML rows (rows, bytes_per_row) -> (packed uint32, scales, biases, bits).

    Scales and biases are float32 (rows, n/32), matching what the exact rows need.
    """
    bt = BLOCK_TYPES[qtype]
    bits = BITS[qtype]
    rows = raw.shape[0]
    n = raw.shape[1] // bt.type_size * bt.block_size
    w = np.empty((rows, n * bits // 32), dtype=np.uint32)
    scales = np.empty((rows, n // GROUP), dtype=np.float32)
    biases = np.empty_like(scales)
    step = max(1, _CHUNK_ELEMENTS // max(n, 1))
    for r in range(0, rows, step):
        chunk = np.ascontiguousarray(raw[r:r + step]).view(np.uint8)
        c = len(chunk)
        codes, s, z = block_groups(chunk.reshape(-1, bt.type_size), qtype)
        w[r:r + c] = pack_codes(codes.reshape(c, n), bits)
        scales[r:r + c] = np.broadcast_to(s, (len(codes), bt.block_size // GROUP)).reshape(c, -1)
        biases[r:r + c] = np.broadcast_to(z, (len(codes), bt.block_size // GROUP)).reshape(c, -1)
    return w, scales, biases, bits

