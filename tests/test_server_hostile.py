"""`inferdesk serve` against hostile or careless clients: any integer seed, a request that
makes the engine raise, a worker thread that stops, fields OpenAI's schema refuses, a long
prompt's preparation, a client that abandons an embedding job, a foreign Host header, the
key-less /health, SIGTERM during a stream, and the heap given back once idle."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx2 as httpx
import numpy as np
import pytest

from inference.errors import CancelledError
from tests.server_support import engine, server, wait_load  # noqa: F401

HI = [{"role": "user", "content": "Say hello to Paris."}]
WAIT = 60  # seconds a request may take before the test calls it hung


def _post(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(url, json=body, timeout=WAIT, **kw)


def _health(srv) -> httpx.Response:
    return httpx.get(srv.url.removesuffix("/v1") + "/health", timeout=WAIT)


def test_any_integer_seed_is_served_and_the_scheduler_lives(engine, server):  # noqa: F811
    chat = f"{server.url}/chat/completions"
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 3, "temperature": 0.9}
    texts = {}
    for seed in (-1, -5, 2**64 - 5, 2**70, 0):
        r = _post(chat, {**body, "seed": seed})
        assert r.status_code == 200, r.text
        texts[seed] = r.json()["choices"][0]["message"]["content"]
    # Seeds are taken modulo 2^64: -5 and 2^64 - 5 are one seed.
    assert texts[-5] == texts[2**64 - 5]
    r = _post(f"{server.url}/completions", {"model": engine.llm.name, "prompt": "Hi",
                                            "max_tokens": 2, "seed": -123456789})
    assert r.status_code == 200, r.text
    assert _health(server).json()["status"] == "ok"


def test_a_tiny_temperature_samples_as_greedy(engine, server):  # noqa: F811
    """A temperature of 1e-310 (valid: within 0-2) sharpens to the argmax, as 0 does,
    instead of overflowing the logits into NaN probabilities."""
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 4, "seed": 3}
    greedy = _post(f"{server.url}/chat/completions", {**body, "temperature": 0})
    tiny = _post(f"{server.url}/chat/completions", {**body, "temperature": 1e-310})
    assert tiny.status_code == 200, tiny.text
    assert (tiny.json()["choices"][0]["message"]["content"]
            == greedy.json()["choices"][0]["message"]["content"])


def test_a_request_that_raises_fails_alone(engine, server, monkeypatch):  # noqa: F811
    make = engine.llm.model.make_cache
    calls = []

    def once_broken(n):
        calls.append(n)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return make(n)

    monkeypatch.setattr(engine.llm.model, "make_cache", once_broken)
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 2, "temperature": 0}
    bad = _post(f"{server.url}/chat/completions", body)
    assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"
    assert "injected" in bad.json()["error"]["message"]
    ok = _post(f"{server.url}/chat/completions", body)
    assert ok.status_code == 200, ok.text
    assert _health(server).status_code == 200


class _Fatal(BaseException):
    """What no worker survives (its thread ends)."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stopped_worker_is_unhealthy_and_refuses_clearly(engine, monkeypatch):  # noqa: F811
    from inference.server.app import Engine
    from inference.server.run import ServerThread

    small = Engine(engine.llm, None, parallel=1)

    def fatal() -> None:
        raise _Fatal("the step fell over")

    monkeypatch.setattr(small.scheduler, "_step", fatal)
    srv = ServerThread(small).start()
    try:
        body = {"model": engine.llm.name, "messages": HI, "max_tokens": 2}
        first = _post(f"{srv.url}/chat/completions", body)
        assert first.status_code == 503 and "restart" in first.json()["error"]["message"]
        small.scheduler._thread.join(WAIT)
        health = _health(srv)
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        assert "chat worker stopped" in health.json()["error"]
        again = _post(f"{srv.url}/chat/completions", body)
        assert again.status_code == 503 and again.json()["error"]["code"] == "worker_stopped"
    finally:
        srv.stop()


