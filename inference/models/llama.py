"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2), written against backend ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.backends.base import Backend
from inference.errors import UnsupportedModelError
from inference.kv_cache import BatchedCaches, KVCache
from inference.models.common import Weights, config_from_dict

REQUIRED_OPS = frozenset({
    "embedding", "linear", "rms_norm", "rope", "attention", "silu_mul", "add",
    "reshape", "transpose", "zeros", "set_slice", "narrow", "sample",
})


@dataclass
class ModelArgs:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type == "qwen2":
            self.attention_bias = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelArgs:
        # transformers >= 5 writes rope_theta inside "rope_parameters", not at the top level.
        rope = d.get("rope_parameters")
        if d.get("rope_theta") is None and isinstance(rope, dict) and "rope_theta" in rope:
            d = {**d, "rope_theta": rope["rope_theta"]}
        # Scaled RoPE (llama3, yarn, linear, ...) changes every angle: refuse rather than run
        # with plain RoPE and produce fluent nonsense past the original context.
        for scaling in (d.get("rope_scaling"), rope):
            kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) \
                else None
            if kind not in (None, "default"):
                raise UnsupportedModelError(
                    f"This {d.get('model_type', 'llama')} model uses RoPE scaling '{kind}', "
                    "which Inferdesk does not support yet.")
        return config_from_dict(cls, d)


class Attention:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str):
        self.B = B
        self.n_heads = args.num_attention_heads
        self.n_kv = args.num_key_value_heads
        self.head_dim = args.head_dim
        self.scale = self.head_dim ** -0.5
        self.theta = args.rope_theta
        # (weight, bias-or-None): Qwen2 carries q/k/v biases, Llama does not.
        self.q = (w.linear(p + "q_proj.weight"), w.optional_dense(p + "q_proj.bias"))
        self.k = (w.linear(p + "k_proj.weight"), w.optional_dense(p + "k_proj.bias"))
        self.v = (w.linear(p + "v_proj.weight"), w.optional_dense(p + "v_proj.bias"))
        self.o_proj = w.linear(p + "o_proj.weight")

    def _heads(self, x: Any, n: int) -> Any:
        b, t, _ = x.shape
        return self.B.transpose(self.B.reshape(x, (b, t, n, self.head_dim)), (0, 2, 1, 3))

    def _attend(self, q: Any, k: Any, v: Any, cache: KVCache, layer: int) -> Any:
        B = self.B
        q = B.rope(q, cache.offset, self.theta)
        k = B.rope(k, cache.offset, self.theta)
        k, v = cache.update(layer, k, v)
        return B.attention(q, k, v, self.scale, causal_offset=cache.offset)

    def __call__(self, x: Any, cache: KVCache | BatchedCaches, layer: int) -> Any:
        B = self.B
        b, t, _ = x.shape
        q = self._heads(B.linear(x, *self.q), self.n_heads)
        k = self._heads(B.linear(x, *self.k), self.n_kv)
        v = self._heads(B.linear(x, *self.v), self.n_kv)
        if isinstance(cache, BatchedCaches):  # one sequence per row, each at its own position
            out = B.zeros((b, self.n_heads, t, self.head_dim))
            for i, c in enumerate(cache.caches):
                qi, ki, vi = (B.narrow(a, 0, i, 1) for a in (q, k, v))
                out = B.set_slice(out, self._attend(qi, ki, vi, c, layer), 0, i)
        else:
            out = self._attend(q, k, v, cache, layer)
        out = B.reshape(B.transpose(out, (0, 2, 1, 3)), (b, t, self.n_heads * self.head_dim))
        return B.linear(out, self.o_proj)


class MLP:
    def __init__(self, B: Backend, w: Weights, p: str):
        self.B = B
        self.gate = w.linear(p + "gate_proj.weight")
        self.up = w.linear(p + "up_proj.weight")
        self.down = w.linear(p + "down_proj.weight")

    def __call__(self, x: Any) -> Any:
        B = self.B
        return B.linear(B.silu_mul(B.linear(x, self.gate), B.linear(x, self.up)), self.down)


class TransformerBlock:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, i: int):
        p = f"model.layers.{i}."
        self.B = B
        self.eps = args.rms_norm_eps
        self.index = i
        self.attn = Attention(args, B, w, p + "self_attn.")
        self.mlp = MLP(B, w, p + "mlp.")
        self.input_norm = w.dense(p + "input_layernorm.weight")
        self.post_norm = w.dense(p + "post_attention_layernorm.weight")

    def __call__(self, x: Any, cache: KVCache | BatchedCaches) -> Any:
        B = self.B
        h = B.add(x, self.attn(B.rms_norm(x, self.input_norm, self.eps), cache, self.index))
        return B.add(h, self.mlp(B.rms_norm(h, self.post_norm, self.eps)))


class Model:
    """Token ids in, logits out; the KV cache carries state between calls."""

    def __init__(self, args: ModelArgs, B: Backend, w: Weights):
        self.args = args
        self.B = B
        self.embed_tokens = w.linear("model.embed_tokens.weight")
        self.layers = [TransformerBlock(args, B, w, i) for i in range(args.num_hidden_layers)]
        self.norm = w.dense("model.norm.weight")
        tied = args.tie_word_embeddings or not w.has("lm_head.weight")
        self.lm_head = self.embed_tokens if tied else w.linear("lm_head.weight")

    def make_cache(self, max_len: int | None = None) -> KVCache:
        return KVCache(self.B, len(self.layers), max_len)

    def __call__(self, ids: Any, cache: KVCache | BatchedCaches, last_only: bool = False) -> Any:
        """ids: native int array (batch, seq). Returns logits (batch, seq or 1, vocab).
        With :class:`BatchedCaches` each row is a separate sequence (a batched decode step)."""
        B = self.B
        h = B.embedding(self.embed_tokens, ids)
        t = h.shape[1]
        for layer in self.layers:
            h = layer(h, cache)
        cache.advance(t)
        if last_only:
            h = B.narrow(h, 1, t - 1, 1)
        return B.linear(B.rms_norm(h, self.norm, self.args.rms_norm_eps), self.lm_head)
