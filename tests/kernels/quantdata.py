"""Test weights in GGML block layout, with gguf-py as the dequantization reference."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants

from kernels.cuda.table import TYPES

# Byte offsets of the fp16 scale fields in one block (random bytes there could be inf/NaN).
_HALF_FIELDS = {
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
# gguf-py quantizes these; K-quants it only dequantizes.
_GGUF_QUANTIZES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def make_weight(qtype: str, rows: int, cols: int, rng: np.random.Generator,
                scale: float = 1.0) -> np.ndarray:
    """Raw TensorData layout: (rows, cols) float for F32/F16, uint16 bits for BF16,
    (rows, row_bytes) uint8 else.
    K-quant super-block scales are drawn from [0.002, 0.05) * scale."""
    if qtype == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32)
    if qtype == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16)
    if qtype == "BF16":  # uint16 bit patterns: float32 values with the low 16 bits dropped
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        return (w.view(np.uint32) >> 16).astype(np.uint16)
    t = TYPES[qtype]
    if qtype in _GGUF_QUANTIZES:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        return quants.quantize(w, GGMLQuantizationType[qtype])
    # K-quants: random bytes are valid blocks once the fp16 scales are finite and modest.
    blocks = rng.integers(0, 256, (rows, cols // t.qk, t.block_bytes), dtype=np.uint8)
    for off in _HALF_FIELDS[qtype]:
        d = (rng.uniform(0.002, 0.05, blocks.shape[:2]) * scale).astype(np.float16)
        blocks[:, :, off:off + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def reference(qtype: str, data: np.ndarray, cols: int) -> np.ndarray:
    """float32 (rows, cols) per gguf-py."""
    if qtype in ("F32", "F16"):
        return np.asarray(data, dtype=np.float32)
    if qtype == "BF16":
        return (np.asarray(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return quants.dequantize(data, GGMLQuantizationType[qtype]).reshape(data.shape[0], cols)


# --- q8_1 activations, as kernels/cuda/mmv.cu quantize_q8_1 makes them ----------------------

def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch, cols) float32 -> (q int8 (batch, cols), d half (batch, cols/32), s half).

    The kernel's arithmetic step by step in float32: d = max|x| / 127, q = roundf(x / d)
    (half away from zero; 0 when max|x| = 0), s = d * sum(q); d and s stored as half.
    """
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = (xb / d[..., None]).astype(np.float64)
    q = np.where(v >= 0, np.floor(v + 0.5), np.ceil(v - 0.5))
    q = np.where(amax[..., None] == 0, 0, q).astype(np.int32)
    s = (d * q.sum(-1).astype(np.float32)).astype(np.float32)
    return (q.astype(np.int8).reshape(x.shape), d.astype(np.float16), s.astype(np.float16))


def q8_1_bytes(q: np.ndarray, d: np.ndarray, s: np.ndarray, row_bytes: int) -> np.ndarray:
    """The q8_1 rows' bytes (blocks of d, s, 32 int8), each row padded to row_bytes."""
    batch, nb = d.shape
    blocks = np.empty((batch, nb, 36), np.uint8)
    blocks[..., 0:2] = d.view(np.uint8).reshape(batch, nb, 2)
    blocks[..., 2:4] = s.view(np.uint8).reshape(batch, nb, 2)
    blocks[..., 4:] = q.reshape(batch, nb, 32).view(np.uint8)
    out = np.zeros((batch, row_bytes), np.uint8)
    out[:, :nb * 36] = blocks.reshape(batch, -1)
    return out


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K 6-bit scales and mins, (..., 12) bytes -> two (..., 8) arrays."""
    sc = sc.astype(np.int32)
    lo = np.concatenate([sc[..., 0:4] & 63, (sc[..., 8:12] & 0xF) | ((sc[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], -1)
    return lo, mn


def group_offsets(qtype: str, data: np.ndarray, cols: int) -> np.ndarray:
    """Per 32-element group, the constant c in w = scale * code + c that the integer kernels
    apply through the q8_1 sum s (0 where the offset is folded into the integers):
    (rows, cols/32) float64."""
    rows = data.shape[0]
    t = TYPES[qtype]
    blocks = data.reshape(rows, cols // t.qk, t.block_bytes)

    def half(off: int) -> np.ndarray:
        return blocks[..., off:off + 2].copy().view(np.float16)[..., 0].astype(np.float64)

    if qtype in ("Q4_0", "Q5_0"):
        return -(8 if qtype == "Q4_0" else 16) * half(0)
    if qtype in ("Q4_1", "Q5_1"):
        return half(2)
    if qtype in ("Q4_K", "Q5_K"):
        _, mn = _k_scale_min(blocks[..., 4:16])
        return (-half(2)[..., None] * mn).reshape(rows, -1)
    return np.zeros((rows, cols // 32))
