"""Memory a model takes on one backend, from the layout that backend builds.

Unlike :attr:`ModelSpec.est_memory` (file bytes plus an allowance, the same on every
backend), :func:`estimate` asks the backend for its layout (``Backend.held_bytes``,
``Backend.attention_bytes``, ``CpuBackend.gemm_scratch_bytes``):

- weights as held: ``numpy`` widens everything to float32; ``cpu`` keeps 4/8-bit codes in
  lane blocks (raw file bytes for the types it does not repack) and float32 for the rest;
  ``mlx`` holds affine codes plus a scale and bias per group in its activation dtype;
  ``cuda`` keeps file bytes for the types its kernels read;
- KV cache at the context the user chose, in the backend's dtype, in 256-token steps;
- scratch of one prefill chunk: its activations, the attention scores the backend keeps
  live for the chunk's queries over the whole context (in the tiles it cuts), last-row
  logits, and on ``cpu`` the float32 buffer it dequantizes prefill weights into; for
  encoders, the calls :func:`embed.plan_batches` runs at once at ``batch`` inputs of the
  longest length (the live set of the larger phase of a layer; the reference backend's
  every temporary).

- the tokenizer, on backends that hold the model in host memory (``numpy``, ``cpu``; on
  ``mlx`` and ``cuda`` the figure is the device's, where no tokenizer lives): its
  vocabulary as ``tokenizers`` holds it (token -> id and id -> token maps, the strings,
  BPE merges), and for BPE and Unigram models the word cache ``tokenizers`` fills as it
  sees text, up to 10,000 distinct words: any session long enough to matter fills it.

Not counted: the backend's own one-time cost (imported libraries, numba's compiled
kernels, MLX's runtime), which no model choice changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.formats import Checkpoint, read_checkpoint
from inference.kv_cache import KVCache
from inference.store import ENCODER_SEQ, ModelSpec

# Resident bytes of a `tokenizers` tokenizer per vocabulary entry (BPE merges included),
# and per word in its cache when full. Measured as RSS growth with glibc's free pages
# returned: SmolLM2's BPE (49,152 entries, 48,900 merges) 10.1 MiB, 211 B an entry;
# MiniLM's WordPiece (30,522) 7.3 MiB, 250 B; 12,000 distinct words through each BPE and
# Unigram test tokenizer 2.6-3.7 MiB, 270-390 B a word of the 10,000 kept.
TOKENIZER_ENTRY_BYTES = 230
WORD_CACHE_WORDS = 10_000  # tokenizers' DEFAULT_CACHE_CAPACITY (BPE, Unigram)
WORD_CACHE_ENTRY_BYTES = 350


@dataclass
class MemoryEstimate:
    backend: str
    weights: int
    kv: int
    scratch: int
    context: int | None  # tokens the KV cache is sized for (None: an encoder)
    tokenizer: int = 0  # host memory; 0 where the figure is a device's

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch + self.tokenizer


def _num(cfg: dict[str, Any], key: str, default: int) -> int:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def tokenizer_bytes(ckpt: Checkpoint) -> int:
    """What the model's tokenizer holds once it has seen a session's worth of text."""
    vocab = _num(ckpt.config, "vocab_size", 0)
    if ckpt.format == "gguf":
        word_pieces = ckpt.metadata.get("tokenizer.ggml.model") == "bert"
    else:
        path = ckpt.path / "tokenizer.json"
        word_pieces = path.is_file() and b'"WordPiece"' in path.read_bytes()
    cache = 0 if word_pieces else WORD_CACHE_WORDS * WORD_CACHE_ENTRY_BYTES  # no cache
    return vocab * TOKENIZER_ENTRY_BYTES + cache


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
    on_host = backend.memory().device_used is None  # no device memory: the model is in RAM
    tok = tokenizer_bytes(ckpt) if on_host else 0
    weights = sum(backend.held_bytes(t) for t in ckpt.tensors.values())
    # The cpu backend's dequant buffer: one per thread that runs prefill products (one for a
    # chat model, one per parallel call for an encoder), grown to the largest weight's need.
    gemm = getattr(backend, "gemm_scratch_bytes", None)
    dequant = max((gemm(t) for t in ckpt.tensors.values()), default=0) if gemm else 0
    hidden = _num(cfg, "hidden_size", 0)
    inter = _num(cfg, "intermediate_size", 4 * hidden)
    heads = _num(cfg, "num_attention_heads", 1)
    layers = _num(cfg, "num_hidden_layers", 0)
    threads = max(1, backend.parallel_calls())
    if spec.kind == "encoder":
        # Inputs are cut to the model's positions (and sentence-transformers' length).
        length = min(ENCODER_SEQ, spec.context_length or ENCODER_SEQ)
        limits = getattr(backend, "embed_limits", BatchLimits())
        chunks = plan_batches(
            [length] * min(batch, limits.max_batch), limits,
            lambda r, n: threads * encoder_call_bytes(hidden, inter, heads, r, n))
        rows = max(len(c) for c in chunks)
        if name == "numpy":  # the reference: every temporary, three score arrays
            per_call = encoder_call_bytes(hidden, inter, heads, rows, length)
        else:  # the larger of the two phases' live sets: attention (hidden-sized rows and
            # q, k, v; the scores) or the FFN (input, output, up, activated up)
            per_call = max(rows * length * 4 * (backend.hidden_rows + 1) * hidden
                           + backend.attention_bytes(rows * heads, length, length, masked=True),
                           rows * length * 4 * (2 * hidden + 2 * inter))
        calls = min(threads, len(chunks))  # calls running at once
        return MemoryEstimate(name, weights, 0, calls * (per_call + dequant), None, tok)
    ctx = min(context or _num(cfg, "max_position_embeddings", 4096),
              _num(cfg, "max_position_embeddings", 1 << 30))
    step = KVCache.step
    kv_heads = _num(cfg, "num_key_value_heads", heads)
    head_dim = _num(cfg, "head_dim", hidden // heads)
    # The cache's own element type where the backend stores K/V narrower (cuda's float16).
    kv_dtype = getattr(backend, "kv_dtype", None)
    kv_bytes = np.dtype(kv_dtype).itemsize if kv_dtype is not None else dtype_bytes
    kv = 2 * layers * kv_heads * head_dim * (-(-ctx // step) * step) * kv_bytes
    chunk = min(ctx, backend.prefill_chunk or PREFILL_CHUNK)
    # The last prefill chunk's queries see the whole context.
    capped = bool(cfg.get("attn_logit_softcapping") or cfg.get("sliding_window"))
    scratch = (chunk * (2 * inter + backend.hidden_rows * hidden) * dtype_bytes
               + backend.attention_bytes(heads, chunk, ctx, capped=capped,
                                         tensors=ckpt.tensors)
               + _num(cfg, "vocab_size", 0) * 4 + dequant)
    return MemoryEstimate(name, weights, kv, scratch, ctx, tok)
