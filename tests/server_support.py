"""Fixtures of the server and remote-engine tests: the bundled models on the `cpu` backend
behind a real uvicorn on 127.0.0.1 (a free port), once per session."""

from __future__ import annotations

import json
import time
from functools import partial

import httpx2 as httpx
import pytest

from inference.events import DoneEvent
from inference.sampling import SamplingParams

# Plain requests of the tests: a busy machine can hold a reply past httpx's 5 s default, and
# what a test checks is the server's answer, not its speed.
http_get = partial(httpx.get, timeout=300.0)
http_post = partial(httpx.post, timeout=300.0)

def wait_load(sched, want: tuple[int, int] = (0, 0), timeout: float = 120.0
              ) -> tuple[int, int]:
    """The scheduler's (running, waiting) once it reads ``want`` (default: idle), or at
    the deadline (a busy machine's scheduler thread may lag the client)."""
    deadline = time.monotonic() + timeout
    while sched.load() != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return sched.load()


@pytest.fixture(scope="session")
def engine():
    from inference.server.run import load_engine

    eng = load_engine("smollm2", "minilm", backend="cpu", parallel=8)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def server(engine):
    from inference.server.run import ServerThread

    srv = ServerThread(engine).start()
    yield srv
    srv.stop(close_engine=False)


@pytest.fixture()
def client(server):
    import openai

    with openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0,
                       timeout=300) as c:
        yield c


_ALONE: dict[str, DoneEvent] = {}


def alone(llm, messages=None, prompt=None, max_tokens=6, temperature=0.0, seed=None,
          top_p=1.0, stop=()) -> DoneEvent:
    """The same request through CausalLM.generate, in this process, by itself (computed
    once per session: several tests compare against the same references)."""
    key = json.dumps([id(llm), messages, prompt, max_tokens, temperature, seed, top_p,
                      list(stop)])
    if key not in _ALONE:
        sp = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
        events = llm.generate(messages=messages, prompt=prompt, max_tokens=max_tokens,
                              sampling=sp, stop=stop)
        _ALONE[key] = [e for e in events if isinstance(e, DoneEvent)][0]
    return _ALONE[key]
