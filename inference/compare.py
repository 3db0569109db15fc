"""Two backends side by side on one model file: speed, memory and exactness.

The file is loaded on backend A, which generates greedily; A is closed and the same file is
loaded on backend B, which is fed A's tokens (teacher forcing), so step ``i`` of both sides
computes the logits after the same ids. Each step's record holds the largest
``|logit_A - logit_B|`` over the vocabulary and whether B's top-1 token is A's.

Both sides run the same steps as generation does (:func:`inference.generate.prefill` in
chunks, then the backend's :meth:`~inference.backends.base.Backend.decode_steps`, which on
cpu replays a captured step), except that each step's logits row is read back to the host
where generation reads only the sampled id. Timings include that read on both sides.

Step 0's logits come from the prefill; its seconds are the prefill's. Decode tok/s counts
the steps after the first over their time, as :class:`inference.generate.Generation` does,
after an untimed warm-up run (see :func:`compare`).
The sides run one after the other, so each one's memory is measured alone: host RSS growth
from just before its load (after the other side's weights were released), and the
device's figures where the backend has a device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.api import CausalLM, load_model
from inference.backends.base import host_rss, trim_host_heap
from inference.errors import CancelledError, InvalidInputError
from inference.events import MemorySample
from inference.generate import prefill
from inference.sampling import SamplingParams
from inference.store import ModelSpec
from inference.validate import check_finite, int_arg

Loader = Callable[..., Any]  # load_model's signature: (source, backend=..., cancel=...)
_DROPPED = np.zeros(0, dtype=np.float32)
WARMUP_STEPS = 2  # untimed decode steps before a side's timed run


@dataclass
class SideStarted:
    """A side begins loading (``side`` is "a" or "b")."""

    side: str
    backend: str


@dataclass
class SideLoaded:
    side: str
    backend: str
    reason: str  # the backend's own sentence (what it runs, threads, SIMD)
    load_s: float
    load_bytes: int  # host RSS growth over the load


@dataclass
class Generated:
    """One of A's greedy steps (B has not run yet)."""

    index: int
    token_id: int
    text: str  # the token's text as generation would stream it ("" while a UTF-8 char is split)
    seconds: float
    eos: bool = False  # an end-of-text token: A's last step


@dataclass
class StepRecord:
    """Step ``index`` on both sides: the logits after the prompt and A's first ``index``
    tokens."""

    index: int
    token_id: int  # A's greedy token (what B was fed next)
    text: str
    max_abs_diff: float  # max over the vocabulary of |logit_A - logit_B|
    scale: float  # max |logit_A| of the step, for a relative figure
    b_token_id: int  # B's own top-1 token
    a_seconds: float
    b_seconds: float
    b_text: str = ""  # B's top-1 token as text, where it is not A's
    eos: bool = False

    @property
    def agree(self) -> bool:
        return self.b_token_id == self.token_id


@dataclass
class SideStats:
    backend: str
    reason: str
    load_s: float
    load_bytes: int  # host RSS growth over the load (weights as this backend holds them)
    peak_bytes: int  # the most host RSS grew from before the load, load and steps included
    prefill_s: float
    step_s: list[float]  # per step; step 0 is the prefill
    warmup_s: float  # the untimed warm-up run before the steps (see compare())
    memory: MemorySample  # the backend's own sample after the last step (device figures)
    threads: tuple[int, int] | None

    @property
    def decode_tok_s(self) -> float:
        t = sum(self.step_s[1:])
        return (len(self.step_s) - 1) / t if t > 0 else 0.0


@dataclass
class CompareSummary:
    model: str
    n_prompt: int
    prompt_kind: str  # "chat template" or "plain text"
    finish: str  # "eos" or "length"
    text: str
    a: SideStats
    b: SideStats
    records: list[StepRecord] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.records)

    @property
    def max_abs_diff(self) -> float:
        return max((r.max_abs_diff for r in self.records), default=0.0)

    @property
    def worst_step(self) -> int:
        return max(self.records, key=lambda r: r.max_abs_diff).index if self.records else -1

    @property
    def max_rel_diff(self) -> float:
        """The largest step diff relative to that step's largest |A logit|."""
        return max((r.max_abs_diff / r.scale if r.scale > 0 else 0.0 for r in self.records),
                   default=0.0)

    @property
    def agreement(self) -> float:
        """Fraction of steps where B's top-1 token is A's (1.0 with no steps)."""
        if not self.records:
            return 1.0
        return sum(r.agree for r in self.records) / len(self.records)

    @property
    def first_disagreement(self) -> int | None:
        return next((r.index for r in self.records if not r.agree), None)


