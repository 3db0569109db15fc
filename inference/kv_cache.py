"""Key/value cache held in the backend's own arrays (on the device for GPU backends)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class KVArrays(Protocol):
    """What a cache asks of its backend (``inference.backends.base.Backend`` has it): the
    cache sits below the backends, which hold caches, so it names only these three."""

    def kv_zeros(self, shape: tuple[int, ...]) -> Any: ...

    def set_slice(self, dst: Any, src: Any, axis: int, start: int) -> Any: ...

    def narrow(self, x: Any, axis: int, start: int, length: int) -> Any: ...


class KVCache:
    """Per-layer K/V of shape (batch, kv_heads, capacity, head_dim), written in place.

    Capacity grows in ``step``-token chunks (or is fixed up front with ``max_len``) so a
    decode step writes one row instead of concatenating the whole history.

    Sliding-window layers (``windows[layer] = w``) keep only what a later query can see:
    when a write would not fit, the last ``w - 1`` rows move to the front and the older ones
    are dropped, so such a layer holds at most ``w - 1 + max(step, tokens of one call)``
    rows however long the context. ``start[layer]`` is the position of its row 0, and
    :meth:`layer_offset` the row of the first new token (attention's causal offset).

    A cache knows which of its leading rows hold another cache's bits (:meth:`copy_prefix`
    records it, :meth:`trim` and a new copy retire it; :func:`shared_rows`), so a batched
    decode step can read a prompt prefix that several sequences copied once.
    """

    step = 256

    def __init__(self, backend: KVArrays, n_layers: int, max_len: int | None = None,
                 windows: Sequence[int | None] | None = None):
        self.B = backend
        self.keys: list[Any] = [None] * n_layers
        self.values: list[Any] = [None] * n_layers
        self.offset = 0  # tokens already cached (same for every layer)
        self.max_len = max_len
        self.windows = list(windows) if windows is not None else [None] * n_layers
        self.start = [0] * n_layers
        # Where rows came from: ``_own`` names this cache's rows as written; ``_from[t] = n``
        # says rows [0, n) hold the same bits as those of the cache named t (a copied
        # prefix). A name is retired when its rows are overwritten (copy_prefix, trim).
        self._own = object()
        self._from: dict[object, int] = {}

    def layer_offset(self, layer: int) -> int:
        return self.offset - self.start[layer]

    def _ensure(self, layer: int, like: Any, needed: int) -> None:
        cur = self.keys[layer]
        cap = 0 if cur is None else cur.shape[2]
        if needed <= cap:
            return
        b, h, _, d = like.shape
        fixed = self.max_len if self.windows[layer] is None else None
        new_cap = fixed or ((needed + self.step - 1) // self.step) * self.step
        new_cap = max(new_cap, needed)
        rows = self.layer_offset(layer)
        for store in (self.keys, self.values):
            grown = self.B.kv_zeros((b, h, new_cap, d))
            if store[layer] is not None and rows:
                kept = self.B.narrow(store[layer], 2, 0, rows)
                grown = self.B.set_slice(grown, kept, 2, 0)
            store[layer] = grown

    def _slide(self, layer: int, like: Any, t: int) -> None:
        """Drop rows no query from position ``offset`` on can see, if the write needs room."""
        rows = self.layer_offset(layer)
        cur = self.keys[layer]
        keep = min(rows, self.windows[layer] - 1)
        if cur is None or rows + t <= cur.shape[2] or keep == rows:
            return
        b, h, _, d = like.shape
        cap = max(keep + t, ((keep + t + self.step - 1) // self.step) * self.step)
        for store in (self.keys, self.values):
            moved = self.B.kv_zeros((b, h, cap, d))
            if keep:
                moved = self.B.set_slice(moved, self.B.narrow(store[layer], 2, rows - keep,
                                                              keep), 2, 0)
            store[layer] = moved
        self.start[layer] += rows - keep

    def update(self, layer: int, k: Any, v: Any) -> tuple[Any, Any]:
        """Append this step's k/v (b, h, t, d) and return the cached rows (b, h, n, d): every
        token so far, or on a sliding-window layer those from ``start[layer]`` on."""
        t = k.shape[2]
        if self.windows[layer] is not None:
            self._slide(layer, k, t)
        row = self.layer_offset(layer)
        self._ensure(layer, k, row + t)
        self.keys[layer] = self.B.set_slice(self.keys[layer], k, 2, row)
        self.values[layer] = self.B.set_slice(self.values[layer], v, 2, row)
        n = row + t
        return self.B.narrow(self.keys[layer], 2, 0, n), self.B.narrow(self.values[layer], 2, 0, n)

    def reserve(self, layer: int, like: Any, rows: int) -> None:
        """Room for ``rows`` rows in ``layer``'s buffers (grown as :meth:`update` grows
        them), for a backend that writes the rows itself (a fused decode step)."""
        self._ensure(layer, like, rows)

    def advance(self, t: int) -> None:
        """Called once per forward pass, after every layer has written its t new rows."""
        self.offset += t

    def copy_prefix(self, src: KVCache, n: int) -> bool:
        """Make the first ``n`` tokens of this cache those of ``src`` (rows copied: a
        prompt prefix shared between requests), for a cache holding at most ``n``. False,
        and nothing copied, when ``src`` holds fewer than ``n`` tokens or a sliding-window
        layer of either already dropped rows."""
        if not self.offset <= n <= src.offset or any(src.start) or any(self.start):
            return False
        self._own = object()  # rows [0, n) are overwritten: nobody holds these as ours
        self._from = {t: min(r, n) for t, r in src._from.items()}
        self._from[src._own] = n
        for layer in range(len(self.keys)):
            k = self.B.narrow(src.keys[layer], 2, 0, n)
            self._ensure(layer, k, n)
            for store, from_ in ((self.keys, src.keys), (self.values, src.values)):
                store[layer] = self.B.set_slice(store[layer], self.B.narrow(from_[layer], 2, 0, n),
                                                2, 0)
        self.offset = n
        return True

    def trim(self, n: int) -> None:
        """Forget everything after the first ``n`` tokens (reuse a shared prompt prefix).
        A sliding-window layer that already dropped rows the next query needs cannot
        go back: then the whole cache is forgotten (the caller recomputes from 0)."""
        n = min(self.offset, n)
        pairs = zip(self.windows, self.start, strict=True)
        if any(w is not None and s > max(0, n - w + 1) for w, s in pairs):
            n = 0
        if n < self.offset:  # rows from n on will be written again
            self._from = {t: min(r, n) for t, r in self._from.items()}
            self._from[self._own] = n
            self._own = object()
        self.offset = n
        if n == 0:
            self.start = [0] * len(self.start)


def row_sources(c: KVCache) -> dict[object, int]:
    """Names of row contents -> how many leading rows of ``c`` hold them (its own rows
    included); empty once a sliding window has dropped rows."""
    return {} if any(c.start) else {**c._from, c._own: c.offset}


def shared_rows(a: KVCache | dict[object, int], b: KVCache | dict[object, int]) -> int:
    """How many leading rows ``a`` and ``b`` (caches, or their :func:`row_sources`) hold
    with the same bits in every layer: a prompt prefix one copied from the other, or both
    from a third."""
    mine = a if isinstance(a, dict) else row_sources(a)
    theirs = b if isinstance(b, dict) else row_sources(b)
    return max((min(r, theirs[t]) for t, r in mine.items() if t in theirs), default=0)


class BatchedCaches:
    """A decode step over several sequences at once: row ``i`` of the batch is its own
    sequence, with its own :class:`KVCache` and position. The model runs every weight
    (linear) op once over all rows and attention row by row, each against its own cache."""

    def __init__(self, caches: list[KVCache]):
        self.caches = caches

    def advance(self, t: int) -> None:
        for c in self.caches:
            c.advance(t)
