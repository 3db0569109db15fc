"""A captured decode step for the ``cpu`` backend: the model's Python runs once, its kernel
calls are replayed for every later token (what CUDA graphs do for the ``cuda`` backend).

Why: at one token a step is ~500 small kernel calls under ~850 backend ops, and the ops'
Python (argument checks, reshapes, allocations) plus the model's own cost as much as a
third of the step on SmolLM2 (measured: 16.3 ms a token at 2 threads, 10 ms of it in
kernels). Replaying the kernel calls into the buffers they wrote the first time keeps only
the calls.

How: while a :class:`Tape` is set on the backend, every op computes as usual and also
appends a replay call writing the same output buffer (``CpuBackend._taped``); views cost
nothing to replay. The things that move with the position read it from ``Tape.pos``
at replay: RoPE's offset, the KV cache row written, and the keys attention reads (each as
the captured value plus its distance from the captured position; in a decode step all
three are one fused call, ``CpuBackend.attend_rows``). NumPy expressions (Gemma's
GELU, soft-caps) replay whole, copied into the captured output. An op that cannot be
replayed (prefill-shaped attention, a gemm) raises :class:`NotCapturable` and the
generation runs eagerly, as it does under a profiler and, once a sliding window hides a
key or drops a row (:func:`window_open`), for sliding-window caches. Batched caches (the
server's steps) replay too (:class:`StepReplayer`).

Checked, not trusted: the first replay after a capture runs beside an eager step at the
same position and must agree (:data:`VERIFY_RTOL`), else replays stop for the generation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.backends.base import OPS, EagerSteps, TokenSampler
from inference.kv_cache import BatchedCaches, KVCache
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
    # Calls that read the caches through state of their own register ``rebind(caches)``:
    # it points them at another set of caches of the same count (None: at none), False if
    # one of those cannot take the step's row in place. ``positional``: some call reads the
    # position through ``at`` instead, and the tape cannot be rebound.
    binders: list[Callable[[Sequence[KVCache] | None], bool]] = field(default_factory=list)
    positional: bool = False
    # The last input quantized for a mat-vec (address, shape, strides: its buffer outlives
    # the tape), its quantized rows, and len(calls) after the last call that read them:
    # reused only while no other call came between.
    quantized: tuple[Any, tuple[np.ndarray, ...], int] | None = None

    def at(self, value: int) -> Callable[[], int]:
        """``value`` (a row or key count at the captured position) at the replayed one."""
        self.positional = True
        delta = value - self.pos0
        pos = self.pos
        return lambda: int(pos[0]) + delta


@dataclass
class StepReplay:
    tape: Tape
    ids: np.ndarray  # (rows, 1) int64: the tokens fed to each replay
    logits: np.ndarray
    buffers: tuple[int, ...]  # the caches and the KV buffers the calls write


class StepReplayer(EagerSteps):
    """Decode steps of one model, replayed where they can be: ``replayer(model, ids,
    cache)`` is ``model(ids, cache, last_only=True)``. One sequence (a :class:`KVCache`)
    or several (:class:`BatchedCaches`, the server's steps): every cache moves one row a
    step, so one position serves them all. One capture is kept per batch size; a new set
    of caches of that size (a sequence joins or leaves, a cache grows) rebinds it
    (:attr:`Tape.binders`) instead of running an eager step to capture anew, where every
    call can be rebound. The first capture and the first rebinding of each batch size in
    the replayer's life are checked (:meth:`release` keeps that record)."""

    def __init__(self, backend: Any):
        self.B = backend
        self.replay: StepReplay | None = None  # the one the last step ran
        self._kept: dict[int, StepReplay] = {}  # by batch size
        self.eager_reason: str | None = None  # why replays stopped
        self.verified: set[int] = set()  # batch sizes whose last check agreed with eager
        self.rebound: set[int] = set()  # batch sizes rebound at least once
        self.captures = 0
        self.rebinds = 0

    def __call__(self, model: Any, ids: np.ndarray, cache: Any) -> Any:
        self.B.adapt_threads()  # the cores other processes leave free, looked at each step
        caches = cache.caches if isinstance(cache, BatchedCaches) else [cache]
        if not self._replayable(caches):
            return model(ids, cache, last_only=True)
        r = self._kept.get(len(caches))
        if r is not None and r.ids.shape == ids.shape and r.buffers != _buffers(caches):
            r = self._rebind(r, caches)
        if r is None or r.ids.shape != ids.shape:
            return self._capture(model, ids, cache, caches)
        self._use(r)
        if len(caches) not in self.verified:
            return self._verify(model, ids, cache, caches)
        return self._run(r, ids, caches)

    def let_go(self) -> None:
        """Keep the captures but hold no cache (a generation ended): the one in use is
        unbound, or dropped where it cannot be; the next step with caches rebinds it or
        captures anew."""
        r = self.replay
        if r is None:
            return
        if r.tape.binders and all(bind(None) for bind in r.tape.binders):
            r.buffers = ()  # a step with caches rebinds it first
        else:
            self._kept = {n: k for n, k in self._kept.items() if k is not r}
            self.replay = None

    def release(self) -> None:
        """Drop the captured steps (they hold their batches' buffers), and the reason
        replays stopped, if any; the batch sizes already checked stay checked: this
        model's ops are the same ones at the next capture."""
        self.replay = None
        self._kept.clear()
        self.eager_reason = None

    def _rebind(self, r: StepReplay, caches: list[KVCache]) -> StepReplay | None:
        """``r`` pointed at ``caches``, or None (and ``r`` dropped) where it cannot be."""
        n = len(caches)
        if r.tape.positional or not all(bind(caches) for bind in r.tape.binders):
            del self._kept[n]
            return None
        r.buffers = _buffers(caches)
        self.rebinds += 1
        if n not in self.rebound:  # the first rebinding of this size is checked too
            self.rebound.add(n)
            self.verified.discard(n)
        return r

    def _use(self, r: StepReplay | None) -> None:
        """``r`` runs the next steps; the capture that ran the last one lets go of its
        caches (finished sequences' memory) unless it is ``r``. Only the one in use is
        bound, so a kept capture of another size holds none."""
        old = self.replay
        if old is not None and old is not r:
            if old.tape.binders and all(bind(None) for bind in old.tape.binders):
                old.buffers = ()  # a step with these caches rebinds it first
            else:  # it cannot let go: drop it
                self._kept = {n: k for n, k in self._kept.items() if k is not old}
        self.replay = r

    def _replayable(self, caches: list[Any]) -> bool:
        B = self.B
        return (B.step_replay and self.eager_reason is None
                and all(isinstance(c, KVCache) and c.keys[0] is not None
                        and c.offset < c.keys[0].shape[2]
                        and all(window_open(c, layer) and c.keys[layer] is not None
                                and c.offset < c.keys[layer].shape[2]
                                for layer, w in enumerate(c.windows) if w is not None)
                        for c in caches)
                and not any(op in vars(B) for op in OPS))  # a profiler times each op

    def _run(self, r: StepReplay, ids: np.ndarray, caches: list[KVCache]) -> np.ndarray:
        r.ids[...] = ids
        r.tape.pos[0] = caches[0].offset
        for call in r.tape.calls:
            call()
        for c in caches:
            c.advance(1)
        return r.logits

    def _capture(self, model: Any, ids: np.ndarray, cache: Any, caches: list[KVCache]) -> Any:
        B = self.B
        self._use(None)  # the last step's capture lets go of its caches
        self._kept.pop(len(caches), None)  # and the old one of this size goes first
        tape = Tape(caches[0].offset)
        fed = np.array(ids, dtype=np.int64, copy=True)
        offsets = [c.offset for c in caches]
        B._tape = tape
        try:
            logits = model(fed, cache, last_only=True)
        except NotCapturable as e:
            self.eager_reason = str(e)
        finally:
            B._tape = None
        if self.eager_reason is not None:
            _rewind(caches, offsets)  # the eager step starts over (rows are rewritten)
            return model(ids, cache, last_only=True)
        self.captures += 1
        r = StepReplay(tape, fed, logits, _buffers(caches))
        self._use(r)
        self._kept[len(caches)] = r
        return logits.copy()  # the next replay overwrites the captured buffer

    def _verify(self, model: Any, ids: np.ndarray, cache: Any, caches: list[KVCache]) -> Any:
        r = self.replay
        assert r is not None
        offsets = [c.offset for c in caches]
        eager = model(ids, cache, last_only=True)
        _rewind(caches, offsets)
        replayed = self._run(r, ids, caches)
        scale = float(np.max(np.abs(eager))) or 1.0
        if np.max(np.abs(replayed - eager)) <= VERIFY_RTOL * scale:
            self.verified.add(len(caches))
            return replayed
        self.eager_reason = "a replayed step disagreed with the eager one"
        self.replay = None
        self._kept.clear()
        _rewind(caches, offsets)  # the replay wrote the KV rows: write them again
        return model(ids, cache, last_only=True)


class CpuSampler(TokenSampler):
    """The synchronous sampler, stepping by replay where it can (see the module). Its
    steps are the model's replayer, kept by the backend from one generation to the next
    (``CpuBackend.borrow_steps``): a later generation rebinds the capture to its cache
    and, once a rebinding was checked, its first decode step is a replay, not a capture
    and a check. :meth:`close` hands the replayer back, holding no cache."""

    def __init__(self, backend: Any, params: SamplingParams, prompt_ids: Sequence[int],
                 rng: np.random.Generator):
        super().__init__(backend, params, prompt_ids, rng)
        self.steps: StepReplayer | None = None  # borrowed at the first decode step
        self._borrowed = False

    def decode(self, model: Any, tok: Any, cache: Any) -> Any:
        if self.steps is None:
            self.steps, self._borrowed = self.B.borrow_steps(model)
        return self.steps(model, self.as_input(tok), cache)

    def close(self) -> None:
        if self.steps is not None and self._borrowed:
            self._borrowed = False
            self.B.return_steps(self.steps)


def window_open(c: KVCache, layer: int, window: int | None = None) -> bool:
    """Whether ``layer`` of ``c`` attends as a full layer at the next token: no sliding
    window (the cache's, or ``window``), or one that has dropped no row (``start`` 0) and
    hides none from that token (``offset < window``: it sees ``window`` positions, its own
    included). Such a layer takes the fused decode call (``CpuBackend.attend_rows``) and
    its steps replay: Gemma 3's local layers for a context's first ``window`` tokens."""
    return all(w is None or (c.start[layer] == 0 and c.offset < w)
               for w in (c.windows[layer], window))


def _rewind(caches: list[KVCache], offsets: list[int]) -> None:
    for c, o in zip(caches, offsets, strict=True):
        c.offset = o


def _buffers(caches: list[KVCache]) -> tuple[int, ...]:
    return tuple(i for c in caches for i in (id(c), *map(id, c.keys), *map(id, c.values)))
