"""BERT-style encoders, one configurable post-norm block written against backend ops:

    model_type   positions                      q, k, v                MLP                biases
    bert         learned table from row 0       three linears          GELU (erf)         all
    xlm-roberta  learned table after the pad id three linears          GELU               all
    roberta      as xlm-roberta
    nomic_bert   RoPE on whole heads (NeoX      one fused linear,      SwiGLU:            norms
                 half-split), base rope_theta   rows [q; k; v]         silu(gate) * up    only

Every block is ``h = LN(x + attn(x)); out = LN(h + mlp(h))`` over embeddings
``LN(word [+ position] + type)``. XLM-RoBERTa counts positions from ``pad_token_id + 1``, so
its table's first rows are never used. nomic_bert (nomic-embed-text v1, v1.5) reaches the
model in transformers' names and config fields; the Hub's own layout (contrastors' tensor
names, which transformers also writes, and GPT-2-style config keys) and llama.cpp's
``nomic-bert`` GGUF are mapped to them by the readers in :mod:`inference.formats`; the fused
Wqkv that every one of them stores stays one tensor, ``self_attn.qkv_proj``. Settings of
the Hub's config that would change the math are refused at load, each by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.backends.base import Backend
from inference.errors import UnsupportedModelError
from inference.formats.tensor import MAX_LAYERS
from inference.models.common import Weights, check_token_ids, config_from_dict
from inference.validate import SPECS, ArchSpec, register

# RoBERTa's family counts positions from pad_token_id + 1.
_OFFSET_POSITIONS = {"xlm-roberta", "roberta"}
for _name in _OFFSET_POSITIONS:
    register(_name, SPECS["bert"])
_ROTARY = {"nomic_bert"}
# The Hub's nomic_bert config keys (contrastors' NomicBertConfig) whose other values change
# the math, with the one this encoder computes.
_NOMIC_FIXED: dict[str, Any] = {
    "activation_function": "swiglu", "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False, "rotary_scaling_factor": None,
    "rotary_emb_scale_base": None, "prenorm": False, "parallel_block": False,
    "use_rms_norm": False, "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
}
# Activation -> op: plain for BERT's MLP, gated (act(gate) * up) for nomic_bert's.
_PLAIN_ACT = {"gelu": "gelu"}
_GATED_ACT = {"silu": "silu_mul"}

REQUIRED_OPS = frozenset({
    "embedding", "linear", "layer_norm", "attention", "gelu", "add", "reshape", "transpose",
    "narrow", "rope", "silu_mul",
})


@dataclass(frozen=True)
class Names:
    """One architecture's tensor names inside layer ``layer`` (``{i}`` its index)."""

    layer: str
    qkv: tuple[str, ...]  # q, k, v; or one name: a tensor of [q; k; v] rows
    out: str
    attn_norm: str
    up: str
    gate: str | None  # gated MLP
    down: str
    out_norm: str
    biases: bool  # linears have biases (LayerNorms always do)


BERT_NAMES = Names(
    layer="encoder.layer.{i}.",
    qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
    out="attention.output.dense",
    attn_norm="attention.output.LayerNorm", up="intermediate.dense", gate=None,
    down="output.dense", out_norm="output.LayerNorm", biases=True)
NOMIC_NAMES = Names(
    layer="layers.{i}.", qkv=("self_attn.qkv_proj",), out="self_attn.o_proj",
    attn_norm="post_attention_layernorm",
    up="mlp.up_proj", gate="mlp.gate_proj", down="mlp.down_proj",
    out_norm="post_mlp_layernorm", biases=False)
NAMES = {"nomic_bert": NOMIC_NAMES}