CompareEvent = SideStarted | SideLoaded | Generated | StepRecord | CompareSummary


def side_steps(model: CausalLM, prompt_ids: Sequence[int], max_tokens: int,
               forced: Sequence[int] | None = None, cancel: threading.Event | None = None,
               ) -> Iterator[tuple[np.ndarray, int, float]]:
    """``(logits row, token, seconds)`` per step: the prompt prefilled, then one decode
    step per token. The token is the row's argmax (greedy; ends after an EOS token) or,
    teacher-forced, ``forced[i]``. At most ``max_tokens`` steps (``len(forced)`` if given).
    CancelledError between steps once ``cancel`` is set."""
    B, net = model.backend, model.model
    n = len(forced) if forced is not None else max_tokens
    if n <= 0:
        return
    # Per-generation state as generate_step has it (cpu: threads for the current load).
    B.start_generation(SamplingParams(temperature=0.0), prompt_ids, np.random.default_rng(0))
    cache = net.make_cache(len(prompt_ids) + n if B.preallocate_kv else None)
    decode = B.decode_steps()
    eos = model.tokenizer.eos_ids
    try:
        t0 = time.perf_counter()
        logits = prefill(net, prompt_ids, cache, cancel)
        for i in range(n):
            # A copy: a replayed step (cpu) writes its logits into one buffer every time.
            row = np.array(B.to_numpy(logits), dtype=np.float32).reshape(-1)
            seconds = time.perf_counter() - t0
            check_finite(row, f"{B.name} logits at step {i}")
            tok = int(forced[i]) if forced is not None else int(np.argmax(row))
            yield row, tok, seconds
            if i + 1 == n or (forced is None and tok in eos):
                return
            if cancel is not None and cancel.is_set():
                raise CancelledError("The comparison was stopped.")
            t0 = time.perf_counter()
            logits = decode(net, B.array(np.asarray([[tok]], dtype=np.int64)), cache)
    finally:
        decode.release()


def _prompt_ids(model: CausalLM, prompt: str, max_tokens: int,
                cancel: threading.Event | None) -> tuple[list[int], int, str]:
    """The prompt as the Chat tab would send it alone (the model's chat template), or as
    plain text where the model has none; ``max_tokens`` capped to the context."""
    if model.template is not None:
        ids, n = model.plan(messages=[{"role": "user", "content": prompt}],
                            max_tokens=max_tokens, cancel=cancel)
        return ids, n, "chat template"
    ids, n = model.plan(prompt=prompt, max_tokens=max_tokens, cancel=cancel)
    return ids, n, "plain text"


def _release(model: Any) -> None:
    """Close a side's model and give its freed heap back. No gc.collect(): this may run on
    a GUI's worker thread, where collecting could destroy Qt objects off their thread;
    reference counting frees the weights once the model is closed."""
    model.close()
    trim_host_heap()


