"""Continuous batching: one thread steps every active sequence of one causal model.

Each step (i) admits waiting requests while fewer than ``parallel`` run, (ii) drops the
cancelled ones, (iii) advances the prefill of the oldest sequence still prefilling, and
(iv) runs one decode step for every sequence that has a token to feed: a single forward
call over all of them (:class:`BatchedCaches`), so the weights are read once per step
whatever the number of streams. Sequences join and leave between steps; each keeps its
own KV cache, position, sampler (seeded ``Generator``) and :class:`Generation` (text,
stop strings, timings).

Prefill budget: a prompt is cut into chunks of at most ``prefill_chunk`` tokens. With
nobody decoding, a step runs a whole chunk (a lone request's time to first token is
that of one call per chunk). While others decode, a step runs only as many *layers* of
the chunk (``Model.layer_by_layer``) as fit in ``step_budget`` decode steps' time
(:class:`PrefillBudget`, from the measured cost of recent decode steps and prefill
layers), so a newcomer's prompt stretches every stream's inter-token gap by about that
much instead of by a whole chunk's forward pass.

Bursts: while nobody has fed a token back yet (several requests arrived together), the
first tokens wait and the other newcomers' prompts run in whole chunks, up to
``burst_hold`` prompt tokens; then everyone decodes together. The first stream gets one
long gap (its second token waits for the others' prefill) instead of the budgeted pieces
stretching many of its gaps, and the later streams' first tokens come sooner.

Events: what a step makes (text deltas, finished sequences' DoneEvents, errors) is
collected and handed on at the step's end in one ``deliver`` call, in the order made, so
a consumer on another thread (the server's event loop) is woken once per step, not once
per token per stream.

Prompt cache: a finished (or cancelled) sequence's whole prefilled chunks are kept in a
bounded pool (:class:`~inference.server.prefix_pool.PrefixPool`), copied like a running
sequence's (:meth:`Scheduler._share_prefix`). After ``prompt_cache_idle`` seconds with no
request the pool is emptied and the freed heap given back to the system, so a server left
running holds its weights only; the freed heap alone goes back ``IDLE_TRIM_S`` after the
last step, so a burst's temporaries do not stay resident.

Tokens one step behind (backends with a ``token_sampler``: cuda): each sequence samples on
the device, its token stays there as the next step's input, and the host reads it only
after that step is queued (mlx-lm's ``generate_step``), so the host's reading, stop
checks and delivery overlap the device's next step. The price: a sequence that ends runs
one step more than it needed, whose token is dropped. A request asking for log-
probabilities reads its row at once instead.

Faults: an exception while starting one request fails that request; one in a step fails
the sequences of that step; the thread goes on. What stops it anyway is kept
(:attr:`Scheduler.stopped`): waiting requests fail at once, and :meth:`Scheduler.fault`
(``/health``, ``submit``) says so instead of queueing work nobody will do.

Exactness: a sequence's tokens do not depend on what runs beside it. Prefill chunks are
cut at fixed positions (0, C, 2C, ...) and each is one forward pass of one sequence,
whether it runs in one step or a few layers per step (the same calls on the same inputs;
nothing else writes that cache meanwhile), so a prompt is prefilled by the same calls
alone or in company (and a prompt of at most C tokens by the very call
``CausalLM.generate`` makes). In a batched decode step the weight ops compute each row
on its own: on ``cpu`` the quantized mat-vec computes each of up to ``MATVEC_ROWS`` (8)
rows by the one-row arithmetic (``cpu_kernels.matvec_q8_rows`` shares code loads between
rows, not sums), hence ``MAX_PARALLEL``; a prefix copied from another sequence is what
the same prefill calls computed (:meth:`Scheduler._share_prefix`); norms, RoPE, SiLU and
the embedding lookup are row-wise; attention runs per sequence, as alone. Sampling sees
the same logits row, history and seeded generator. BLAS backends (numpy, mlx) may round a
row of a multi-row product differently from a one-row product, so there the tokens agree
to within such rounding, not bit for bit (docs/server.md).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.backends.base import trim_host_heap
from inference.errors import InferdeskError, OutOfMemoryError
from inference.events import GenerationEvent
from inference.generate import Generation
from inference.kv_cache import BatchedCaches, KVCache
from inference.sampling import SamplingParams
from inference.server.limits import MAX_PARALLEL
from inference.server.prefix_pool import (
    PROMPT_CACHE_IDLE,
    PROMPT_CACHE_MB,
    PrefixPool,
    cache_nbytes,
    compact,
    shared_chunks,
)

PREFILL_CHUNK = 128  # tokens per prefill forward pass (a lone request runs one per step)
# Prefill work a step may add while other sequences decode, in decode steps: such a step
# then costs about 1 + STEP_BUDGET decode steps (at least one layer of the chunk runs).
# 4, measured (SmolLM2 cpu, 2 threads, `inferdesk bench --serve`, back to back): at 1.0
# newcomers prefilled so slowly that 4 streams made 43.8 tok/s against 55.2 for one
# (p99 155 ms); at 4.0, 81.8 tok/s and p99 100 ms; at 12, p99 216 ms.
STEP_BUDGET = 4.0
# A burst (newcomers while nobody has fed a token back yet): the decode step waits while
# up to this many prompt tokens of the others are prefilled in whole chunks, so the first
# stream's wait is one gap, not a stretch of every gap (module docstring).
BURST_HOLD = 4 * PREFILL_CHUNK


class QueueFullError(InferdeskError):
    """The scheduler holds as many requests as it may; the client should retry later."""


class WorkerStoppedError(InferdeskError):
    """A worker thread has stopped: the server cannot serve this kind of request."""


IDLE_TRIM_S = 1.0  # idle seconds after work before freed heap is given back to the system


class QueuedWorker:
    """A thread serving requests from a bounded queue: the chat scheduler and the embedding
    batcher. One admission check for both (:meth:`_admit`), one fault and one close."""

    what: str  # the worker's kind in a stopped worker's message ("chat", "embedding")
    max_waiting: int
    stopped: BaseException | None  # what stopped the thread, if anything
    _waiting: collections.deque[Any]
    _cv: threading.Condition
    _closed: bool
    _thread: threading.Thread

    def _admit(self, item: Any) -> None:
        """Queue ``item`` for the thread, or say in one sentence why not: the server is
        shutting down or the queue is full (QueueFullError: retry later), or the thread
        stopped (WorkerStoppedError)."""
        with self._cv:
            if self._closed:
                raise QueueFullError("The server is shutting down.")
            dead = self.fault()
            if dead is not None:
                raise WorkerStoppedError(dead)
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(f"{self._busy()}; retry shortly.")
            self._waiting.append(item)
            self._cv.notify()

    def _busy(self) -> str:
        """What holds the queue full, for the client."""
        return f"{len(self._waiting)} {self.what} requests are waiting"

    def fault(self) -> str | None:
        """Why this worker cannot take requests (its thread stopped), or None."""
        if self._thread.is_alive() or self._closed:
            return None
        cause = self.stopped
        why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return f"The {self.what} worker stopped{why}; restart the server."

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)


@dataclass
class TokenLogprobs:
    """The sampled token's log-probability under the model, and the ``top`` most likely."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class PrefillBudget:
    """How many layers of a prefill chunk fit in a step beside a decode step: the
    budget (``share`` decode steps' time) over one layer's measured cost for that many
    tokens, at least one. Costs are moving averages of what recent steps measured."""

    def __init__(self, share: float = STEP_BUDGET):
        if share <= 0:
            raise InferdeskError("The prefill budget must be positive.")
        self.share = share
        self.decode_s: float | None = None  # one decode step
        self.layer_token_s: float | None = None  # one layer of prefill, per prompt token

    def layers(self, tokens: int) -> int:
        if self.decode_s is None or self.layer_token_s is None:
            return 1  # nothing measured yet: the smallest piece
        return max(1, int(self.share * self.decode_s / (self.layer_token_s * tokens)))

    def decoded(self, seconds: float) -> None:
        self.decode_s = _average(self.decode_s, seconds)

    def prefilled(self, seconds: float, layers: int, tokens: int) -> None:
        self.layer_token_s = _average(self.layer_token_s, seconds / (layers * tokens))


