"""What the token loop and the embedding planner need of a model: the types a reader (or
a tool) follows from ``generate``/``embed`` to a model and from there to backend ops.
Every architecture's ``Model`` satisfies one of these structurally."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from inference.backends.base import Backend
from inference.kv_cache import KVCache


class CausalModel(Protocol):
    """A decoder: token ids (batch, seq) in, logits out; the KV cache carries the state."""

    B: Backend

    def make_cache(self, max_len: int | None = None) -> KVCache: ...

    def __call__(self, ids: Any, cache: KVCache, last_only: bool = False) -> Any: ...

    def layer_by_layer(self, ids: Any, cache: KVCache, last_only: bool = False
                       ) -> Generator[Any, None, Any]:
        """``__call__`` paused after each layer but the last; returns the logits."""
        ...


class EncoderModel(Protocol):
    """An encoder: token ids, positions, token types and a padding mask in, hidden states
    (batch, seq, hidden) out."""

    B: Backend

    def __call__(self, ids: Any, positions: Any, type_ids: Any, key_mask: Any) -> Any: ...
