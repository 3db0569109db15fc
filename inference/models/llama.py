"""The decoder-only transformer family, one configurable block, written against backend ops.

Llama (1-3.x, SmolLM2), Mistral, Qwen2, Qwen3, Gemma (1) and Phi-3 differ only in switches
of one block:

    model_type  q/k/v bias  q/k RMSNorm  MLP        norms         other
    llama       no          no           SiLU       w             RoPE linear/llama3 scaling
    mistral     no          no           SiLU       w
    qwen2       yes         no           SiLU       w
    qwen3       no          per head     SiLU       w
    gemma       no          no           GELU-tanh  (1 + w)       embeddings x sqrt(hidden)
    gemma2      no          no           GELU-tanh  (1 + w), 4    + soft-caps, sliding layers
    gemma3_text no          per head     GELU-tanh  (1 + w), 4    + local/global RoPE bases
    phi3        no          no           SiLU       w             fused qkv / gate_up, LongRoPE

"4" norms: before and after attention and before and after the MLP (Gemma 2/3). Sliding
layers (``layer_types``) attend to the last ``sliding_window`` positions and their cache
keeps no more than that (:class:`~inference.kv_cache.KVCache`).

Every switch is a Hugging Face config field (or implied by ``model_type``, as the HF classes
do), so a checkpoint's config.json builds the model unchanged. Tied embeddings: no
``lm_head.weight`` (or ``tie_word_embeddings``) reuses the embedding table. GGUF files of
Gemma store ``1 + w`` already (llama.cpp's converter adds it): their config says
``norm_weight_offset`` 0.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.backends.base import Backend
from inference.errors import UnsupportedModelError
from inference.kv_cache import BatchedCaches, KVCache
from inference.models import rope
from inference.models.common import Weights, check_token_ids, config_from_dict

REQUIRED_OPS = frozenset({
    "embedding", "linear", "rms_norm", "rope", "attention", "silu_mul", "gelu_tanh_mul", "add",
    "mul", "softcap", "reshape", "transpose", "zeros", "set_slice", "narrow", "sample",
})

_BIASED = {"qwen2"}  # q/k/v biases whatever the config says (HF hard-codes them)
_QK_NORM = {"qwen3", "gemma3_text"}  # RMSNorm over each head's q and k before RoPE
_GEMMA = {"gemma", "gemma2", "gemma3_text"}  # (1 + w) norms, x sqrt(hidden), tied lm_head
_SANDWICH = {"gemma2", "gemma3_text"}  # norms after attention and MLP as well as before
_FUSED = {"phi3"}  # qkv_proj = [q; k; v] rows, gate_up_proj = [gate; up] rows
_ACTIVATIONS = {"silu": "silu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul",
                "gelu_tanh": "gelu_tanh_mul"}


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
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    hidden_activation: str | None = None  # Gemma's name for hidden_act
    partial_rotary_factor: float = 1.0
    norm_weight_offset: float | None = None  # not HF: 1.0 for Gemma safetensors, 0 in GGUF
    embed_scale: bool = False
    fused_projections: bool = False
    attention_factor: float = 1.0  # LongRoPE's cos/sin scale (set by from_dict)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: list[str] | None = None  # "sliding_attention" / "full_attention" per layer
    rope_local_base_freq: float | None = None  # RoPE theta of sliding layers (Gemma 3)
    sandwich_norms: bool = False

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        self.attention_bias = self.attention_bias or self.model_type in _BIASED
        self.qk_norm = self.qk_norm or self.model_type in _QK_NORM
        gemma = self.model_type in _GEMMA
        self.embed_scale = self.embed_scale or gemma
        self.tie_word_embeddings = self.tie_word_embeddings or gemma
        self.fused_projections = self.fused_projections or self.model_type in _FUSED
        self.sandwich_norms = self.sandwich_norms or self.model_type in _SANDWICH
        if self.layer_types is None or self.model_type not in _GEMMA:
            # Windows only where a Gemma config declares them; Mistral/Qwen2 windows stay
            # a context limit (CausalLM), as before.
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if self.norm_weight_offset is None:
            self.norm_weight_offset = 1.0 if gemma else 0.0
        act = self.hidden_activation or self.hidden_act
        if act not in _ACTIVATIONS:
            raise UnsupportedModelError(
                f"This {self.model_type} model uses the activation '{act}', which Inferdesk "
                f"does not support (supported: {', '.join(_ACTIVATIONS)}).")
        if self.partial_rotary_factor != 1.0:
            raise UnsupportedModelError(
                f"This {self.model_type} model rotates only part of each head "
                f"(partial_rotary_factor {self.partial_rotary_factor}), which Inferdesk does "
                "not support yet.")

    def window(self, layer: int) -> int | None:
        sliding = self.layer_types[layer] == "sliding_attention"
        return self.sliding_window if sliding and self.sliding_window else None

    def theta(self, layer: int) -> float:
        if self.window(layer) is not None and self.rope_local_base_freq is not None:
            return self.rope_local_base_freq
        return self.rope_theta

    @property
    def mlp_op(self) -> str:
        return _ACTIVATIONS[self.hidden_activation or self.hidden_act]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelArgs:
        # transformers >= 5 writes the RoPE settings inside "rope_parameters" (theta and
        # scaling in one dict); earlier versions write rope_theta and rope_scaling.
        params = d.get("rope_parameters")
        if isinstance(params, dict) and "full_attention" in params:
            # Gemma 3: one RoPE per layer type; scaling (linear) applies to the global layers.
            local = params.get("sliding_attention", {})
            d = {**d, "rope_local_base_freq": local.get("rope_theta")}
            params = params["full_attention"]
            d = {**d, "rope_parameters": params}
        if isinstance(params, dict):
            d = {**d, "rope_theta": d.get("rope_theta") or params.get("rope_theta"),
                 "rope_scaling": d.get("rope_scaling") or params}
        scaling = d.get("rope_scaling")
        rope.check_supported(scaling, d.get("model_type", "llama"))
        if rope.rope_kind(scaling) == "default":
            d = {**d, "rope_scaling": None}
        d = {**d, "attention_factor": rope.attention_factor(scaling, d)}
        original = rope.original_context(scaling, d)
        if original is not None:  # LongRoPE runs to its original context (short factors)
            d["max_position_embeddings"] = min(original, d.get("max_position_embeddings",
                                                                 original))
        return config_from_dict(cls, d)


class Attention:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str, freq_factors: Any,
                 layer: int):
        self.B = B
        self.n_heads = args.num_attention_heads
        self.n_kv = args.num_key_value_heads
        self.head_dim = args.head_dim
        # LongRoPE scales cos and sin, so q.k by the factor's square.
        base = args.query_pre_attn_scalar or self.head_dim
        self.scale = base ** -0.5 * args.attention_factor ** 2
        self.softcap = args.attn_logit_softcapping
        self.window = args.window(layer)
        self.theta = args.theta(layer)
        self.freq_factors = freq_factors
        self.eps = args.rms_norm_eps
        sizes = [n * self.head_dim for n in (self.n_heads, self.n_kv, self.n_kv)]
        self.qkv = w.linears(
            [p + f"{n}_proj.weight" for n in "qkv"],
            [p + f"{n}_proj.bias" for n in "qkv"] if args.attention_bias else None,
            fused=p + "qkv_proj.weight" if args.fused_projections else None, sizes=sizes)
        self.o_proj = w.linear(p + "o_proj.weight")
        off = args.norm_weight_offset
        self.q_norm = w.norm(p + "q_norm.weight", off) if args.qk_norm else None
        self.k_norm = w.norm(p + "k_norm.weight", off) if args.qk_norm else None

    def _heads(self, x: Any, n: int, norm: Any = None) -> Any:
        B = self.B
        b, t, _ = x.shape
        x = B.reshape(x, (b, t, n, self.head_dim))
        if norm is not None:
            x = B.rms_norm(x, norm, self.eps)
        return B.transpose(x, (0, 2, 1, 3))

    def __call__(self, x: Any, cache: KVCache | BatchedCaches, layer: int) -> Any:
        B = self.B
        b, t, _ = x.shape
        q, k, v = self.qkv(x)
        q = self._heads(q, self.n_heads, self.q_norm)
        k = self._heads(k, self.n_kv, self.k_norm)
        v = self._heads(v, self.n_kv)
        kw = {"theta": self.theta, "freq_factors": self.freq_factors, "scale": self.scale,
              "window": self.window, "softcap": self.softcap}
        if isinstance(cache, BatchedCaches):  # one sequence per row, each at its own position
            out = B.attend_rows(q, k, v, cache.caches, layer, **kw)
        elif t == 1 and b == 1:  # decode: the same step as one row of a batched one
            out = B.attend_rows(q, k, v, [cache], layer, **kw)
        else:
            out = B.attend_cached(q, k, v, cache, layer, **kw)
        out = B.reshape(B.transpose(out, (0, 2, 1, 3)), (b, t, self.n_heads * self.head_dim))
        return B.linear(out, self.o_proj)


class MLP:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str):
        self.B = B
        self.act = getattr(B, args.mlp_op)  # act(gate) * up, fused
        n = args.intermediate_size
        self.gate_up = w.linears(
            [p + "gate_proj.weight", p + "up_proj.weight"],
            fused=p + "gate_up_proj.weight" if args.fused_projections else None, sizes=[n, n])
        self.down = w.linear(p + "down_proj.weight")

    def __call__(self, x: Any) -> Any:
        return self.B.linear(self.act(*self.gate_up(x)), self.down)


class TransformerBlock:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, i: int, freq_factors: Any):
        p = f"model.layers.{i}."
        self.B = B
        self.eps = args.rms_norm_eps
        self.index = i
        self.attn = Attention(args, B, w, p + "self_attn.", freq_factors, i)
        self.mlp = MLP(args, B, w, p + "mlp.")
        off = args.norm_weight_offset
        self.input_norm = w.norm(p + "input_layernorm.weight", off)
        if args.sandwich_norms:  # Gemma 2/3: post_attention_layernorm follows attention
            self.post_attn_norm = w.norm(p + "post_attention_layernorm.weight", off)
            self.pre_mlp_norm = w.norm(p + "pre_feedforward_layernorm.weight", off)
            self.post_mlp_norm = w.norm(p + "post_feedforward_layernorm.weight", off)
        else:  # Llama: post_attention_layernorm is the norm before the MLP
            self.post_attn_norm = self.post_mlp_norm = None
            self.pre_mlp_norm = w.norm(p + "post_attention_layernorm.weight", off)

    def _post(self, x: Any, norm: Any) -> Any:
        return x if norm is None else self.B.rms_norm(x, norm, self.eps)

    def __call__(self, x: Any, cache: KVCache | BatchedCaches) -> Any:
        B = self.B
        fused = B.decode_layer(self, x, cache)  # None: op by op below
        if fused is not None:
            return fused
        a = self.attn(B.rms_norm(x, self.input_norm, self.eps), cache, self.index)
        h = B.add(x, self._post(a, self.post_attn_norm))
        m = self.mlp(B.rms_norm(h, self.pre_mlp_norm, self.eps))
        return B.add(h, self._post(m, self.post_mlp_norm))


def _freq_factors(args: ModelArgs, B: Backend, w: Weights) -> Any:
    """GGUF files carry the factors as tensors (llama3: ``rope_freqs``, Phi-3 LongRoPE:
    ``rope_factors_short``); HF configs describe them."""
    for name in ("rope_freqs.weight", "rope_factors_short.weight"):
        if w.has(name):
            return w.dense(name)
    f = rope.freq_factors(args.rope_scaling, args.head_dim, args.rope_theta)
    return None if f is None else B.array(f)


class Model:
    """Token ids in, logits out; the KV cache carries state between calls."""

    def __init__(self, args: ModelArgs, B: Backend, w: Weights):
        self.args = args
        self.B = B
        self.embed_tokens = w.linear("model.embed_tokens.weight")
        ff = _freq_factors(args, B, w)  # scaled RoPE: the global layers' (Gemma 3)
        self.layers = [TransformerBlock(args, B, w, i, None if args.window(i) else ff)
                       for i in range(args.num_hidden_layers)]
        self.norm = w.norm("model.norm.weight", args.norm_weight_offset)
        # Gemma: x sqrt(hidden), rounded to float32 as transformers does.
        self.embed_scale = float(np.float32(args.hidden_size ** 0.5)) if args.embed_scale \
            else None
        tied = args.tie_word_embeddings or not w.has("lm_head.weight")
        self.lm_head = self.embed_tokens if tied else w.linear("lm_head.weight")

    def make_cache(self, max_len: int | None = None) -> KVCache:
        return KVCache(self.B, len(self.layers), max_len,
                       windows=[layer.attn.window for layer in self.layers])

    def __call__(self, ids: Any, cache: KVCache | BatchedCaches, last_only: bool = False) -> Any:
        """ids: native int array (batch, seq). Returns logits (batch, seq or 1, vocab).
        With :class:`BatchedCaches` each row is a separate sequence (a batched decode step)."""
        return _result(self.layer_by_layer(ids, cache, last_only))

    def layer_by_layer(self, ids: Any, cache: KVCache | BatchedCaches, last_only: bool = False
                       ) -> Generator[Any, None, Any]:
        """This very forward pass, one layer per ``next()``: it pauses (yielding the hidden
        state) after every layer but the last, and the last ``next()`` runs the last layer,
        the final norm and the lm_head and returns the logits (``StopIteration.value``).
        The calls and their inputs are those of ``__call__``, so the logits are too: the
        server spreads a long prefill chunk over several steps this way. Nothing else may
        write ``cache`` until it returns (its offset moves only at the end)."""
        h = yield from self._stack(ids, cache, last_only)
        logits = self.B.linear(h, self.lm_head)
        cap = self.args.final_logit_softcapping
        return logits if cap is None else self.B.softcap(logits, cap)

    def hidden_states(self, ids: Any, cache: KVCache | BatchedCaches,
                      last_only: bool = False) -> Any:
        """The final norm's output (batch, seq or 1, hidden): what the lm_head reads, and
        what a decoder embedder pools."""
        return _result(self._stack(ids, cache, last_only))

    def _stack(self, ids: Any, cache: KVCache | BatchedCaches, last_only: bool
               ) -> Generator[Any, None, Any]:
        B = self.B
        check_token_ids(B, ids, self.args.vocab_size)
        h = B.embedding(self.embed_tokens, ids)
        if self.embed_scale is not None:
            h = B.mul(h, self.embed_scale)
        t = h.shape[1]
        for i, layer in enumerate(self.layers):
            if i:
                yield h
            h = layer(h, cache)
        cache.advance(t)
        if last_only:
            h = B.narrow(h, 1, t - 1, 1)
        return B.rms_norm(h, self.norm, self.args.rms_norm_eps)


def _result(steps: Generator[Any, None, Any]) -> Any:
    """Run a paused computation to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
