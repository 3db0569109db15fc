"""A short load test: 32 requests from 8 clients at once against the real server, a mix
of chat (streamed and not), embeddings, streams the client abandons, and malformed
requests. Every valid request completes correctly, the server stays up, and its memory
and threads return to where they were."""

from __future__ import annotations

import gc
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import openai

from inference.backends.base import host_rss, trim_host_heap
from tests.server_support import alone, engine, server  # noqa: F401

PROMPTS = [[{"role": "user", "content": "Name a colour."}],
           [{"role": "user", "content": "Name a fruit."}]]
SENTENCES = ["The sky is blue.", "Bananas are yellow.", "A short one.", "Lorem ipsum dolor."]
MAX_TOKENS = 3
RSS_SLACK = 48 << 20  # allocator and interpreter noise; 32 leaked KV caches would be ~64 MB


def _settle(engine) -> None:  # noqa: F811
    deadline = time.monotonic() + 120
    while engine.scheduler.load() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    gc.collect()
    trim_host_heap()


def _job(kind: str, i: int, url: str, llm: str, enc: str):
    with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600) as c:
        p = PROMPTS[i % 2]
        if kind == "chat":
            r = c.chat.completions.create(model=llm, messages=p, max_tokens=MAX_TOKENS,
                                          temperature=0)
            return kind, i, r.choices[0].message.content
        if kind == "stream":
            text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                model=llm, messages=p, max_tokens=MAX_TOKENS, temperature=0, stream=True)
                if ch.choices)
            return kind, i, text
        if kind == "cancel":
            with c.chat.completions.create(model=llm, messages=p, max_tokens=100,
                                           temperature=0, stream=True) as s:
                for _ in s:
                    break  # hang up after the first chunk
            return kind, i, None
        if kind == "embed":
            sents = SENTENCES[i % 4:] + SENTENCES[: i % 4]
            r = c.embeddings.create(model=enc, input=sents)
            return kind, i, (sents, np.asarray([d.embedding for d in r.data], dtype=np.float32))
    # Malformed: not JSON, an unknown model, a wrong type; each must be a 4xx, never a 500.
    bodies = [b"{broken", b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
              b'{"model": "%s", "messages": "not a list"}' % llm.encode()]
    r = httpx.post(f"{url}/chat/completions", content=bodies[i % 3],
                   headers={"content-type": "application/json"}, timeout=60)
    return kind, i, r.status_code


def test_load_mix_32_requests_8_clients(engine, server):  # noqa: F811
    llm, enc = engine.llm.name, engine.encoder.name
    expect = [alone(engine.llm, p, max_tokens=MAX_TOKENS).text for p in PROMPTS]
    # Warm-up, then the baseline: one of each kind, so first-use allocations are counted.
    for kind in ("chat", "cancel", "embed"):
        _job(kind, 0, server.url, llm, enc)
    _settle(engine)
    rss0, threads0 = host_rss(), threading.active_count()

    kinds = ["chat"] * 8 + ["stream"] * 6 + ["cancel"] * 4 + ["embed"] * 8 + ["bad"] * 6
    random.Random(0).shuffle(kinds)
    assert len(kinds) == 32
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: _job(a[1], a[0], server.url, llm, enc),
                                enumerate(kinds)))
    for kind, i, out in results:
        if kind in ("chat", "stream"):
            assert out == expect[i % 2], (kind, i)
        elif kind == "embed":
            sents, got = out
            np.testing.assert_allclose(got, engine.encoder.embed(sents), atol=1e-6)
        elif kind == "bad":
            assert out in (400, 404), (i, out)
    assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200
    _settle(engine)
    assert engine.scheduler.load() == (0, 0)
    cancelled = [r for r, _ in engine.scheduler.finished if r == "cancelled"]
    assert len(cancelled) >= 4
    assert threading.active_count() <= threads0
    assert host_rss() - rss0 < RSS_SLACK, (host_rss() - rss0) >> 20
