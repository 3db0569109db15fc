"""RoPE frequency scaling from a Hugging Face ``rope_scaling`` dict, as per-pair factors.

Every scaled RoPE we run keeps the angle form ``pos * theta^(-2i/d) / factor[i]`` (the
form of GGML's ``rope_freqs`` tensor), so backends take one optional ``freq_factors``
vector and never learn the scaling schemes. Factors follow transformers'
``modeling_rope_utils`` exactly (float64 here; the angles are float64 in every backend's
table or float32 on the device).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from inference.errors import UnsupportedModelError

SUPPORTED = ("default", "linear", "llama3", "longrope", "su")


def rope_kind(scaling: dict[str, Any] | None) -> str:
    if not isinstance(scaling, dict):
        return "default"
    return str(scaling.get("rope_type", scaling.get("type")) or "default")


def check_supported(scaling: dict[str, Any] | None, model_type: str) -> None:
    kind = rope_kind(scaling)
    if kind not in SUPPORTED:
        raise UnsupportedModelError(
            f"This {model_type} model uses RoPE scaling '{kind}', which Inferdesk does not "
            f"support yet (supported: {', '.join(SUPPORTED)}).")


def freq_factors(scaling: dict[str, Any] | None, head_dim: int, theta: float
                 ) -> np.ndarray | None:
    """Per-pair divisors of the inverse frequencies, (head_dim/2,) float32; None if plain."""
    kind = rope_kind(scaling)
    if kind == "default":
        return None
    assert scaling is not None
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return np.full(head_dim // 2, factor, dtype=np.float32)
    if kind in ("longrope", "su"):
        # Phi-3: the short factors hold up to the original context, which is where the
        # engine stops such a model (see original_context); the long ones start past it.
        short = np.asarray(scaling["short_factor"], dtype=np.float32)
        if short.shape != (head_dim // 2,):
            raise UnsupportedModelError(
                f"LongRoPE short_factor has {short.size} entries; head_dim {head_dim} needs "
                f"{head_dim // 2}.")
        return short
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    scaled = np.where(medium, smoothed, scaled)
    return (inv / scaled).astype(np.float32)


def original_context(scaling: dict[str, Any] | None, config: dict[str, Any]) -> int | None:
    """LongRoPE's pretraining context (its factors change past it), else None."""
    if rope_kind(scaling) not in ("longrope", "su"):
        return None
    assert scaling is not None
    n = scaling.get("original_max_position_embeddings",
                    config.get("original_max_position_embeddings"))
    return int(n) if n else None


def attention_factor(scaling: dict[str, Any] | None, config: dict[str, Any]) -> float:
    """LongRoPE scales cos and sin by this factor, i.e. every q.k by its square."""
    original = original_context(scaling, config)
    if original is None:
        return 1.0
    assert scaling is not None
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling.get("factor") or config["max_position_embeddings"] / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
