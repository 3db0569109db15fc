"""A captured decode step for the ``cpu`` backend: the model's Python runs once, its kernel
calls are replayed for every later token (what CUDA graphs do for the ``cuda`` backend).

Why: at one token a step is ~500 small kernel calls under ~850 backend ops, and the ops'
Python (argument checks, reshapes, allocations) plus the model's own cost as much as a
third of the step on SmolLM2 (measured: 16.3 ms a token at 2 threads, 10 ms of it in
kernels). Replaying the kernel calls into the buffers they wrote the first time keeps only
the calls.

How: while a :class:`Tape` is set on the backend, every op computes as usual and also
appends a replay call writing the same output buffer (``CpuBackend._taped``); views cost
nothing to replay. The four things that move with the position read it from ``Tape.pos``
at replay: RoPE's offset, the KV cache row written, and the keys attention reads (each as
the captured value plus its distance from the captured position). NumPy expressions (Gemma's
GELU, soft-caps) replay whole, copied into the captured output. An op that cannot be
replayed (prefill-shaped attention, a gemm) raises :class:`NotCapturable` and the
generation runs eagerly, as it does for sliding-window caches, batched caches and a
profiler.

Checked, not trusted: the first replay after a capture runs beside an eager step at the
same position and must agree (:data:`VERIFY_RTOL`), else replays stop for the generation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.backends.base import OPS, TokenSampler
from inference.kv_cache import KVCache
from inference.sampling import SamplingParams

# Replayed and eager logits of one step run the same kernels over the same inputs; they may
# differ only where BLAS picks another code path for a differently aligned buffer (dense
# float weights), far below this. A missed op replays stale inputs: differences of the
# order of the logits themselves.
VERIFY_RTOL = 1e-4

class NotCapturable(Exception):
    """An op of the step has no replay (the step runs eagerly instead)."""


@dataclass
class Tape:
    """The replay calls of one step, and the position they read."""

    pos0: int  # the position the step was captured at
    pos: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    calls: list[Callable[[], Any]] = field(default_factory=list)

    def at(self, value: int) -> Callable[[], int]:
        """``value`` (a row or key count at the captured position) at the replayed one."""
        delta = value - self.pos0
        pos = self.pos
        return lambda: int(pos[0]) + delta


@dataclass
class StepReplay:
    tape: Tape
    ids: np.ndarray  # (1, 1) int64: the token fed to each replay
    logits: np.ndarray
    buffers: tuple[Any, ...]  # the cache and the KV buffers the calls write
    verified: bool = False


class CpuSampler(TokenSampler):
    """The synchronous sampler, stepping by replay where it can (see the module)."""

    def __init__(self, backend: Any, params: SamplingParams, prompt_ids: Sequence[int],
                 rng: np.random.Generator):
        super().__init__(backend, params, prompt_ids, rng)
        self.replay: StepReplay | None = None
        self.eager_reason: str | None = None  # why this generation stopped replaying

    def decode(self, model: Any, tok: Any, cache: Any) -> Any:
        if not self._replayable(cache):
            return super().decode(model, tok, cache)
        r = self.replay
        if r is None or r.buffers != _buffers(cache):
            return self._capture(model, tok, cache)
        if not r.verified:
            return self._verify(model, tok, cache)
        return self._run(r, tok, cache)

    def _replayable(self, cache: Any) -> bool:
        B = self.B
        return (B.step_replay and self.eager_reason is None and isinstance(cache, KVCache)
                and cache.keys[0] is not None and cache.offset < cache.keys[0].shape[2]
                and all(w is None for w in cache.windows)
                and not any(op in vars(B) for op in OPS))  # a profiler times each op

    def _run(self, r: StepReplay, tok: Any, cache: KVCache) -> np.ndarray:
        r.ids[0, 0] = int(tok)
        r.tape.pos[0] = cache.offset
        for call in r.tape.calls:
            call()
        cache.advance(1)
        return r.logits

    def _capture(self, model: Any, tok: Any, cache: KVCache) -> Any:
        B = self.B
        tape = Tape(cache.offset)
        ids = np.asarray([[int(tok)]], dtype=np.int64)
        offset = cache.offset
        B._tape = tape
        try:
            logits = model(ids, cache, last_only=True)
        except NotCapturable as e:
            self.eager_reason = str(e)
        finally:
            B._tape = None
        if self.eager_reason is not None:
            cache.offset = offset  # the eager step starts over (rows are rewritten)
            return super().decode(model, tok, cache)
        self.replay = StepReplay(tape, ids, logits, _buffers(cache))
        return logits.copy()  # the next replay overwrites the captured buffer

    def _verify(self, model: Any, tok: Any, cache: KVCache) -> Any:
        r = self.replay
        assert r is not None
        offset = cache.offset
        eager = super().decode(model, tok, cache)
        cache.offset = offset
        replayed = self._run(r, tok, cache)
        scale = float(np.max(np.abs(eager))) or 1.0
        if np.max(np.abs(replayed - eager)) <= VERIFY_RTOL * scale:
            r.verified = True
            return replayed
        self.eager_reason = "a replayed step disagreed with the eager one"
        cache.offset = offset  # the replay wrote the KV rows: write them again
        return super().decode(model, tok, cache)


def _buffers(cache: KVCache) -> tuple[Any, ...]:
    return (id(cache), *map(id, cache.keys), *map(id, cache.values))