def compare(source: str | Path | ModelSpec, backend_a: str, backend_b: str,
            prompt: str | None = None, max_tokens: int = 32, *,
            prompt_ids: Sequence[int] | None = None,
            cancel: threading.Event | None = None,
            loader: Loader = load_model, warmup: int = WARMUP_STEPS,
            ) -> Iterator[CompareEvent]:
    """Compare ``backend_a`` and ``backend_b`` on the model file ``source``.

    Yields SideStarted/SideLoaded for each side, a Generated per A step, a StepRecord per
    step once B ran it, then one CompareSummary. ``prompt`` is sent through the model's
    chat template as one user message (plain text if the model has none); ``prompt_ids``
    gives the ids instead. Bad input, an unavailable backend or a file the backend cannot
    run raise the engine's one-sentence errors; ``cancel`` raises CancelledError between
    steps (and between tensors while loading). ``loader`` stands for :func:`load_model`.

    Before its timed steps each side runs the prompt and ``warmup`` decode steps untimed,
    so what a backend does once per process or per generation (compiling kernels,
    capturing a decode step) is not counted as its speed: the figures are those a second
    chat reply would see.
    """
    max_tokens = int_arg(max_tokens, "max_tokens", 1)
    if (prompt is None) == (prompt_ids is None):
        raise InvalidInputError("Give either a prompt or prompt ids to compare.")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise InvalidInputError("The prompt is empty: write something to compare on.")

    def load(side: str, backend: str) -> tuple[Any, SideLoaded, int]:
        rss0 = host_rss()
        t0 = time.perf_counter()
        model = loader(source, backend=backend, cancel=cancel)
        if not isinstance(model, CausalLM):
            kind = getattr(model, "kind", type(model).__name__)
            _release(model)
            raise InvalidInputError(f"Only a local chat model file can be compared; this "
                                    f"one loads as {kind}.")
        info = SideLoaded(side, model.backend.name, model.backend_reason,
                          time.perf_counter() - t0, max(0, host_rss() - rss0))
        return model, info, rss0

    def warm(model: Any, ids: list[int], n: int) -> float:
        """The prompt and ``warmup`` decode steps (at most ``n`` steps in all), untimed."""
        if warmup <= 0:
            return 0.0
        t0 = time.perf_counter()
        for _ in side_steps(model, ids, min(warmup + 1, n), cancel=cancel):
            pass
        return time.perf_counter() - t0

    def stats(model: Any, info: SideLoaded, rss0: int, peak: int, step_s: list[float],
              warm_s: float) -> SideStats:
        return SideStats(info.backend, info.reason, info.load_s, info.load_bytes,
                         max(0, peak - rss0), step_s[0] if step_s else 0.0, step_s,
                         warm_s, model.memory(), model.backend.threads())

    # A: greedy.
    yield SideStarted("a", backend_a)
    model, info_a, rss0 = load("a", backend_a)
    try:
        yield info_a
        if prompt_ids is None:
            ids, n, kind = _prompt_ids(model, prompt, max_tokens, cancel)
        else:
            ids = [int(t) for t in prompt_ids]
            n = min(max_tokens, model.context_length - len(ids))
            if not ids or n < 1:
                raise InvalidInputError(f"The prompt must hold 1 to {model.context_length - 1} "
                                        f"tokens; it holds {len(ids)}.")
            kind = "token ids"
        name = model.name
        warm_a = warm(model, ids, n)
        rows: list[np.ndarray] = []
        tokens: list[int] = []
        texts: list[str] = []
        a_s: list[float] = []
        peak = host_rss()
        decoder = model.tokenizer.stream_decoder()
        eos = model.tokenizer.eos_ids
        for i, (row, tok, s) in enumerate(side_steps(model, ids, n, cancel=cancel)):
            rows.append(row)
            tokens.append(tok)
            a_s.append(s)
            texts.append("" if tok in eos else decoder.add(tok))
            peak = max(peak, host_rss())
            yield Generated(i, tok, texts[-1], s, tok in eos)
        stats_a = stats(model, info_a, rss0, peak, a_s, warm_a)
    finally:
        _release(model)
    del model
    finish = "eos" if tokens and tokens[-1] in eos else "length"

    # B: fed A's tokens.
    yield SideStarted("b", backend_b)
    model, info_b, rss0 = load("b", backend_b)
    records: list[StepRecord] = []
    try:
        yield info_b
        warm_b = warm(model, ids, n)
        peak = host_rss()
        b_s: list[float] = []
        for i, (row, _tok, s) in enumerate(side_steps(model, ids, len(tokens), tokens,
                                                      cancel)):
            a, rows[i] = rows[i], _DROPPED  # A's row is not needed again
            if row.shape != a.shape:
                raise InvalidInputError(f"The backends disagree on the vocabulary size "
                                        f"({a.shape[0]} and {row.shape[0]}).")
            b_s.append(s)
            peak = max(peak, host_rss())
            b_tok = int(np.argmax(row))
            rec = StepRecord(i, tokens[i], texts[i], float(np.max(np.abs(a - row))),
                             float(np.max(np.abs(a))), b_tok, a_s[i], s,
                             "" if b_tok == tokens[i] else model.tokenizer.decode([b_tok]),
                             tokens[i] in eos)
            records.append(rec)
            yield rec
        stats_b = stats(model, info_b, rss0, peak, b_s, warm_b)
    finally:
        _release(model)
    yield CompareSummary(name, len(ids), kind, finish, "".join(texts) + decoder.flush(),
                         stats_a, stats_b, records)
