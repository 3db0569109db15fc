"""Prompt prefixes kept across requests: the KV rows of recently finished sequences'
prompts, for the next request with the same start (a system prompt or document sent with
every request) to copy instead of prefilling again.

Only whole prefill chunks are kept and matched: rows ``[0, k*C)`` of a prompt cut at the
fixed positions 0, C, 2C... are what the very same prefill calls compute for any prompt
starting with those tokens, so a request that copies them gets the tokens it gets alone
(:mod:`inference.server.scheduler`). An entry holds a compacted copy of those rows only
(not the finished sequence's cache, sized for prompt + max_tokens), so its bytes are the
memory it keeps.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

from inference.kv_cache import KVCache
from inference.prompt_cache import common_prefix

PROMPT_CACHE_MB = 256  # default bound on the pool's bytes (`inferdesk serve --prompt-cache-mb`)
PROMPT_CACHE_ENTRIES = 8  # and on its entries: a few system prompts/documents in rotation
# Seconds without a request after which the pool is emptied (`--prompt-cache-idle`, 0:
# never): a client sending a request every few minutes still finds its prefix, and a
# server left idle holds its weights only. Ollama's idle unload is 5 minutes too.
PROMPT_CACHE_IDLE = 300.0


def shared_chunks(prompt: Sequence[int], other: Sequence[int], ready: int, chunk: int) -> int:
    """Tokens in the whole chunks (cut at 0, chunk, 2*chunk...) that ``prompt`` shares with
    ``other``, of the first ``ready`` tokens of ``other`` whose K/V exist, leaving at least
    the last prompt token to run (its logits start the reply)."""
    n = min(ready, len(prompt) - 1, common_prefix(prompt, other))
    return n // chunk * chunk


def cache_nbytes(cache: KVCache, rows: int | None = None) -> int:
    """Bytes of ``cache``'s buffers, or of ``rows`` rows of each (a compacted copy's)."""
    arrays = [a for a in (*cache.keys, *cache.values) if a is not None]
    if rows is None:
        return sum(int(a.nbytes) for a in arrays)
    return sum(int(a.nbytes) // int(a.shape[2]) * rows for a in arrays)


class PrefixPool:
    """Least recently used first out, within ``max_bytes`` and ``max_entries``
    (``max_bytes == 0``: disabled, nothing is kept). Used from the scheduler thread;
    :meth:`clear` may come from any thread, hence the lock."""

    def __init__(self, max_bytes: int, max_entries: int = PROMPT_CACHE_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        # prompt ids (whole chunks) -> (cache holding exactly their rows, its bytes)
        self._entries: collections.OrderedDict[tuple[int, ...], tuple[KVCache, int]] = (
            collections.OrderedDict())
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(b for _, b in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list[tuple[int, ...]]:
        """The kept prefixes, least recently used first."""
        with self._lock:
            return list(self._entries)

    def covers(self, ids: Sequence[int]) -> bool:
        """Whether an entry already holds all of ``ids`` (then it is marked used)."""
        with self._lock:
            for key in self._entries:
                if len(key) >= len(ids) and key[:len(ids)] == tuple(ids):
                    self._entries.move_to_end(key)
                    return True
            return False

    def match(self, prompt: Sequence[int], chunk: int) -> tuple[int, KVCache | None]:
        """The longest whole-chunk prefix of ``prompt`` an entry holds, and that entry's
        cache (marked used), or (0, None)."""
        with self._lock:
            best, found = 0, None
            for key in self._entries:
                n = shared_chunks(prompt, key, len(key), chunk)
                if n > best:
                    best, found = n, key
            if found is None:
                return 0, None
            self._entries.move_to_end(found)
            return best, self._entries[found][0]

    def put(self, ids: Sequence[int], cache: KVCache) -> None:
        """Keep ``cache`` (holding exactly the rows of ``ids``), dropping entries it covers
        and then the least recently used until both bounds hold; one bigger than the whole
        pool is not kept."""
        key, size = tuple(ids), cache_nbytes(cache)
        if size > self.max_bytes:
            return
        with self._lock:
            for old in [k for k in self._entries if key[:len(k)] == k]:
                del self._entries[old]
            self._entries[key] = (cache, size)
            while (len(self._entries) > self.max_entries
                   or sum(b for _, b in self._entries.values()) > self.max_bytes):
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def compact(model: Any, cache: KVCache, n: int) -> KVCache | None:
    """A new cache holding only the first ``n`` rows of ``cache`` (every row computed,
    none spare), or None when ``cache`` cannot give them (a sliding-window layer has
    dropped rows)."""
    small = model.make_cache(n)
    if not small.copy_prefix(cache, n):
        return None
    small.B.synchronize(*small.keys, *small.values)  # lazy backends: no tie to the source
    return small