def test_fields_are_checked_against_openai_schema(engine, server):  # noqa: F811
    chat, emb = f"{server.url}/chat/completions", f"{server.url}/embeddings"
    base = {"model": engine.llm.name, "messages": HI, "max_tokens": 1}
    refused = [
        ({**base, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({**base, "response_format": {"type": "json_object"}}, "response_format"),
        ({**base, "top_logprobs": 3}, "top_logprobs"),
        ({**base, "max_tokens": True}, "max_tokens"),
        ({**base, "temperature": "0.5"}, "temperature"),
        ({**base, "stream": "yes"}, "stream"),
        ({**base, "seed": 1.5}, "seed"),
        ({**base, "top_k": 40}, "top_k"),
    ]
    for body, field in refused:
        r = _post(chat, body)
        assert r.status_code == 400, (field, r.text)
        assert field in r.json()["error"]["message"], r.text
    # A lone surrogate (valid JSON, invalid Unicode), in the model name or a message.
    for raw in (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}',
                b'{"model": "smollm2", "messages": [{"role": "user", "content": "\\udfff"}]}',
                b'{"model": "x", "input": ["a", "\\ud83d"]}'):
        r = httpx.post(chat if b"messages" in raw else emb, content=raw, timeout=WAIT,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and "Unicode" in r.json()["error"]["message"], r.text
    # Fields of OpenAI's API that change nothing here are accepted.
    assert _post(chat, {**base, "user": "u1", "store": False, "metadata": {}}).status_code == 200
    r = _post(emb, {"model": engine.encoder.name, "input": "x", "user": "u1"})
    assert r.status_code == 200
    assert _post(emb, {"model": engine.encoder.name, "input": "x", "seed": 1}).status_code == 400


def test_prompt_preparation_leaves_the_event_loop_free(engine, server, monkeypatch):  # noqa: F811
    """A prompt still being tokenized (held here) keeps neither /health nor others waiting."""
    entered, release = threading.Event(), threading.Event()
    plan = engine.llm.plan

    def held_plan(*a, **kw):
        entered.set()
        release.wait(WAIT)
        return plan(*a, **kw)

    monkeypatch.setattr(engine.llm, "plan", held_plan)
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 1}
    out: list[httpx.Response] = []
    t = threading.Thread(target=lambda: out.append(_post(f"{server.url}/chat/completions",
                                                         body)))
    t.start()
    try:
        assert entered.wait(WAIT)
        health = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=WAIT / 3)
        models = httpx.get(f"{server.url}/models", timeout=WAIT / 3)
        assert health.status_code == 200 and models.status_code == 200
        assert not release.is_set()  # answered while the prompt was still being prepared
    finally:
        release.set()
        t.join(WAIT)
    assert out and out[0].status_code == 200


class _SlowEncoder:
    """An encoder whose call on ["slow"] runs until cancelled (or released)."""

    name, kind, dim = "slow-embed", "encoder", 4

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.cancelled = 0

    def tokenize(self, text: str) -> list[int]:
        return [1] * (len(text) + 2)

    def embed(self, sentences, cancel=None, **_):
        if "slow" in sentences:
            self.entered.set()
            while not self.release.wait(0.01):
                if cancel is not None and cancel.is_set():
                    self.cancelled += 1
                    raise CancelledError("cancelled")
        return np.ones((len(sentences), self.dim), dtype=np.float32)