register("nomic_bert", ArchSpec(
    positive=("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "vocab_size", "max_position_embeddings", "type_vocab_size"),
    at_most={"num_hidden_layers": MAX_LAYERS},
    finite_positive=("layer_norm_eps", "rope_theta"),
    tensors={
        "embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
        "embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
        "embeddings.LayerNorm.weight": ("hidden_size",),
        "embeddings.LayerNorm.bias": ("hidden_size",),
        "layers.{i}.self_attn.qkv_proj.weight": ("qkv_rows", "hidden_size"),
        "layers.{i}.self_attn.o_proj.weight": ("hidden_size", "num_attention_heads*head_dim"),
        "layers.{i}.mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
        "layers.{i}.mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
        "layers.{i}.mlp.down_proj.weight": ("hidden_size", "intermediate_size"),
        **{f"layers.{{i}}.{n}.{k}": ("hidden_size",) for n in (
            "post_attention_layernorm", "post_mlp_layernorm") for k in ("weight", "bias")},
    },
))


@dataclass
class ModelArgs:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int | None = None
    head_dim: int | None = None
    position_embedding_type: str = "absolute"
    rope_theta: float = 10000.0
    # GGUF's pooling enum (llama.cpp): -1 unset, 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    pooling_type: int = -1

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type in _ROTARY:
            self.position_embedding_type = "rotary"
        elif self.position_embedding_type != "absolute":
            raise UnsupportedModelError(
                f"This {self.model_type} model uses '{self.position_embedding_type}' position "
                f"embeddings; Inferdesk's {self.model_type} encoder computes only absolute ones.")
        if self.rotary and self.head_dim % 2:
            raise UnsupportedModelError(
                f"This {self.model_type} model has heads of {self.head_dim} dimensions; RoPE "
                "rotates pairs, so it needs an even number.")
        # The encoder computes erf GELU (BERT) or SiLU-gated (nomic) MLPs and pools three
        # ways; anything else would give vectors that look fine and are wrong, so it is
        # refused by name.
        acts = _GATED_ACT if self.gated else _PLAIN_ACT
        if self.hidden_act not in acts:
            raise UnsupportedModelError(
                f"This {self.model_type} model uses activation '{self.hidden_act}'; Inferdesk's "
                f"{self.model_type} encoder computes only '{next(iter(acts))}'.")
        if self.pooling_type not in (-1, 1, 2, 3):
            kind = {0: "none", 4: "rank"}.get(self.pooling_type, str(self.pooling_type))
            raise UnsupportedModelError(
                f"This {self.model_type} model pools its embeddings by '{kind}'; Inferdesk "
                "pools by mean, cls or last token.")
        _ = self.position_offset  # a pad id outside the position table is refused here

    @property
    def rotary(self) -> bool:
        return self.position_embedding_type == "rotary"

    @property
    def gated(self) -> bool:
        return self.names.gate is not None

    @property
    def names(self) -> Names:
        return NAMES.get(self.model_type, BERT_NAMES)

    @property
    def qkv_rows(self) -> int:
        """Rows of a fused [q; k; v] weight."""
        return 3 * self.num_attention_heads * self.head_dim

    @property
    def mlp_op(self) -> str:
        return (_GATED_ACT if self.gated else _PLAIN_ACT)[self.hidden_act]

    @property
    def position_offset(self) -> int:
        """Row of the position table that the first token uses."""
        if self.model_type not in _OFFSET_POSITIONS:
            return 0
        if self.pad_token_id is None or not 0 <= self.pad_token_id < self.max_position_embeddings:
            raise UnsupportedModelError(
                f"This {self.model_type} model's pad_token_id is {self.pad_token_id!r}; its "
                "positions start after it, so it must be a row of the position table.")
        return self.pad_token_id + 1

    @property
    def n_positions(self) -> int:
        """Tokens one input may hold."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelArgs:
        if d.get("model_type") in _ROTARY:
            d = _nomic_config(d)
        return config_from_dict(cls, d)


def _nomic_config(d: dict[str, Any]) -> dict[str, Any]:
    """transformers' nomic_bert defaults (SiLU, RoPE base 1000) under ``d``, its RoPE base
    out of ``rope_parameters``; the Hub's settings this encoder does not compute refused."""
    experts = d.get("moe_every_n_layers") or d.get("num_experts")
    if experts:
        raise UnsupportedModelError(
            "This nomic_bert model is a mixture of experts (nomic-embed-text-v2-moe's kind), "
            "which Inferdesk's nomic-bert encoder does not compute.")
    for key, want in _NOMIC_FIXED.items():
        if key in d and d[key] != want:
            raise UnsupportedModelError(
                f"This nomic_bert model sets {key} to {d[key]!r}; Inferdesk's nomic-bert "
                f"encoder computes only {want!r}.")
    params = d.get("rope_parameters")
    out = {"hidden_act": "silu", "rope_theta": 1000.0, **d}
    if isinstance(params, dict):
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise UnsupportedModelError(
                f"This nomic_bert model uses RoPE scaling '{kind}', which Inferdesk's "
                "nomic-bert encoder does not compute.")
        if params.get("rope_theta") is not None:
            out["rope_theta"] = params["rope_theta"]
    return out


class SelfAttention:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str):
        n = args.names
        self.B = B
        self.n_heads = args.num_attention_heads
        self.head_dim = args.head_dim
        self.scale = self.head_dim ** -0.5
        self.eps = args.layer_norm_eps
        self.theta = args.rope_theta if args.rotary else None
        sizes = [self.n_heads * self.head_dim] * 3
        if len(n.qkv) == 1:
            self.qkv = w.linears([], fused=f"{p}{n.qkv[0]}.weight", sizes=sizes)
        else:
            biases = [f"{p}{x}.bias" for x in n.qkv] if n.biases else None
            for b in biases or []:
                w.tensor(b)  # present, or refused by name (linears would read it as zeros)
            self.qkv = w.linears([f"{p}{x}.weight" for x in n.qkv], biases)
        self.out = _linear(w, p + n.out, n.biases)
        self.norm = (w.dense(f"{p}{n.attn_norm}.weight"), w.dense(f"{p}{n.attn_norm}.bias"))

    def _heads(self, x: Any, rotate: bool = False) -> Any:
        b, t, _ = x.shape
        x = self.B.transpose(self.B.reshape(x, (b, t, self.n_heads, self.head_dim)),
                             (0, 2, 1, 3))
        return self.B.rope(x, 0, self.theta) if rotate and self.theta is not None else x

    def __call__(self, x: Any, key_mask: Any, starts: Any = None) -> Any:
        """``starts``: x is inputs packed back to back (Model.packed), else padded."""
        B = self.B
        b, t, _ = x.shape
        q, k, v = self.qkv(x)
        if starts is not None:
            a = B.attention_packed(q, k, v, self.n_heads, self.scale, starts)
        else:
            q, k, v = self._heads(q, rotate=True), self._heads(k, rotate=True), self._heads(v)
            a = B.attention(q, k, v, self.scale, key_mask=key_mask)
            a = B.reshape(B.transpose(a, (0, 2, 1, 3)), (b, t, self.n_heads * self.head_dim))
        return B.linear_add_norm(a, *self.out, x, *self.norm, self.eps)


