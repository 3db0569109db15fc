"""Key/value cache held in the backend's own arrays (on the device for GPU backends)."""

from __future__ import annotations

from typing import Any

from inference.backends.base import Backend


class KVCache:
    """Per-layer K/V of shape (batch, kv_heads, capacity, head_dim), written in place.

    Capacity grows in ``step``-token chunks (or is fixed up front with ``max_len``) so a
    decode step writes one row instead of concatenating the whole history.
    """

    step = 256

    def __init__(self, backend: Backend, n_layers: int, max_len: int | None = None):
        self.B = backend
        self.keys: list[Any] = [None] * n_layers
        self.values: list[Any] = [None] * n_layers
        self.offset = 0  # tokens already cached (same for every layer)
        self.max_len = max_len

    def _ensure(self, layer: int, like: Any, needed: int) -> None:
        cur = self.keys[layer]
        cap = 0 if cur is None else cur.shape[2]
        if needed <= cap:
            return
        b, h, _, d = like.shape
        new_cap = self.max_len or ((needed + self.step - 1) // self.step) * self.step
        new_cap = max(new_cap, needed)
        for store in (self.keys, self.values):
            grown = self.B.zeros((b, h, new_cap, d))
            if store[layer] is not None and self.offset:
                kept = self.B.narrow(store[layer], 2, 0, self.offset)
                grown = self.B.set_slice(grown, kept, 2, 0)
            store[layer] = grown

    def update(self, layer: int, k: Any, v: Any) -> tuple[Any, Any]:
        """Append this step's k/v (b, h, t, d) and return the cached (b, h, offset+t, d)."""
        t = k.shape[2]
        self._ensure(layer, k, self.offset + t)
        self.keys[layer] = self.B.set_slice(self.keys[layer], k, 2, self.offset)
        self.values[layer] = self.B.set_slice(self.values[layer], v, 2, self.offset)
        n = self.offset + t
        return self.B.narrow(self.keys[layer], 2, 0, n), self.B.narrow(self.values[layer], 2, 0, n)

    def advance(self, t: int) -> None:
        """Called once per forward pass, after every layer has written its t new rows."""
        self.offset += t

    def trim(self, n: int) -> None:
        """Forget everything after the first ``n`` tokens (reuse a shared prompt prefix)."""
        self.offset = min(self.offset, n)


class BatchedCaches:
    """A decode step over several sequences at once: row ``i`` of the batch is its own
    sequence, with its own :class:`KVCache` and position. The model runs every weight
    (linear) op once over all rows and attention row by row, each against its own cache."""

    def __init__(self, caches: list[KVCache]):
        self.caches = caches

    def advance(self, t: int) -> None:
        for c in self.caches:
            c.advance(t)
