"""`inferdesk serve` driven by the official `openai` client over real HTTP (uvicorn on
127.0.0.1): chat, completions, embeddings, usage, stop strings, seeds, logprobs, errors,
and a client that hangs up mid-stream."""

from __future__ import annotations

import base64
import json
import threading
import time

import httpx2 as httpx
import numpy as np
import openai
import pytest

from inference.errors import InvalidInputError
from tests.server_support import (  # noqa: F401
    alone,
    client,
    engine,
    http_get,
    http_post,
    server,
    wait_load,
)

HI = [{"role": "user", "content": "Say hello to Paris."}]


def test_models_and_health(client, engine, server):  # noqa: F811
    ids = {m.id for m in client.models.list()}
    assert ids == {engine.llm.name, engine.encoder.name}
    health = http_get(server.url.removesuffix("/v1") + "/health").json()
    assert health["status"] == "ok" and set(health["models"]) == ids


def test_chat_matches_generate_with_usage(client, engine):  # noqa: F811
    ref = alone(engine.llm, HI, max_tokens=6)
    r = client.chat.completions.create(model=engine.llm.name, messages=HI, max_tokens=6,
                                       temperature=0)
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == ("length" if ref.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == ref.n_prompt
    assert r.usage.completion_tokens == ref.n_generated
    assert r.usage.total_tokens == ref.n_prompt + ref.n_generated
    # max_completion_tokens is the newer name of max_tokens; the store alias works too.
    r2 = client.chat.completions.create(model="smollm2", messages=HI, temperature=0,
                                        max_completion_tokens=3)
    assert r2.usage.completion_tokens == 3 and ref.text.startswith(r2.choices[0].message.content)


def test_chat_stream_with_usage(client, engine):  # noqa: F811
    ref = alone(engine.llm, HI, max_tokens=6)
    chunks = list(client.chat.completions.create(
        model=engine.llm.name, messages=HI, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] in ("length", "stop") and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == ref.n_generated
    assert chunks[-1].usage.prompt_tokens == ref.n_prompt


def test_stop_string(client, engine):  # noqa: F811
    ref = alone(engine.llm, HI, max_tokens=6)
    stop = ref.text[len(ref.text) // 2:][:3]  # a piece from the middle of the answer
    assert stop.strip()
    r = client.chat.completions.create(model=engine.llm.name, messages=HI, max_tokens=6,
                                       temperature=0, stop=[stop])
    assert r.choices[0].message.content == ref.text[: ref.text.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_deterministic_and_matches_generate(client, engine):  # noqa: F811
    kw = dict(model=engine.llm.name, messages=HI, max_tokens=6, temperature=0.9, top_p=0.95)
    a = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    ref = alone(engine.llm, HI, max_tokens=6, temperature=0.9, top_p=0.95, seed=7)
    assert a == b == ref.text


def test_chat_logprobs(client, engine):  # noqa: F811
    r = client.chat.completions.create(model=engine.llm.name, messages=HI, max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 4
    assert "".join(c.token for c in content) == r.choices[0].message.content
    # Independent check: teacher-forced logits of prompt + answer on the same model
    # (a prefill GEMM, not the decode mat-vec: float32 rounding differs, hence 1e-3).
    ids, _ = engine.llm.plan(messages=HI, max_tokens=4)
    gen = engine.llm.tokenize(r.choices[0].message.content, add_special_tokens=False)
    assert len(gen) == 4
    z = engine.llm.logits(ids + gen)[len(ids) - 1: -1].astype(np.float64)
    lsm = z - z.max(-1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(-1, keepdims=True))
    for i, c in enumerate(content):
        assert c.logprob == pytest.approx(lsm[i, gen[i]], abs=1e-3)
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token  # greedy
        tops = [t.logprob for t in c.top_logprobs]
        assert tops == sorted(tops, reverse=True)


def test_completions(client, engine):  # noqa: F811
    prompt = "The capital of France is"
    ref = alone(engine.llm, prompt=prompt, max_tokens=5)
    r = client.completions.create(model=engine.llm.name, prompt=prompt, max_tokens=5,
                                  temperature=0, logprobs=2)
    assert r.choices[0].text == ref.text and r.usage.completion_tokens == ref.n_generated
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == ref.text and len(lp.top_logprobs[0]) == 2
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=engine.llm.name, prompt=prompt, max_tokens=5, temperature=0, stream=True))
    assert streamed == ref.text


def test_embeddings_equal_model_embed(client, engine):  # noqa: F811
    texts = ["A cat sits on the mat.", "Quantum physics", ""]
    ref = engine.encoder.embed(texts)
    for fmt in ("float", "base64"):
        r = client.embeddings.create(model=engine.encoder.name, input=texts, encoding_format=fmt)
        got = np.asarray([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")
                          if fmt == "base64" else d.embedding for d in r.data], dtype=np.float32)
        # Batched with other clients' sentences the rows go through GEMMs of another shape.
        np.testing.assert_allclose(got, ref, atol=1e-6)
        assert [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(len(engine.encoder.tokenize(t)) for t in texts)
    one = client.embeddings.create(model=engine.encoder.name, input="A cat sits on the mat.")
    np.testing.assert_allclose(one.data[0].embedding, ref[0], atol=1e-6)
    # The raw base64 payload is little-endian float32.
    raw = http_post(f"{client.base_url}embeddings", json={
        "model": engine.encoder.name, "input": "Quantum physics", "encoding_format": "base64"})
    vec = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vec, ref[1], atol=1e-6)


def _status(fn) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        fn()
    return info.value.status_code, info.value.body


def test_error_paths(client, engine, server):  # noqa: F811
    llm, enc = engine.llm.name, engine.encoder.name
    chat = client.chat.completions.create
    cases = [
        (lambda: chat(model="no-such-model", messages=HI), 404, "model_not_found"),
        (lambda: chat(model=llm, messages=[]), 400, None),
        (lambda: chat(model=llm, messages=HI, n=2), 400, None),
        (lambda: chat(model=llm, messages=HI, temperature=5), 400, None),
        (lambda: chat(model=llm, messages=HI, max_tokens=0), 400, None),
        (lambda: chat(model=llm, messages=[{"role": "wizard", "content": "x"}]), 400, None),
        (lambda: chat(model=llm, messages=HI, stop=["a", "b", "c", "d", "e"]), 400, None),
        (lambda: chat(model=llm, messages=[{"role": "user", "content": "word " * 9000}]),
         400, None),
        (lambda: chat(model=enc, messages=HI), 400, None),
        (lambda: client.embeddings.create(model=llm, input="x"), 400, None),
        (lambda: client.embeddings.create(model=enc, input="x", dimensions=64), 400, None),
        (lambda: client.embeddings.create(model=enc, input=[]), 400, None),
        (lambda: client.embeddings.create(model=enc, input=[[1, 2]]), 400, None),
        (lambda: client.completions.create(model=llm, prompt="x", echo=True), 400, None),
    ]
    for fn, status, code in cases:
        got, body = _status(fn)
        assert got == status, body
        assert body["message"] and body["type"] == "invalid_request_error"
        if code:
            assert body["code"] == code
    base = server.url
    bad_json = http_post(f"{base}/chat/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    nowhere = http_get(f"{base}/nowhere")
    assert nowhere.status_code == 404 and nowhere.json()["error"]["code"] == "not_found"
    huge = http_post(f"{base}/embeddings", content=b"x" * (5 << 20),
                      headers={"content-type": "application/json"})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"

    def chunked():
        yield b'{"model": "' + enc.encode() + b'", "input": "'
        for _ in range(80):
            yield b"y" * 65536
        yield b'"}'

    huge2 = http_post(f"{base}/embeddings", content=chunked(),
                       headers={"content-type": "application/json"})
    assert huge2.status_code == 413
    assert http_get(server.url.removesuffix("/v1") + "/health").status_code == 200


def test_api_key_and_exposure(engine):  # noqa: F811
    from inference.server.run import ServerThread, check_exposure

    with pytest.raises(InvalidInputError, match="api-key"):
        check_exposure("0.0.0.0", None)
    check_exposure("0.0.0.0", "k")
    check_exposure("::1", None)
    srv = ServerThread(engine, api_key="s3cret").start()
    try:
        wrong = openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0)
        status, body = _status(wrong.models.list)
        assert status == 401 and body["code"] == "invalid_api_key"
        missing = http_get(f"{srv.url}/models")
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        assert http_get(srv.url.removesuffix("/v1") + "/health").status_code == 200
        ok = openai.OpenAI(base_url=srv.url, api_key="s3cret", max_retries=0)
        assert {m.id for m in ok.models.list()} == {engine.llm.name, engine.encoder.name}
    finally:
        srv.stop(close_engine=False)


def test_cli_refuses_exposed_server_without_key(capsys):
    from inference.cli import main

    assert main(["serve", "--model", "smollm2", "--host", "0.0.0.0"]) == 2
    assert "--api-key" in capsys.readouterr().err


def test_disconnect_cancels_within_a_token(engine, server):  # noqa: F811
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 200, "temperature": 0,
            "stream": True}
    read = 0
    wait_load(engine.scheduler)  # an earlier test's request must not finish in between
    before = len(engine.scheduler.finished)
    with httpx.Client(timeout=300) as c, c.stream("POST", f"{server.url}/chat/completions",
                                                  json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                read += 1
            if read >= 3:
                break  # leaving the block closes the connection mid-stream
    assert wait_load(engine.scheduler) == (0, 0)
    if before < engine.scheduler.finished.maxlen:
        assert len(engine.scheduler.finished) == before + 1  # this request alone
    reason, n = engine.scheduler.finished[-1]
    assert reason == "cancelled"
    # Tokens already on the wire when we hung up, plus at most the step in flight when the
    # server saw the hang-up (a step is one token per sequence).
    assert n <= read + 3, (n, read)


def test_non_streaming_disconnect_cancels(engine, server):  # noqa: F811
    """The client hangs up while its reply is being generated: the sequence is cancelled.
    The hang-up follows the scheduler's own report that the sequence runs (a timeout would
    race the model, which may finish a short reply first on a fast machine)."""
    import socket
    from urllib.parse import urlsplit

    body = json.dumps({"model": engine.llm.name, "max_tokens": 200, "temperature": 0,
                       "messages": [{"role": "user", "content":
                                     "Count from 1 to 1000, separated by commas."}]}).encode()
    url = urlsplit(server.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=60)
    sock.sendall(f"POST {url.path}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    deadline = time.monotonic() + 120
    while engine.scheduler.load()[0] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.scheduler.load()[0] == 1, "the request never started"
    sock.close()
    assert wait_load(engine.scheduler) == (0, 0)
    reason, n = engine.scheduler.finished[-1]
    assert reason == "cancelled" and n < 200


class _HeldDecode:
    """A decoder layer whose decode steps wait for ``gate``: the request running stays
    running, however fast the machine or short its answer."""

    def __init__(self, layer, gate: threading.Event):
        self.layer, self.gate = layer, gate

    def __call__(self, x, cache):
        if x.shape[1] == 1:
            self.gate.wait(120)
        return self.layer(x, cache)

    def __getattr__(self, name):
        return getattr(self.layer, name)


def test_queue_full_is_429(engine, monkeypatch):  # noqa: F811
    from inference.server.app import Engine
    from inference.server.run import ServerThread

    # The session's server runs this same model: its requests of earlier tests end first,
    # so none of its steps runs beside this test's or meets the held layers.
    assert wait_load(engine.scheduler) == (0, 0)
    gate = threading.Event()
    monkeypatch.setattr(engine.llm.model, "layers",
                        [_HeldDecode(la, gate) for la in engine.llm.model.layers])
    small = Engine(engine.llm, None, parallel=1, max_waiting=1)
    srv = ServerThread(small).start()
    body = {"model": engine.llm.name, "messages": HI, "max_tokens": 100, "temperature": 0,
            "stream": True}
    try:
        with httpx.Client(timeout=300) as c, \
                c.stream("POST", f"{srv.url}/chat/completions", json=body) as first:
            assert first.status_code == 200
            next(first.iter_lines())  # its stream has begun: submitted, maybe not yet running
            # running (its thread may lag on a busy box)
            ended = small.scheduler.finished  # (reason, tokens) of requests that ended
            assert wait_load(small.scheduler, (1, 0)) == (1, 0), list(ended)
            with c.stream("POST", f"{srv.url}/chat/completions", json=body) as second:
                assert second.status_code == 200  # waiting
                assert wait_load(small.scheduler, (1, 1)) == (1, 1), list(ended)
                third = http_post(f"{srv.url}/chat/completions", json={**body, "stream": False})
                assert third.status_code == 429
                assert third.json()["error"]["code"] == "queue_full"
                assert third.headers["retry-after"]
                gate.set()
    finally:
        gate.set()
        srv.stop()