def _raw_request(url: str, path: str, body: dict) -> socket.socket:
    u = urlsplit(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((u.hostname, u.port), timeout=WAIT)
    sock.sendall(f"POST {u.path}{path} HTTP/1.1\r\nHost: {u.netloc}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    return sock


def test_an_abandoned_embedding_job_stops(engine):  # noqa: F811
    from inference.server.app import Engine
    from inference.server.run import ServerThread

    enc = _SlowEncoder()
    srv = ServerThread(Engine(None, enc)).start()
    try:
        sock = _raw_request(srv.url, "/embeddings", {"model": enc.name, "input": ["slow"]})
        assert enc.entered.wait(WAIT)
        sock.close()  # the client gives up while its job runs
        fast = httpx.post(f"{srv.url}/embeddings", json={"model": enc.name, "input": ["x"]},
                          timeout=WAIT / 3)
        assert fast.status_code == 200 and len(fast.json()["data"]) == 1
        assert enc.cancelled == 1
    finally:
        enc.release.set()
        srv.stop()


def test_host_allow_list_on_a_keyless_loopback_server(engine, server):  # noqa: F811
    from inference.server.run import ServerThread, allowed_hosts

    health = server.url.removesuffix("/v1") + "/health"
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example"):
        r = httpx.get(health, headers={"Host": host}, timeout=WAIT)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", host
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}",
                 f"[::1]:{server.port}", "LOCALHOST"):
        assert httpx.get(health, headers={"Host": host}, timeout=WAIT).status_code == 200
    assert allowed_hosts("127.0.0.1", 8080, None, ["*"]) is None
    assert "box.lan:8080" in allowed_hosts("127.0.0.1", 8080, None, ["box.lan"])
    keyed = ServerThread(engine, api_key="k").start()
    try:  # a page rebinding its name to 127.0.0.1 cannot know the key
        r = httpx.get(keyed.url.removesuffix("/v1") + "/health",
                      headers={"Host": "evil.example"}, timeout=WAIT)
        assert r.status_code == 200
    finally:
        keyed.stop(close_engine=False)


def test_health_lists_models_only_with_the_key(engine):  # noqa: F811
    from inference.server.run import ServerThread

    srv = ServerThread(engine, api_key="k").start()
    try:
        anon = _health(srv)
        assert anon.status_code == 200 and "models" not in anon.json()
        keyed = httpx.get(srv.url.removesuffix("/v1") + "/health", timeout=WAIT,
                          headers={"Authorization": "Bearer k"})
        assert keyed.json()["models"] == [engine.llm.name, engine.encoder.name]
    finally:
        srv.stop(close_engine=False)


def test_heap_is_given_back_once_idle(engine, server, monkeypatch):  # noqa: F811
    import inference.server.embed_batcher as eb
    import inference.server.scheduler as sch

    trims: list[str] = []
    monkeypatch.setattr(sch, "trim_host_heap", lambda: trims.append("chat"))
    monkeypatch.setattr(eb, "trim_host_heap", lambda: trims.append("embed"))
    monkeypatch.setattr(sch, "IDLE_TRIM_S", 0.05)
    monkeypatch.setattr(eb, "IDLE_TRIM_S", 0.05)
    assert _post(f"{server.url}/chat/completions", {"model": engine.llm.name, "messages": HI,
                                                    "max_tokens": 1}).status_code == 200
    assert _post(f"{server.url}/embeddings", {"model": engine.encoder.name,
                                              "input": "x"}).status_code == 200
    deadline = time.monotonic() + WAIT
    while {"chat", "embed"} - set(trims) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert {"chat", "embed"} <= set(trims)


def test_sigterm_during_a_stream_stops_serve():
    """`inferdesk serve` with a stream open: SIGTERM ends the process after the graceful
    shutdown timeout (1 s here), cutting the stream, not when the stream would end (4,000 tokens
    on a 135M model on the CPU: a minute or more)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "inference.cli", "serve", "--model",
                             "smollm2", "--backend", "cpu", "--port", "0", "--parallel", "1",
                             "--shutdown-timeout", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line
        url = line.split(" at ")[-1].strip()
        body = {"model": "smollm2", "max_tokens": 4000, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Count from 1 to 5000."}]}
        seen: list[str] = []
        with httpx.Client(timeout=WAIT) as c, \
                c.stream("POST", f"{url}/chat/completions", json=body) as r:
            lines = r.iter_lines()
            assert "data: " in next(lines)
            proc.send_signal(signal.SIGTERM)
            try:
                seen.extend(lines)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                pass  # the server cut the stream: what a shutdown does
        assert "data: [DONE]" not in seen  # cut, not finished
        proc.wait(WAIT)
        # uvicorn ends by re-raising the signal it caught: the exit status of SIGTERM.
        assert proc.returncode in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
