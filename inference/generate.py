"""Token generation, layered as in mlx-lm: generate_step yields ids, stream_generate yields
events with text and timings, generate returns the final DoneEvent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from inference.backends.base import SamplingParams
from inference.events import DoneEvent, GenerationEvent, TokenEvent


def generate_step(model: Any, prompt_ids: Sequence[int], sampling: SamplingParams,
                  rng: np.random.Generator, max_len: int | None = None,
                  prompt_cache: Any = None) -> Iterator[int]:
    """Prefill the prompt, then yield one sampled token id per step, forever.

    Inside the loop only the sampled id crosses from the device (backend.sample) and back
    (as the next step's input); the KV cache and the causal mask stay with the backend.
    """
    B = model.B
    owned = False
    if prompt_cache is not None:  # a PromptCache: prefill only what the last turn lacks
        cache, skip, owned = prompt_cache.begin(model, prompt_ids, max_len)
    else:
        cache, skip = model.make_cache(max_len), 0
    try:
        history = list(prompt_ids)
        logits = model(B.array(np.asarray([prompt_ids[skip:]], dtype=np.int64)), cache,
                       last_only=True)
        while True:
            row = B.reshape(logits, (logits.shape[-1],))
            tok = B.sample(row, sampling, history, rng)
            history.append(tok)
            yield tok
            logits = model(B.array(np.asarray([[tok]], dtype=np.int64)), cache, last_only=True)
            if owned:
                prompt_cache.fed(tok)
    finally:
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


def stream_generate(
    model: Any,
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
    """Yield a TokenEvent per generated token, then one DoneEvent.

    Timings follow what a user feels: ttft includes prefill and the first sample;
    decode tok/s counts tokens after the first over the time since the first.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(sampling.seed)
    decoder = tokenizer.stream_decoder()
    ids: list[int] = []
    text = ""
    emitted = 0
    finish = "length"
    ttft = prefill_tps = decode_tps = 0.0
    t_first = t0
    steps = generate_step(model, prompt_ids, sampling, rng, max_len, prompt_cache)
    try:
        for i in range(max_tokens):
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            tok = next(steps)
            now = time.perf_counter()
            if i == 0:
                t_first = now
                ttft = now - t0
                prefill_tps = len(prompt_ids) / ttft if ttft > 0 else 0.0
            elif now > t_first:
                decode_tps = i / (now - t_first)
            if tok in eos_ids:
                finish = "eos"
                break
            ids.append(tok)
            text += decoder.add(tok)
            cut = min((j for j in (text.find(s) for s in stop if s) if j >= 0), default=-1)
            if cut >= 0:
                text = text[:cut]
                finish = "stop"
            safe = len(text) if finish == "stop" else len(text) - _held_back(text, stop)
            delta, emitted = text[emitted:safe], max(emitted, safe)
            yield TokenEvent(delta, tok, i, now - t0, ttft, prefill_tps, decode_tps)
            if finish == "stop":
                break
    finally:
        steps.close()
    if finish != "stop":
        # Release what was held back: a partial stop string that never completed, or the
        # bytes of an unfinished UTF-8 character (flushed as U+FFFD).
        text += decoder.flush()
        if emitted < len(text):
            yield TokenEvent(text[emitted:], -1, len(ids), time.perf_counter() - t0, ttft,
                             prefill_tps, decode_tps)
    done = DoneEvent(
        text=text, token_ids=ids, n_prompt=len(prompt_ids), n_generated=len(ids),
        finish_reason=finish, ttft_s=ttft, prefill_tok_s=prefill_tps, decode_tok_s=decode_tps,
        total_s=time.perf_counter() - t0, memory=model.B.memory(),
        n_cached=prompt_cache.reused if prompt_cache is not None else 0,
    )
    yield done
