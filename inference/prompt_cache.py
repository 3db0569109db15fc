"""Reuse of the KV cache between turns of one conversation.

Each chat turn sends the whole conversation again. The tokens it shares with the previous
turn's prompt and reply are already in that turn's KV cache, so only the new tail needs a
prefill: turn 10 costs about what turn 1 did, instead of re-reading the whole history.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """One model's last KV cache and the token ids in it.

    Invariant: the first ``cache.offset`` entries of :attr:`ids` are the tokens whose K/V
    the cache holds (a cancelled or failed step leaves ``offset`` where it was, so the ids
    past it are simply ignored). One generation uses it at a time; a second one running
    at the same moment gets a fresh cache.
    """

    def __init__(self) -> None:
        self.cache: Any = None
        self.ids: list[int] = []
        self.reused = 0  # tokens the last generation did not prefill
        self._busy = threading.Lock()

    def begin(self, model: Any, prompt_ids: Sequence[int], max_len: int | None
              ) -> tuple[Any, int, bool]:
        """(cache, tokens of ``prompt_ids`` it already holds, owned). At least the last
        prompt token is always left to prefill (its logits start the reply)."""
        if not self._busy.acquire(blocking=False):
            return model.make_cache(max_len), 0, False
        held = self.ids[:self.cache.offset] if self.cache is not None else []
        n = min(common_prefix(held, prompt_ids), len(prompt_ids) - 1)
        if n <= 0:
            self.cache = model.make_cache(max_len)
            n = 0
        else:
            self.cache.trim(n)  # a sliding-window cache may have to forget everything
            n = self.cache.offset
            self.cache.max_len = None  # grow in steps from here, never one row at a time
        self.ids = list(prompt_ids)
        self.reused = n
        return self.cache, n, True

    def fed(self, token: int) -> None:
        """A sampled token was fed to the model (its K/V are now in the cache)."""
        self.ids.append(token)

    def end(self) -> None:
        self._busy.release()
