"""GGML blocks as affine groups of 32 (``w = scale * code + bias``), exact for every type.

MLX's quantized matmul (and our ``cpu`` lane blocks) take one scale and one bias per group
of 32 consecutive codes. Types whose scales cover 32 weights map onto that directly; Q2_K
and Q6_K keep a scale per 16 weights, so each 16-weight sub-block becomes a group of its
own: 32 codes, a ``lo`` half and a ``hi`` half, read against an *expanded* activation
``x' = [x / div, mult * (x / div)]`` built per 16 inputs (:data:`AFFINE_TYPES`, ``expand``).
Summed over the two halves, a weight's terms are
``(scale*lo + bias) / div + mult * (scale*hi + bias) / div``, which equals the file's value:

=======  ====  =============  =====================================  =====================
type     bits  expand         scale / bias per group                 codes
=======  ====  =============  =====================================  =====================
Q4_0     4     -              d / -8d                                q
Q4_1     4     -              d / m                                  q
Q5_0     5     -              d / -16d                               q
Q5_1     5     -              d / m                                  q
Q8_0     8     -              d / -128d                              q + 128
Q4_K     4     -              d*sc / -dmin*m (32-weight sub-block)   q
Q5_K     5     -              d*sc / -dmin*m                         q
Q3_K     8     -              d / d*lo (two 16-weight sub-blocks)    sc*(q-4) - lo
Q2_K     2     div 1, mult 0  d*sc / -dmin*m (16-weight sub-block)   lo = q, hi = 0
Q6_K     3     div 9, mult 8  9*d*sc / -32*d*sc                      q = lo + 8*hi
=======  ====  =============  =====================================  =====================

Exactness: every scale and bias above is a float16 times an integer of at most 8 bits
(times 9 for Q6_K: at most 22 significant bits), so it is exact in float32; with the
expansion the represented value is, in exact arithmetic, the file's value:
Q6_K ``(9s*lo - 32s + 8*(9s*hi - 32s)) / 9 = s*(q - 32)``, Q2_K ``d*sc*q - dmin*m``
(:func:`collapse` computes it; the tests compare it with ``dequantize_raw`` bit for bit).
Q3_K: a group holds two sub-blocks with signed 6-bit scales ``s`` and codes ``q-4`` in
-4..3, so each value is ``d * v`` with ``v = s*(q-4)`` in [-124, 128]; ``v - lo`` spans at
most 252, so 8 bits hold it.

The expanded types pay for it in activations, not weights: Q6_K's ``x / 9`` is rounded to
float32 (half an ulp, as any product would be); Q2_K's hi half multiplies zeros. Memory:
:meth:`AffineType.bits_per_weight`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inference.formats.quants import (
    _CRUMB_SHIFTS,
    _NIBBLE_SHIFTS,
    BLOCK_TYPES,
    _f16,
    _high_bits32,
    _k_scale_min,
    _nibbles,
    _q3_k_scales,
    q6_k_fields,
)

GROUP = 32
SUB = 16  # weights per sub-block of the expanded types

_BIT_SHIFTS = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)


@dataclass(frozen=True)
class AffineType:
    """How one GGML type sits in affine groups of 32.

    ``expand`` is ``None`` when codes line up with the activation one to one, else
    ``(div, mult)``: each 16 inputs become ``[x/div, mult*x/div]`` and each weight has two
    codes (lo, hi) in one group of 32.
    """

    bits: int
    expand: tuple[float, float] | None = None

    @property
    def codes_per_weight(self) -> int:
        return 1 if self.expand is None else 2

    def bits_per_weight(self, scale_bytes: int = 4) -> float:
        """Codes plus one scale and one bias of ``scale_bytes`` per group of 32 codes."""
        per = self.codes_per_weight
        return per * self.bits + per * 2 * 8 * scale_bytes / GROUP


AFFINE_TYPES: dict[str, AffineType] = {
    "Q4_0": AffineType(4), "Q4_1": AffineType(4), "Q5_0": AffineType(5),
    "Q5_1": AffineType(5), "Q8_0": AffineType(8), "Q4_K": AffineType(4),
    "Q5_K": AffineType(5), "Q3_K": AffineType(8),
    "Q2_K": AffineType(2, (1.0, 0.0)), "Q6_K": AffineType(3, (9.0, 8.0)),
}

Groups = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes (n, codes), scales, biases (n, g)


def _q4_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> Groups:
    return _nibbles(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return _nibbles(b[:, 6:22]) | _high_bits32(b[:, 2:6]), d, -16 * d


def _q5_1(b: np.ndarray) -> Groups:
    return _nibbles(b[:, 8:24]) | _high_bits32(b[:, 4:8]), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> Groups:
    d = _f16(b, 0)
    return b[:, 2:34] ^ np.uint8(0x80), d, -128 * d  # int8 q -> q + 128


def _k_affine(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc, mn = _k_scale_min(b[:, 4:16])
    return _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q4_k(b: np.ndarray) -> Groups:
    n = len(b)
    # 4 chunks of 32 bytes: low nibbles are sub-block 2c, high nibbles 2c+1.
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & 0x0F
    return (q.reshape(n, 256), *_k_affine(b))


def _q5_k(b: np.ndarray) -> Groups:
    n = len(b)
    low = (b[:, 48:176].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & 0x0F
    high = (b[:, None, 16:48] >> _BIT_SHIFTS) & 1  # bit j -> sub-block j
    q = low.reshape(n, 8, 32) | (high << np.uint8(4))
    return (q.reshape(n, 256), *_k_affine(b))


def _q3_k(b: np.ndarray) -> Groups:
    n = len(b)
    sc = _q3_k_scales(b[:, 96:108]).astype(np.int16)  # (n, 16) in -32..31
    low = (b[:, 32:96].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    high = (b[:, None, 0:32] >> _BIT_SHIFTS) & 1  # clear bit: subtract 4
    q = low.reshape(n, 8, 32).astype(np.int16) - 4 * (1 - high.astype(np.int16))
    v = (sc.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, 8, 32)
    # Lowest value either sub-block can take (not the observed min): codes stay <= 252.
    pair = sc.reshape(n, 8, 2)
    lo = np.minimum(-4 * pair, 3 * pair).min(axis=2)  # (n, 8)
    codes = (v - lo[:, :, None]).astype(np.uint8).reshape(n, 256)
    d = _f16(b, 108)
    return codes, np.broadcast_to(d, (n, 8)), d * lo.astype(np.float32)


def _q2_k(b: np.ndarray) -> Groups:
    n = len(b)
    sc = b[:, 0:16]
    # 64 bytes = 2 halves x 32 bytes; shift s of byte l is element half*128 + s*32 + l.
    q = (b[:, 16:80].reshape(n, 2, 1, 32) >> _CRUMB_SHIFTS.reshape(1, 1, 4, 1)) & 3
    codes = np.zeros((n, 16, 2, SUB), dtype=np.uint8)
    codes[:, :, 0] = q.reshape(n, 16, SUB)  # hi stays 0: its activation is 0 * x
    return codes.reshape(n, 512), _f16(b, 80) * (sc & 0x0F), -(_f16(b, 82) * (sc >> 4))


def _q6_k(b: np.ndarray) -> Groups:
    n = len(b)
    q, sc, d = q6_k_fields(b)
    q = (q + np.int8(32)).view(np.uint8).reshape(n, 16, 1, SUB)  # 0..63
    codes = np.concatenate([q & 7, q >> 3], axis=2)  # q = lo + 8*hi
    s = d * sc  # as dequantize_raw forms it: exact, <= 18 significant bits
    return codes.reshape(n, 512), 9 * s, -32 * s


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k, "Q3_K": _q3_k, "Q2_K": _q2_k, "Q6_K": _q6_k}


def block_groups(blocks: np.ndarray, qtype: str) -> Groups:
    """Raw blocks (n, type_size) -> codes uint8 (n, block_size * codes_per_weight) and
    float32 scales, biases (n, groups per block)."""
    try:
        return _DECODERS[qtype](blocks)
    except KeyError:
        raise ValueError(f"no affine form for {qtype}") from None


def expand_activation(x: np.ndarray, expand: tuple[float, float]) -> np.ndarray:
    """(..., K) -> (..., 2K): each 16 inputs become ``[x/div, mult * x/div]`` (NumPy form
    of what a backend builds on its device)."""
    div, mult = expand
    lo = (x / np.float32(div)).astype(np.float32).reshape(*x.shape[:-1], -1, 1, SUB)
    return np.concatenate([lo, lo * np.float32(mult)], axis=-2).reshape(*x.shape[:-1], -1)


def collapse(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, qtype: str
             ) -> np.ndarray:
    """The weights a row of groups represents, folded back to one value per weight, in
    float64 (exact for every term here); float32 result. codes (rows, codes), scales and
    biases (rows, groups)."""
    rows = codes.shape[0]
    g = scales.shape[1]
    w = (codes.reshape(rows, g, GROUP).astype(np.float64) * scales[..., None].astype(np.float64)
         + biases[..., None].astype(np.float64))
    expand = AFFINE_TYPES[qtype].expand
    if expand is not None:
        div, mult = expand
        w = (w[:, :, :SUB] + mult * w[:, :, SUB:]) / div
    return w.reshape(rows, -1).astype(np.float32)


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


# Rows per step of :func:`to_affine`: bounds the uint64 packing temporaries.
_CHUNK_ELEMENTS = 1 << 20


def to_affine(raw: np.ndarray, qtype: str, at: AffineType | None = None,
              decode: Callable[[np.ndarray], Groups] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, AffineType]:
    """Raw GGML rows (rows, bytes_per_row) -> (packed uint32, scales, biases, type entry);
    scales and biases float32 (rows, groups). ``at``/``decode`` replace the type's entry
    and decoder (a backend's own form of a type)."""
    bt = BLOCK_TYPES[qtype]
    at = at or AFFINE_TYPES[qtype]
    rows = raw.shape[0]
    n = raw.shape[1] // bt.type_size * bt.block_size * at.codes_per_weight
    w = np.empty((rows, n * at.bits // 32), dtype=np.uint32)
    scales = np.empty((rows, n // GROUP), dtype=np.float32)
    biases = np.empty_like(scales)
    per = bt.block_size * at.codes_per_weight // GROUP
    step = max(1, _CHUNK_ELEMENTS // max(n, 1))
    for r in range(0, rows, step):
        chunk = np.ascontiguousarray(raw[r:r + step]).view(np.uint8)
        c = len(chunk)
        blocks = chunk.reshape(-1, bt.type_size)
        codes, s, z = decode(blocks) if decode else block_groups(blocks, qtype)
        w[r:r + c] = pack_codes(codes.reshape(c, n), at.bits)
        scales[r:r + c] = np.broadcast_to(s, (len(codes), per)).reshape(c, -1)
        biases[r:r + c] = np.broadcast_to(z, (len(codes), per)).reshape(c, -1)
    return w, scales, biases, at
