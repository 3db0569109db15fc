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
    """Raw TensorData layout: (rows, cols) float for F32/F16, (rows, row_bytes) uint8 else.
    K-quant super-block scales are drawn from [0.002, 0.05) * scale."""
    if qtype == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32)
    if qtype == "F16":
        return rng.standard_normal((rows, cols)).astype(np.float16)
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
    return quants.dequantize(data, GGMLQuantizationType[qtype]).reshape(data.shape[0], cols)