def _average(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


@dataclass(frozen=True)
class StepPlan:
    """What one step ran: prompt tokens of the chunk it advanced (0: none), how many of
    the chunk's layers, whether that finished the chunk, and the rows of its decode step
    (0: none)."""

    chunk_tokens: int
    layers: int
    chunk_done: bool
    decode_rows: int


# emit(event, logprobs) or emit(error, None); called by the scheduler's deliver.
Emit = Callable[[GenerationEvent | BaseException, TokenLogprobs | None], None]


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    emit: Emit
    stop: Sequence[str] = ()
    top_logprobs: int | None = None  # None: no logprobs; k: the sampled one and k others
    cancel: threading.Event = field(default_factory=threading.Event)
    loop: Any = None  # the consumer's event loop, for a deliver that hands events to it


Outbox = list[tuple[Request, GenerationEvent | BaseException, TokenLogprobs | None]]
# deliver(outbox): one scheduler iteration's events, in the order they were made (a
# request's own in its order; a decode step's rows in row order); called from the
# scheduler thread once per iteration that made any.
Deliver = Callable[[Outbox], None]


def emit_each(outbox: Outbox) -> None:
    """The default deliver: each event to its request's ``emit``, on the scheduler thread."""
    for req, ev, lp in outbox:
        req.emit(ev, lp)


@dataclass
class _Seq:
    req: Request
    gen: Generation
    rng: np.random.Generator
    history: list[int]
    cache: KVCache
    pos: int = 0  # prompt tokens prefilled
    last: Any = None  # sampled, not yet fed back (an id, or a device token)
    chunk: int = 0  # tokens of the prefill chunk under way
    decoding: bool = False  # has fed a token back (been in a decode step)
    run: Generator[Any, None, Any] | None = None  # that chunk's forward pass, paused
    sampler: Any = None  # the backend's device sampler (tokens read one step behind)
    unread: Any = None  # the device token sampled last, not yet read and delivered


class Scheduler(QueuedWorker):
    what = "chat"

    def __init__(self, model: Any, parallel: int = 4, max_waiting: int = 16,
                 prefill_chunk: int = PREFILL_CHUNK, step_budget: float = STEP_BUDGET,
                 clock: Callable[[], float] = time.perf_counter,
                 prompt_cache_bytes: int = PROMPT_CACHE_MB << 20,
                 burst_hold: int = BURST_HOLD, prompt_cache_idle: float = PROMPT_CACHE_IDLE,
                 deliver: Deliver = emit_each, step_lock: Any = None):
        if not 1 <= parallel <= MAX_PARALLEL:
            raise InferdeskError(f"parallel must be between 1 and {MAX_PARALLEL}.")
        self.model = model  # a CausalLM
        self.parallel = parallel
        self.max_waiting = max_waiting
        self.prefill_chunk = prefill_chunk
        self.budget = PrefillBudget(step_budget)
        self.clock = clock
        self.steps = 0  # forward calls made (a chunk spread over several steps is one)
        self.plans: collections.deque[StepPlan] = collections.deque(maxlen=4096)
        self.max_rows = 0  # most sequences one decode step has served
        self.shared_tokens = 0  # prompt tokens copied from another sequence, not prefilled
        self.prefilled_tokens = 0  # prompt tokens prefilled (chunks whose pass completed)
        self.pool = PrefixPool(prompt_cache_bytes)  # finished sequences' prompt prefixes
        self.prompt_cache_idle = prompt_cache_idle  # seconds idle before the pool is emptied
        self.burst_hold = burst_hold
        self._held = 0  # prompt tokens prefilled since the last decode step, in a burst
        self.finished: collections.deque[tuple[str, int]] = collections.deque(maxlen=256)
        self._waiting: collections.deque[Request] = collections.deque()
        self._active: list[_Seq] = []
        self.deliver = deliver
        # Held for each step: an app that also generates on this model takes turns with it.
        self.step_lock = step_lock if step_lock is not None else contextlib.nullcontext()
        self._out: Outbox = []  # this iteration's events, delivered at its end
        self._decode = model.backend.decode_steps()  # replays captured steps where it can
        # A backend that samples on the device: tokens are read one step behind (module).
        self._token_sampler = getattr(model.backend, "token_sampler", None)
        self._cv = threading.Condition()
        self._closed = False
        self._dirty = False  # work done since the heap was last trimmed
        self.stopped: BaseException | None = None  # what stopped the thread, if anything
        self._thread = threading.Thread(target=self._run, name="inferdesk-scheduler",
                                        daemon=True)
        self._thread.start()

    # --- called from any thread --------------------------------------------------------
    def submit(self, req: Request) -> None:
        self._admit(req)

    def _busy(self) -> str:
        return f"{self.parallel} requests are running and {len(self._waiting)} waiting"

    def load(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        with self._cv:
            return len(self._active), len(self._waiting)

    def close(self) -> None:
        """Stop the thread, then give back the prompt cache's memory."""
        super().close()
        self.pool.clear()

    # --- the scheduler thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # what _serve does not survive: refuse, never hang
            self.stopped = e
            with self._cv:
                waiting, self._waiting = list(self._waiting), collections.deque()
            fail = WorkerStoppedError(f"The chat worker stopped ({type(e).__name__}: {e}); "
                                      "restart the server.")
            self._out = [(s.req, fail, None) for s in self._active]
            self._out += [(r, fail, None) for r in waiting]
            self._active = []
            try:
                self._flush()
            except Exception:  # noqa: BLE001 - nobody left to tell
                pass
            raise

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting and not self._active:
                    self._idle()
                if self._closed:
                    break
                while self._waiting and len(self._active) < self.parallel:
                    req = self._waiting.popleft()
                    if req.cancel.is_set():
                        self._close_request(req, "cancelled")
                        continue
                    try:
                        self._active.append(self._start(req))
                    except MemoryError:  # its KV cache: this request fails, not the thread
                        self._out.append((req, OutOfMemoryError(
                            "Out of memory for this request's context; ask for fewer "
                            "tokens."), None))
                    except Exception as e:  # noqa: BLE001 - this request fails, not the thread
                        self._out.append((req, e, None))
            try:
                with self.step_lock:
                    self._step()
            except MemoryError:
                self.pool.clear()
                self._fail_all(OutOfMemoryError("Out of memory while generating; "
                                                "fewer parallel requests may fit."))
            except Exception as e:  # noqa: BLE001 - the requests in the step fail, not the server
                self._fail_all(e)
            self._dirty = True
            try:
                self._flush()
            except Exception:  # noqa: BLE001 - a consumer's fault must not stop the others
                pass
        for s in list(self._active):
            self._finish(s, "cancelled")
        while self._waiting:
            self._close_request(self._waiting.popleft(), "cancelled")
        self._flush()

    def _flush(self) -> None:
        """Hand this iteration's events on in one call (one wake-up of their consumer per
        step, not one per token per stream)."""
        if self._out:
            out, self._out = self._out, []
            self.deliver(out)

    def _idle(self) -> None:
        """Wait (holding ``_cv``) for work. After work, once idle ``IDLE_TRIM_S``, give the
        freed heap back to the system; with prefixes kept, once the pool has been idle
        ``prompt_cache_idle`` seconds, empty it (and trim)."""
        pool_wait = self.prompt_cache_idle if len(self.pool) and self.prompt_cache_idle > 0 \
            else None
        waits = [w for w in (pool_wait, IDLE_TRIM_S if self._dirty else None) if w is not None]
        if not waits:
            self._cv.wait()
        elif not self._cv.wait(min(waits)):
            if pool_wait is not None and pool_wait <= min(waits):
                self.pool.clear()
            self._dirty = False
            trim_host_heap()

    def _start(self, req: Request) -> _Seq:
        m = self.model
        gen = Generation(m.tokenizer, len(req.prompt_ids), req.max_tokens, m.tokenizer.eos_ids,
                         req.stop)
        try:
            cache = m.model.make_cache(len(req.prompt_ids) + req.max_tokens)
        except MemoryError:  # kept prefixes go first, then the request may still fit
            if not len(self.pool):
                raise
            self.pool.clear()
            cache = m.model.make_cache(len(req.prompt_ids) + req.max_tokens)
        rng = np.random.default_rng(req.sampling.seed)
        s = _Seq(req, gen, rng, list(req.prompt_ids), cache)
        if self._token_sampler is not None:
            s.sampler = self._token_sampler(req.sampling, req.prompt_ids, rng)
        return s

    def _share_prefix(self, s: _Seq) -> None:
        """Before ``s`` prefills its next chunk: copy the chunks from there on that a
        running sequence with the same prompt start has already prefilled, or that a
        finished one left in the pool (clients often send one system prompt or document
        with many requests). Only whole chunks, cut at the fixed positions every prompt is
        cut at, and at least one token is left to run: the copied rows are what the very
        same prefill calls computed for the other sequence, so the tokens stay exactly
        those of the request alone."""
        prompt, c = s.req.prompt_ids, self.prefill_chunk
        best, src = self.pool.match(prompt, c)
        for o in self._active:
            if o is not s:
                n = shared_chunks(prompt, o.req.prompt_ids, o.pos, c)
                if n > best:
                    best, src = n, o.cache
        if src is not None and best > s.pos and s.cache.copy_prefix(src, best):
            self.shared_tokens += best - s.pos
            s.pos = best

    def _keep_prefix(self, s: _Seq) -> None:
        """Put the whole chunks ``s`` prefilled (``s.pos``: a chunk under way when it was
        cancelled is not among them) into the pool, as a compacted copy."""
        c = self.prefill_chunk
        n = s.pos // c * c
        if (not n or s.cache is None or cache_nbytes(s.cache, n) > self.pool.max_bytes
                or self.pool.covers(s.req.prompt_ids[:n])):
            return  # nothing whole, disabled (0 bytes), too big, or already kept
        try:
            small = compact(self.model.model, s.cache, n)
        except MemoryError:
            self.pool.clear()
            return
        if small is not None:
            self.pool.put(s.req.prompt_ids[:n], small)

    def _step(self) -> None:
        for s in [s for s in self._active if s.req.cancel.is_set()]:
            self._finish(s, "cancelled")
        M, B = self.model.model, self.model.backend
        B.adapt_threads()
        pre = next((s for s in self._active if s.pos < len(s.req.prompt_ids)), None)
        others_decode = any(s.last is not None for s in self._active)
        # A burst: nobody has fed a token back yet. Then the first tokens wait while the
        # other newcomers' prompts prefill in whole chunks (up to burst_hold tokens),
        # instead of every later decode step waiting for a budgeted piece of them.
        burst = not any(s.decoding for s in self._active)
        tokens = layers = 0
        if pre is not None:
            tokens = pre.chunk or self._start_chunk(pre)
            whole = not others_decode or (burst and self._held < self.burst_hold)
            layers = self._prefill(pre, None if whole else self.budget.layers(tokens))
            if others_decode and burst and pre.run is None:
                self._held += tokens
        done = pre is not None and pre.run is None
        dec = [s for s in self._active if s.last is not None]
        if (dec and burst and self._held < self.burst_hold
                and (any(s.pos < len(s.req.prompt_ids) for s in self._active)
                     or (self._waiting and len(self._active) < self.parallel))):
            dec = []  # the burst's first tokens wait for its other prompts (admitted next)
        if dec:
            self._held = 0
            t0 = self.clock()
            cache = dec[0].cache if len(dec) == 1 else BatchedCaches([s.cache for s in dec])
            if self._token_sampler is not None:  # the tokens, still on the device
                logits = self._decode(M, [s.last for s in dec], cache)
            else:
                ids = np.asarray([[s.last] for s in dec], dtype=np.int64)
                logits = self._decode(M, B.array(ids), cache)
            self.steps += 1
            self.max_rows = max(self.max_rows, len(dec))
            for i, s in enumerate(dec):
                s.decoding = True
                self._accept(s, logits, i)
            if not tokens or self.budget.decode_s is None:
                # Only steps without prefill: right after a prefill piece the decode step
                # runs slower (caches, BLAS threads), and a budget grown from those steps
                # would grow the pieces that slow them, step after step.
                self.budget.decoded(self.clock() - t0)
        self.plans.append(StepPlan(tokens, layers, done, len(dec)))

    def _start_chunk(self, s: _Seq) -> int:
        """Begin the forward pass of ``s``'s next prompt chunk; its token count."""
        self._share_prefix(s)
        M, B = self.model.model, self.model.backend
        chunk = s.req.prompt_ids[s.pos: s.pos + self.prefill_chunk]
        s.chunk = len(chunk)
        s.run = M.layer_by_layer(B.array(np.asarray([chunk], dtype=np.int64)), s.cache,
                                 last_only=True)
        self.steps += 1
        return s.chunk

    def _prefill(self, s: _Seq, limit: int | None) -> int:
        """Run up to ``limit`` layers (None: all) of ``s``'s chunk; the layers run. At the
        chunk's end its position moves on, and after the prompt's last chunk the first
        token is sampled."""
        assert s.run is not None
        t0, ran, logits, h = self.clock(), 0, None, None
        try:
            while limit is None or ran < limit:
                ran += 1
                h = next(s.run)
        except StopIteration as done:
            logits = done.value
        else:
            self.model.backend.synchronize(h)  # lazy backends: computed in this step
        self.budget.prefilled(self.clock() - t0, ran, s.chunk)
        if logits is not None:
            self.prefilled_tokens += s.chunk
            s.pos, s.chunk, s.run = s.pos + s.chunk, 0, None
            if s.pos == len(s.req.prompt_ids):
                self._accept(s, logits, 0)
        return ran

    def _accept(self, s: _Seq, logits: Any, i: int) -> None:
        """Sample row ``i`` of ``logits`` (1, vocab) for ``s`` and hand the result on (with
        a device sampler: hand on the token sampled the step before, see the module)."""
        B = self.model.backend
        s.last = None
        if s.req.cancel.is_set():
            self._finish(s, "cancelled")
            return
        row = B.reshape(B.narrow(logits, 0, i, 1), (logits.shape[-1],))
        if s.sampler is not None:
            tok = s.sampler.sample(row)  # queued behind this step; nothing read yet
            if s.req.top_logprobs is None:
                prev, s.unread = s.unread, tok
                if prev is None or self._push(s, s.sampler.read(prev), None):
                    s.last = tok
                return
            tid = s.sampler.read(tok)
            if self._push(s, tid, _logprobs(B.to_numpy(row), tid, s.req.top_logprobs)):
                s.last = tok
            return
        tok = B.sample(row, s.req.sampling, s.history, s.rng)
        lp = None if s.req.top_logprobs is None else _logprobs(B.to_numpy(row), tok,
                                                                 s.req.top_logprobs)
        if self._push(s, tok, lp):
            s.last = tok

    def _push(self, s: _Seq, tok: int, lp: TokenLogprobs | None) -> bool:
        """Deliver ``tok``; False if that ended ``s`` (then finished here)."""
        s.history.append(tok)
        self._out.extend((s.req, ev, lp) for ev in s.gen.push(tok))
        if s.gen.finish is not None:
            self._finish(s)
            return False
        return True

    def _finish(self, s: _Seq, reason: str | None = None) -> None:
        self._keep_prefix(s)
        events = s.gen.close(reason, memory=None)
        with self._cv:  # load() never shows the request gone before it shows it finished
            self.finished.append((s.gen.finish or "", len(s.gen.ids)))
            if s in self._active:
                self._active.remove(s)
        s.cache = s.run = s.unread = None  # type: ignore[assignment]  # memory goes now
        if not self._active:  # a captured step holds the last batch's caches
            self._decode.release()
        self._out.extend((s.req, ev, None) for ev in events)

    def _close_request(self, req: Request, reason: str) -> None:
        """End a request that never started (cancelled while it waited)."""
        self._out.extend((req, ev, None) for ev in Generation(
            self.model.tokenizer, len(req.prompt_ids), req.max_tokens, set()).close(reason))
        self.finished.append((reason, 0))

    def _fail_all(self, error: BaseException) -> None:
        for s in list(self._active):
            self._active.remove(s)
            s.cache = s.run = None  # type: ignore[assignment]
            self._out.append((s.req, error, None))


def _logprobs(logits: np.ndarray, tok: int, k: int) -> TokenLogprobs:
    z = logits.astype(np.float64)
    lse = z.max() + np.log(np.exp(z - z.max()).sum())
    top = np.argpartition(-z, k)[:k] if k else np.zeros(0, dtype=np.int64)
    top = top[np.argsort(-z[top], kind="stable")]
    return TokenLogprobs(tok, float(z[tok] - lse), [(int(j), float(z[j] - lse)) for j in top])
