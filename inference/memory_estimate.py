"""Memory a model takes on one backend, from the layout that backend builds.

Unlike :attr:`ModelSpec.est_memory` (file bytes plus an allowance, the same on every
backend), :func:`estimate` follows what each backend holds:

- weights as held: ``numpy`` widens everything to float32; ``cpu`` keeps 4/8-bit codes in
  lane blocks (:mod:`cpu_pack`, raw file bytes for the types it does not repack) and
  float32 for the rest; ``mlx`` holds affine codes plus a scale and bias per group of 32 in
  its activation dtype; ``cuda`` keeps file bytes for the types its kernels read;
- KV cache at the context the user chose, in the backend's dtype, in 256-token steps;
- scratch of one prefill chunk (activations, one attention tile, last-row logits, and the
  ``cpu`` backend's dequant buffer per thread) or, for encoders, of the calls
  :func:`embed.plan_batches` runs at once at ``batch`` inputs of the longest length (the
  live set of the larger phase of a layer; the reference backend's every temporary).

Not counted: the backend's own one-time cost (imported libraries, numba's compiled
kernels), which no model choice changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.backends.base import ATTENTION_SCRATCH_BYTES
from inference.formats import read_checkpoint
from inference.formats.tensor import TensorData
from inference.kv_cache import KVCache
from inference.store import ENCODER_SEQ, ModelSpec


@dataclass
class MemoryEstimate:
    backend: str
    weights: int
    kv: int
    scratch: int
    context: int | None  # tokens the KV cache is sized for (None: an encoder)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch


def _count(t: TensorData) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def held_bytes(t: TensorData, backend: str, dtype_bytes: int = 4) -> int:
    """Bytes ``backend`` keeps for tensor ``t`` (see the module docstring)."""
    n = _count(t)
    linear = len(t.shape) == 2
    if backend == "cpu" and linear and t.qtype != "F32":
        from inference.backends.cpu_kernels import AFFINE, GROUP, LANES
        from inference.backends.cpu_pack import _CODE_ROWS, _kind, packed_bits

        bits = packed_bits(t)
        if bits is None:
            return t.nbytes  # kept as file bytes
        tiles, groups = -(-t.shape[0] // LANES), t.shape[1] // GROUP
        rows = _CODE_ROWS[bits] + (2 if _kind(t) == AFFINE else 1)
        return tiles * groups * rows * LANES * 4
    if backend == "mlx" and linear and t.is_quantized:
        from inference.formats.affine import AFFINE_TYPES, GROUP

        bits = int(t.extra["bits"]) if t.qtype == "MLX" else AFFINE_TYPES[t.qtype].bits
        per = 1 if t.qtype == "MLX" or AFFINE_TYPES[t.qtype].expand is None else 2
        return per * (n * bits // 8 + 2 * (n // GROUP) * dtype_bytes)
    if backend == "cuda" and linear:
        from inference.backends.cuda import _KERNEL_TYPES

        return t.nbytes if t.qtype in _KERNEL_TYPES else n * 4  # BF16 widens to float32
    return n * dtype_bytes


def _num(cfg: dict[str, Any], key: str, default: int) -> int:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def estimate(spec: ModelSpec, backend: Any, context: int | None = None,
             batch: int = 32) -> MemoryEstimate:
    """What ``spec`` takes on ``backend`` (a Backend instance) with a KV cache of
    ``context`` tokens (default and cap: the model's own context)."""
    from inference.embed import BatchLimits, encoder_call_bytes, plan_batches
    from inference.generate import PREFILL_CHUNK

    name = backend.name
    dtype_bytes = int(getattr(getattr(backend, "dtype", None), "size", 4) or 4)
    ckpt = read_checkpoint(spec.path)
    cfg = ckpt.config
    weights = sum(held_bytes(t, name, dtype_bytes) for t in ckpt.tensors.values())
    hidden = _num(cfg, "hidden_size", 0)
    inter = _num(cfg, "intermediate_size", 4 * hidden)
    heads = _num(cfg, "num_attention_heads", 1)
    layers = _num(cfg, "num_hidden_layers", 0)
    threads = max(1, backend.parallel_calls())
    if spec.kind == "encoder":
        length = ENCODER_SEQ
        limits = getattr(backend, "embed_limits", BatchLimits())
        rows = max(len(c) for c in plan_batches(
            [length] * min(batch, limits.max_batch), limits,
            lambda r, n: threads * encoder_call_bytes(hidden, inter, heads, r, n)))
        if name == "numpy":  # the reference: every temporary, three score arrays
            per_call = encoder_call_bytes(hidden, inter, heads, rows, length)
        else:  # the larger of the two phases' live sets: attention (input, q, k, v,
            # output, one scores array) or the FFN (input, output, up, activated up)
            per_call = rows * length * 4 * max(5 * hidden + heads * length,
                                               2 * hidden + 2 * inter)
        return MemoryEstimate(name, weights, 0, threads * per_call, None)
    ctx = min(context or _num(cfg, "max_position_embeddings", 4096),
              _num(cfg, "max_position_embeddings", 1 << 30))
    step = KVCache.step
    kv_heads = _num(cfg, "num_key_value_heads", heads)
    head_dim = _num(cfg, "head_dim", hidden // heads)
    kv = 2 * layers * kv_heads * head_dim * (-(-ctx // step) * step) * dtype_bytes
    chunk = min(ctx, backend.prefill_chunk or PREFILL_CHUNK)
    scratch = (chunk * (2 * inter + 4 * hidden) * dtype_bytes
               + min(ATTENTION_SCRATCH_BYTES, heads * chunk * ctx * 4)
               + _num(cfg, "vocab_size", 0) * 4)
    if name == "cpu":
        from inference.backends.cpu import SCRATCH_BYTES

        scratch += threads * SCRATCH_BYTES
    return MemoryEstimate(name, weights, kv, scratch, ctx)
