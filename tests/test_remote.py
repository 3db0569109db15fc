"""The remote engine (load_model on a URL) against a real `inferdesk serve` on 127.0.0.1,
plus a server that loses the connection mid-stream and one that sends malformed chunks."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from inference import load_model
from inference.errors import BackendUnavailableError, InvalidInputError, ModelNotFoundError
from inference.events import DoneEvent, TokenEvent
from inference.remote import RemoteEncoder, RemoteError, RemoteLM
from inference.sampling import SamplingParams
from inference.server.run import ServerThread
from tests.server_support import alone, engine, server  # noqa: F401

HI = [{"role": "user", "content": "Say hello to Paris."}]


def _run(events):
    evs = list(events)
    assert isinstance(evs[-1], DoneEvent)
    return [e for e in evs if isinstance(e, TokenEvent)], evs[-1]


def test_chat_on_a_remote_inferdesk(engine, server):  # noqa: F811
    remote = load_model(f"{server.url}#{engine.llm.name}")
    try:
        assert isinstance(remote, RemoteLM) and remote.kind == "causal"
        assert remote.backend.name == "remote" and server.url in remote.backend_reason
        mem = remote.memory()
        assert mem.device_used is None and mem.device_total is None and mem.host_rss > 0
        ref = alone(engine.llm, HI, max_tokens=6)
        tokens, done = _run(remote.generate(messages=HI, max_tokens=6,
                                            sampling=SamplingParams(temperature=0.0)))
        assert done.text == "".join(t.text for t in tokens) == ref.text
        assert (done.n_prompt, done.n_generated) == (ref.n_prompt, ref.n_generated)
        assert done.finish_reason == ref.finish_reason.replace("eos", "stop")
        assert done.ttft_s > 0 and done.total_s >= done.ttft_s
        # Plain completion, stop strings and seeds go through too.
        _, plain = _run(remote.generate(prompt="The capital of France is", max_tokens=4,
                                        sampling=SamplingParams(temperature=0.0)))
        assert plain.text == alone(engine.llm, prompt="The capital of France is",
                                   max_tokens=4).text
        # The same boundary checks as a local model, in the same words.
        for bad in ({"messages": []}, {"messages": "hi"}, {"prompt": 123},
                    {"messages": HI, "max_tokens": 0}, {"messages": HI, "stop": "x"},
                    {"messages": HI, "sampling": SamplingParams(temperature=float("nan"))}):
            with pytest.raises(InvalidInputError) as remote_err:
                remote.generate(**bad)
            with pytest.raises(InvalidInputError) as local_err:
                engine.llm.generate(**bad)
            assert str(remote_err.value) == str(local_err.value), bad
        with pytest.raises(InvalidInputError, match="top-k"):
            remote.generate(messages=HI, sampling=SamplingParams(top_k=5))
    finally:
        remote.close()


def test_embeddings_on_a_remote_inferdesk(engine, server):  # noqa: F811
    remote = load_model(f"{server.url}#{engine.encoder.name}")
    try:
        assert isinstance(remote, RemoteEncoder) and remote.dim == engine.encoder.dim
        texts = ["one small step", "a giant leap", "", "for mankind"]
        np.testing.assert_allclose(remote.embed(texts, batch_size=3),
                                   engine.encoder.embed(texts), atol=1e-6)
    finally:
        remote.close()


def test_connect_errors(engine, server):  # noqa: F811
    with pytest.raises(InvalidInputError, match="serves 2 models"):
        load_model(server.url)
    with pytest.raises(ModelNotFoundError, match="no model 'nope'"):
        load_model(f"{server.url}#nope")
    keyed = ServerThread(engine, api_key="k").start()
    try:
        with pytest.raises(InvalidInputError, match="refused the API key"):
            load_model(f"{keyed.url}#{engine.llm.name}", api_key="wrong")
        ok = load_model(f"{keyed.url}#{engine.llm.name}", api_key="k")
        ok.close()
    finally:
        keyed.stop(close_engine=False)
    with pytest.raises(BackendUnavailableError, match="Cannot reach"):
        load_model(keyed.url.replace("/v1", "") + "#x")  # nobody listens there now


def _abort_connections(srv: ServerThread) -> None:
    """Reset every open connection of the server, as a network failure would (uvicorn's
    own shutdown is graceful: it lets a running stream finish)."""
    for conn in list(srv.server.server_state.connections):
        conn.loop.call_soon_threadsafe(conn.transport.abort)


def test_connection_lost_mid_stream_keeps_the_partial_answer(engine):  # noqa: F811
    srv = ServerThread(engine).start()
    remote = load_model(f"{srv.url}#{engine.llm.name}")
    try:
        got: list[str] = []
        events = remote.generate(messages=HI, max_tokens=200,
                                 sampling=SamplingParams(temperature=0.0))
        done = None
        for ev in events:
            if isinstance(ev, TokenEvent):
                got.append(ev.text)
                if len(got) == 2:  # the connection drops mid-answer
                    _abort_connections(srv)
            else:
                done = ev
        assert done is not None and done.finish_reason == "interrupted"
        assert done.text == "".join(got) and len(got) >= 2
    finally:
        remote.close()
        srv.stop(close_engine=False)
    deadline = time.monotonic() + 120
    while engine.scheduler.load() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.scheduler.load() == (0, 0)  # the server side dropped the sequence


def _broken_server(body_lines: list[str]) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "broken", "object": "model", "created": 0,
                                            "owned_by": "test"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        async def lines():
            for line in body_lines:
                yield line
        return StreamingResponse(lines(), media_type="text/event-stream")

    return app


GOOD = ('data: {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "broken", '
        '"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}\n\n')


@pytest.mark.parametrize("bad", [
    "data: {not json\n\n",
    'data: {"id": "x", "object": "chat.completion.chunk", "choices": "oops"}\n\n',
    'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
    '"delta": {"content": 5}}]}\n\n',
])
def test_malformed_chunks_are_a_clear_error(bad):
    srv = ServerThread(None, app=_broken_server([GOOD, bad, "data: [DONE]\n\n"])).start()
    try:
        remote = load_model(srv.url)  # one model: no fragment needed
        assert remote.name == "broken"
        seen = []
        with pytest.raises(RemoteError, match="127.0.0.1") as info:
            for ev in remote.generate(messages=HI, max_tokens=5,
                                      sampling=SamplingParams(temperature=0.0)):
                seen.append(ev)
        assert "not the OpenAI API" in str(info.value) or "malformed" in str(info.value)
        assert [e.text for e in seen] == ["Hel"]
        remote.close()
    finally:
        srv.stop()


def test_an_endless_stream_is_cut_at_max_tokens():
    """A server that ignores max_tokens and never ends its stream: the remote engine stops
    reading after max_tokens text chunks."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "endless", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        async def forever():
            while not await request.is_disconnected():  # endless, for a client still there
                yield GOOD

        return StreamingResponse(forever(), media_type="text/event-stream")

    srv = ServerThread(None, app=app).start()
    try:
        remote = load_model(srv.url)
        tokens, done = _run(remote.generate(messages=HI, max_tokens=5,
                                            sampling=SamplingParams(temperature=0.0)))
        assert len(tokens) <= 5 and done.text == "Hel" * 5
        assert done.finish_reason == "length" and done.n_generated == 5
        remote.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_remote_embeddings_are_refused(bad):
    app = FastAPI()
    calls = []

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "e", "object": "model", "kind": "encoder"}]}

    @app.post("/v1/embeddings")
    async def embeddings():
        calls.append(1)
        value = "0.5" if len(calls) == 1 else bad  # the dimension probe is fine
        body = ('{"object": "list", "model": "e", "data": [{"object": "embedding", '
                f'"index": 0, "embedding": [0.1, {value}]}}]}}')
        return Response(body, media_type="application/json")

    srv = ServerThread(None, app=app).start()
    try:
        remote = load_model(srv.url)
        assert remote.dim == 2
        with pytest.raises(RemoteError, match="not finite"):
            remote.embed(["x"])
        remote.close()
    finally:
        srv.stop()