class MLP:
    """``down(act(up(x)))`` (BERT) or ``down(act(gate(x)) * up(x))`` (nomic's SwiGLU)."""

    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str):
        n = args.names
        self.B = B
        self.act = getattr(B, args.mlp_op)
        if n.gate is not None:
            self.gate_up = w.linears([f"{p}{n.gate}.weight", f"{p}{n.up}.weight"])
        else:
            self.up = _linear(w, p + n.up, n.biases)
            self.gate_up = None
        self.down = _linear(w, p + n.down, n.biases)

    def hidden(self, x: Any) -> Any:
        """The activations the down projection reads (``self.down`` is applied by Layer,
        with the residual and norm after it)."""
        if self.gate_up is not None:
            return self.act(*self.gate_up(x))
        return self.B.linear_gelu(x, *self.up)  # the one plain activation (_PLAIN_ACT)


def _linear(w: Weights, name: str, bias: bool) -> tuple[Any, Any]:
    return w.linear(name + ".weight"), w.dense(name + ".bias") if bias else None


class Layer:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, i: int):
        n = args.names
        p = n.layer.format(i=i)
        self.B = B
        self.eps = args.layer_norm_eps
        self.attention = SelfAttention(args, B, w, p)
        self.mlp = MLP(args, B, w, p)
        self.norm = (w.dense(f"{p}{n.out_norm}.weight"), w.dense(f"{p}{n.out_norm}.bias"))

    def __call__(self, x: Any, key_mask: Any, starts: Any = None) -> Any:
        h = self.attention(x, key_mask, starts)
        return self.B.linear_add_norm(self.mlp.hidden(h), *self.mlp.down, h, *self.norm,
                                      self.eps)


class Model:
    """Token ids and attention mask in, last hidden states (batch, seq, hidden) out."""

    def __init__(self, args: ModelArgs, B: Backend, w: Weights):
        self.args = args
        self.B = B
        self.word = w.linear("embeddings.word_embeddings.weight")
        self.position = None if args.rotary else w.dense_rows(
            "embeddings.position_embeddings.weight", args.position_offset)
        self.token_type = w.dense("embeddings.token_type_embeddings.weight")
        self.norm = (w.dense("embeddings.LayerNorm.weight"), w.dense("embeddings.LayerNorm.bias"))
        self.layers = [Layer(args, B, w, i) for i in range(args.num_hidden_layers)]

    def __call__(self, ids: Any, positions: Any, type_ids: Any, key_mask: Any) -> Any:
        """ids, positions, type_ids: native int arrays (batch, seq); key_mask: (batch, seq).

        Single-segment inputs may pass type_ids of shape (batch, 1): it broadcasts. Rotary
        models read no positions: every row starts at 0 (inputs are right-padded).
        """
        h = self._embed(ids, positions, type_ids)
        for layer in self.layers:
            h = layer(h, key_mask)
        return h

    @property
    def packs(self) -> bool:
        """Whether :meth:`packed` runs here: the backend packs rows (``packs_rows``) and
        positions come from a table (RoPE models rotate per padded row: they stay padded)."""
        return self.B.packs_rows and self.position is not None

    def packed(self, ids: Any, positions: Any, type_ids: Any, starts: Any) -> Any:
        """Inputs back to back without padding: ids, positions, type_ids as in
        :meth:`__call__` for one row (1, N) of tokens, input ``i`` being tokens
        ``starts[i] .. starts[i + 1]`` (a host int array), each with positions from 0.
        Every linear runs over the N real tokens only; attention stays within each
        input. Returns (1, N, hidden)."""
        h = self._embed(ids, positions, type_ids)
        for layer in self.layers:
            h = layer(h, None, starts)
        return h

    def _embed(self, ids: Any, positions: Any, type_ids: Any) -> Any:
        B = self.B
        check_token_ids(B, ids, self.args.vocab_size)
        h = B.embedding(self.word, ids)
        if self.position is not None:
            h = B.add(h, B.embedding(self.position, positions))
        h = B.add(h, B.embedding(self.token_type, type_ids))
        return B.layer_norm(h, *self.norm, self.args.layer_norm_eps)
