"""BERT-style encoders, written against backend ops: BERT (all-MiniLM-L6-v2 and kin) and
XLM-RoBERTa (multilingual-e5, bge-m3), which differs only in where positions start: after
the pad id (``pad_token_id + 1``), so its position table's first rows are never used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.backends.base import Backend
from inference.errors import UnsupportedModelError
from inference.models.common import Weights, config_from_dict
from inference.validate import SPECS, register

# RoBERTa's family counts positions from pad_token_id + 1.
_OFFSET_POSITIONS = {"xlm-roberta", "roberta"}
for _name in _OFFSET_POSITIONS:
    register(_name, SPECS["bert"])

REQUIRED_OPS = frozenset({
    "embedding", "linear", "layer_norm", "attention", "gelu", "add", "reshape", "transpose",
})


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
    # GGUF's pooling enum (llama.cpp): -1 unset, 0 none, 1 mean, 2 cls, 3 last, 4 rank.
    pooling_type: int = -1

    def __post_init__(self) -> None:
        # The encoder computes erf GELU and pools three ways; anything else would give
        # vectors that look fine and are wrong, so it is refused by name.
        if self.hidden_act != "gelu":
            raise UnsupportedModelError(
                f"This {self.model_type} model uses activation '{self.hidden_act}'; Inferdesk's "
                "BERT encoder computes only 'gelu'.")
        if self.pooling_type not in (-1, 1, 2, 3):
            kind = {0: "none", 4: "rank"}.get(self.pooling_type, str(self.pooling_type))
            raise UnsupportedModelError(
                f"This {self.model_type} model pools its embeddings by '{kind}'; Inferdesk "
                "pools by mean, cls or last token.")
        _ = self.position_offset  # a pad id outside the position table is refused here

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
        return config_from_dict(cls, d)


class SelfAttention:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, p: str):
        self.B = B
        self.n_heads = args.num_attention_heads
        self.head_dim = args.hidden_size // args.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.eps = args.layer_norm_eps
        self.q = (w.linear(p + "self.query.weight"), w.dense(p + "self.query.bias"))
        self.k = (w.linear(p + "self.key.weight"), w.dense(p + "self.key.bias"))
        self.v = (w.linear(p + "self.value.weight"), w.dense(p + "self.value.bias"))
        self.out = (w.linear(p + "output.dense.weight"), w.dense(p + "output.dense.bias"))
        self.norm = (w.dense(p + "output.LayerNorm.weight"), w.dense(p + "output.LayerNorm.bias"))

    def _heads(self, x: Any) -> Any:
        b, t, _ = x.shape
        return self.B.transpose(self.B.reshape(x, (b, t, self.n_heads, self.head_dim)),
                                (0, 2, 1, 3))

    def __call__(self, x: Any, key_mask: Any) -> Any:
        B = self.B
        b, t, d = x.shape
        q, k, v = (self._heads(B.linear(x, *wb)) for wb in (self.q, self.k, self.v))
        a = B.attention(q, k, v, self.scale, key_mask=key_mask)
        a = B.reshape(B.transpose(a, (0, 2, 1, 3)), (b, t, d))
        return B.layer_norm(B.add(B.linear(a, *self.out), x), *self.norm, self.eps)


class Layer:
    def __init__(self, args: ModelArgs, B: Backend, w: Weights, i: int):
        p = f"encoder.layer.{i}."
        self.B = B
        self.eps = args.layer_norm_eps
        self.attention = SelfAttention(args, B, w, p + "attention.")
        self.up = (w.linear(p + "intermediate.dense.weight"),
                   w.dense(p + "intermediate.dense.bias"))
        self.down = (w.linear(p + "output.dense.weight"), w.dense(p + "output.dense.bias"))
        self.norm = (w.dense(p + "output.LayerNorm.weight"), w.dense(p + "output.LayerNorm.bias"))

    def __call__(self, x: Any, key_mask: Any) -> Any:
        B = self.B
        h = self.attention(x, key_mask)
        y = B.linear(B.gelu(B.linear(h, *self.up)), *self.down)
        return B.layer_norm(B.add(y, h), *self.norm, self.eps)


class Model:
    """Token ids and attention mask in, last hidden states (batch, seq, hidden) out."""

    def __init__(self, args: ModelArgs, B: Backend, w: Weights):
        self.args = args
        self.B = B
        self.word = w.linear("embeddings.word_embeddings.weight")
        self.position = w.dense_rows("embeddings.position_embeddings.weight",
                                     args.position_offset)
        self.token_type = w.dense("embeddings.token_type_embeddings.weight")
        self.norm = (w.dense("embeddings.LayerNorm.weight"), w.dense("embeddings.LayerNorm.bias"))
        self.layers = [Layer(args, B, w, i) for i in range(args.num_hidden_layers)]

    def __call__(self, ids: Any, positions: Any, type_ids: Any, key_mask: Any) -> Any:
        """ids, positions, type_ids: native int arrays (batch, seq); key_mask: (batch, seq).

        Single-segment inputs may pass type_ids of shape (batch, 1): it broadcasts.
        """
        B = self.B
        h = B.add(B.embedding(self.word, ids), B.embedding(self.position, positions))
        h = B.add(h, B.embedding(self.token_type, type_ids))
        h = B.layer_norm(h, *self.norm, self.args.layer_norm_eps)
        for layer in self.layers:
            h = layer(h, key_mask)
        return h

