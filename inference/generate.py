"""Token generation, layered as in mlx-lm: generate_step yields ids, stream_generate yields
events with text and timings, generate returns the final DoneEvent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from inference.backends.base import trim_host_heap
from inference.errors import CancelledError, NumericalError
from inference.events import DoneEvent, GenerationEvent, TokenEvent
from inference.models.protocol import CausalModel
from inference.sampling import SamplingParams
from inference.validate import first_bad_layer

# Prompt tokens per forward call during prefill unless the backend sets its own
# (``Backend.prefill_chunk``): cancel is checked between chunks, and activations stay those
# of one chunk whatever the prompt's length.
PREFILL_CHUNK = 512


def prefill(model: CausalModel, prompt_ids: Sequence[int], cache: Any,
            cancel: threading.Event | None = None, chunk: int | None = None) -> Any:
    """Run the prompt through ``model`` in chunks; the last position's logits (1, 1, vocab).
    Raises CancelledError between chunks once ``cancel`` is set."""
    B = model.B
    chunk = chunk or B.prefill_chunk or PREFILL_CHUNK
    logits = None
    for start in range(0, len(prompt_ids), chunk):
        if cancel is not None and cancel.is_set():
            raise CancelledError("Generation was cancelled during prefill.")
        piece = np.asarray([prompt_ids[start:start + chunk]], dtype=np.int64)
        logits = model(B.array(piece), cache, last_only=True)
        if start + chunk < len(prompt_ids):
            B.end_chunk(logits)  # computed now, its scratch freed before the next chunk
    return logits


def generate_step(model: CausalModel, prompt_ids: Sequence[int], sampling: SamplingParams,
                  rng: np.random.Generator, max_len: int | None = None,
                  cancel: threading.Event | None = None, prompt_cache: Any = None
                  ) -> Iterator[int]:
    """Prefill the prompt (in chunks, checking ``cancel``; with a ``PromptCache``, only what
    the last turn's cache lacks), then yield one sampled token id per step, forever.
    NumericalError if a step's logits hold NaN or Inf.

    Inside the loop only the sampled id crosses from the device (the sampler's ``read``,
    -1 for a logits row that is not finite) and back (as the next step's input); the KV
    cache and the causal mask stay with the backend. With a lazy sampler (MLX, CUDA) the
    token stays on the device and step n+1 is queued before step n is read, as mlx-lm's
    generate_step does, so the device never waits for the host; the others sample
    synchronously. The sampler runs each step (``sampler.decode``: the model, or a
    captured step replayed, as CUDA graphs do).
    """
    B = model.B
    sampler = B.start_generation(sampling, prompt_ids, rng)
    owned = False
    if prompt_cache is not None:  # a PromptCache: prefill only what the last turn lacks
        cache, skip, owned = prompt_cache.begin(model, prompt_ids, max_len)
    else:
        cache, skip = model.make_cache(max_len if B.preallocate_kv else None), 0
    seen = list(prompt_ids)

    def step(logits: Any) -> Any:
        return sampler.sample(B.reshape(logits, (logits.shape[-1],)))

    def checked(tok: Any) -> int:
        t = sampler.read(tok)
        if t < 0:
            where = first_bad_layer(model, lambda: model(
                B.array(np.asarray([seen], dtype=np.int64)), model.make_cache(len(seen)),
                last_only=True), B.to_numpy)
            raise NumericalError(f"The logits after {len(seen)} tokens contain NaN or "
                                 f"infinite values, first in {where}; the model weights or "
                                 f"its settings are broken.")
        seen.append(t)
        return t

    try:
        tok = step(prefill(model, prompt_ids[skip:], cache, cancel))
        while True:
            if sampler.lazy:
                nxt = step(sampler.decode(model, tok, cache))
                t = checked(tok)
                if owned:
                    prompt_cache.fed(t)  # already fed to the model above
                yield t
            else:
                t = checked(tok)
                yield t
                nxt = step(sampler.decode(model, tok, cache))
                if owned:
                    prompt_cache.fed(t)
            tok = nxt
    finally:
        sampler.close()
        if owned:
            prompt_cache.end()


def _held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that could still grow into a stop string."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


class Generation:
    """One sequence's bookkeeping outside the forward pass, fed one sampled id at a time:
    text deltas (held back while they could still grow into a stop string), the finish
    reason, and timings. ``stream_generate`` drives it from ``generate_step``; the server's
    scheduler drives one per sequence from its batched steps.

    Timings follow what a user feels: ttft includes prefill and the first sample;
    decode tok/s counts tokens after the first over the time since the first.
    """

    def __init__(self, tokenizer: Any, n_prompt: int, max_tokens: int, eos_ids: set[int],
                 stop: Sequence[str] = (), t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0
        self.n_prompt = n_prompt
        self.max_tokens = max_tokens
        self.eos_ids = eos_ids
        self.stop = [s for s in stop if s]
        self.decoder = tokenizer.stream_decoder() if tokenizer is not None else None
        self.ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.steps = 0
        self.finish: str | None = None if max_tokens > 0 else "length"  # set when it ends
        self.ttft = self.prefill_tps = self.decode_tps = 0.0
        self.t_first = self.t0

    def push(self, tok: int, text: str | None = None) -> list[TokenEvent]:
        """Account for the next sampled id; returns the event it makes (none for EOS).
        ``text``: the token already decoded (a remote engine streams text, ``tok`` -1)."""
        i = self.steps
        self.steps += 1
        now = time.perf_counter()
        if i == 0:
            self.t_first = now
            self.ttft = now - self.t0
            self.prefill_tps = self.n_prompt / self.ttft if self.ttft > 0 else 0.0
        elif now > self.t_first:
            self.decode_tps = i / (now - self.t_first)
        if tok in self.eos_ids:
            self.finish = "eos"
            return []
        self.ids.append(tok)
        self.text += self.decoder.add(tok) if text is None else text
        cut = min((j for j in (self.text.find(s) for s in self.stop) if j >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.finish = "stop"
        elif self.steps >= self.max_tokens:
            self.finish = "length"
        safe = len(self.text) if self.finish == "stop" else (
            len(self.text) - _held_back(self.text, self.stop))
        delta, self.emitted = self.text[self.emitted:safe], max(self.emitted, safe)
        return [TokenEvent(delta, tok, i, now - self.t0, self.ttft, self.prefill_tps,
                           self.decode_tps)]

    def close(self, reason: str | None = None, memory: Any = None, n_cached: int = 0,
              threads: tuple[int, int] | None = None) -> list[GenerationEvent]:
        """End the sequence (``reason`` if it had not finished by itself, e.g. "cancelled"):
        the held-back tail as a last TokenEvent if any, then the DoneEvent."""
        self.finish = self.finish or reason or "length"
        out: list[GenerationEvent] = []
        if self.finish != "stop":
            # Release what was held back: a partial stop string that never completed, or
            # the bytes of an unfinished UTF-8 character (flushed as U+FFFD).
            self.text += self.decoder.flush() if self.decoder is not None else ""
            if self.emitted < len(self.text):
                out.append(TokenEvent(self.text[self.emitted:], -1, len(self.ids),
                                      time.perf_counter() - self.t0, self.ttft,
                                      self.prefill_tps, self.decode_tps))
                self.emitted = len(self.text)
        out.append(DoneEvent(
            text=self.text, token_ids=self.ids, n_prompt=self.n_prompt,
            n_generated=len(self.ids), finish_reason=self.finish, ttft_s=self.ttft,
            prefill_tok_s=self.prefill_tps, decode_tok_s=self.decode_tps,
            total_s=time.perf_counter() - self.t0, memory=memory, n_cached=n_cached,
            threads=threads,
        ))
        return out


def stream_generate(
    model: CausalModel,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    sampling: SamplingParams,
    eos_ids: set[int],
    stop: Sequence[str] = (),
    cancel: threading.Event | None = None,
    max_len: int | None = None,
    prompt_cache: Any = None,
) -> Iterator[GenerationEvent]:
    """Yield a TokenEvent per generated token, then one DoneEvent (see :class:`Generation`)."""
    gen = Generation(tokenizer, len(prompt_ids), max_tokens, eos_ids, stop)
    rng = np.random.default_rng(sampling.seed)
    steps = generate_step(model, prompt_ids, sampling, rng, max_len, cancel, prompt_cache)
    try:
        while gen.finish is None:
            if cancel is not None and cancel.is_set():
                gen.finish = "cancelled"
                break
            try:
                tok = next(steps)
            except CancelledError:
                gen.finish = "cancelled"
                break
            yield from gen.push(tok)
    finally:
        steps.close()
    try:
        yield from gen.close(memory=model.B.memory(),
                             n_cached=prompt_cache.reused if prompt_cache is not None else 0,
                             threads=model.B.threads())
    finally:
        # The prefill's freed temporaries (up to keep_freed_heap's 256 MB after a long
        # prompt) go back to the OS once the reply is out; within a prefill they are reused.
        trim_host_heap()
