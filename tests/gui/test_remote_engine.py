"""The app on a remote engine: a real `inferdesk serve` (uvicorn on 127.0.0.1, a free port,
the bundled SmolLM2 and MiniLM on `cpu`) driven through the real widgets — Connect to
server…, chat, embeddings, the performance pane, a connection lost mid-reply, and the
error paths (nobody there, wrong key, not an OpenAI server, malformed chunks)."""

from __future__ import annotations

import socket
import time

import numpy as np
import openai
from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from inference.server.run import ServerThread
from tests.gui.conftest import LOAD_TIMEOUT_MS, on_tokens, wait_until
from tests.server_support import engine, server  # noqa: F401 - session fixtures
from tests.test_remote import GOOD, _abort_connections, _broken_server

GEN_TIMEOUT_MS = 120_000
SENTENCES = ["one small step", "a giant leap", "for mankind", "the eagle has landed"]


def _connect(w, url: str, key: str = "") -> object:
    """Connect to server…, type the URL (and key), List models; the dialog."""
    d = w.picker.show_connect()
    d.url_edit.setText(url)
    d.key_edit.setText(key)
    d.list_button.click()
    return d


def _listed(d) -> list[str]:
    return [d.models.item(i).text() for i in range(d.models.count())]


def _use(w, d, model_id: str, kind: str) -> None:
    row = next(i for i in range(d.models.count()) if d.models.item(i).text().startswith(
        model_id + " "))
    d.models.setCurrentRow(row)
    (d.chat_button if kind == "causal" else d.embed_button).click()
    wait_until(lambda: kind in w.picker.loaded and w.picker.loaded[kind].name == model_id
               or w.banner.isVisible(), LOAD_TIMEOUT_MS, f"{model_id} to connect")
    assert not w.banner.isVisible(), w.banner.text()
    assert w.picker.loaded[kind].remote


def _reply(w, text: str, max_tokens: int) -> object:
    """Send ``text`` greedily; the reply's view once generation has ended."""
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": max_tokens, "temperature": 0.0, "seed": -1})
    assert w.chat.send(text)
    # The chat pane ends the reply on the job's result; the performance pane takes the same
    # summary when the job has finished, after one more memory sample on the job's thread.
    wait_until(lambda: not w.chat.generating
               and not any(j.kind == "generate" for j in w.jobs.active()),
               GEN_TIMEOUT_MS, "the reply")
    return w.chat.views()[-1]


def test_chat_embeddings_and_perf_on_a_remote_inferdesk(make_window, engine, server):  # noqa: F811
    w = make_window()
    d = _connect(w, server.url)
    wait_until(lambda: d.models.count() == 2 or w.banner.isVisible(), 60_000, "the list")
    assert sorted(_listed(d)) == sorted([f"{engine.llm.name}  (chat)",
                                         f"{engine.encoder.name}  (embedding)"])
    assert w.settings.get("remote/url") == server.url
    assert w.settings.get("remote/api_key") is None  # the key is not remembered unasked
    _use(w, d, engine.llm.name, "causal")
    _use(w, d, engine.encoder.name, "encoder")
    assert server.url in w.picker.loaded_labels["causal"].text()
    # The OpenAI API has no top-k, min-p or repetition penalty: greyed, sent as off.
    boxes = w.chat.sampling.boxes
    assert not boxes["top_k"].isEnabled() and boxes["temperature"].isEnabled()

    # Chat: the streamed reply is what the same request gets from the server directly.
    decode_seen = []

    def sample_on_token(ev: object) -> None:  # a pane sample while tokens stream
        if ev.index > 0:
            w.perf.sample()
            decode_seen.append(w.perf.decode)

    before = w.perf.points()  # what was sampled before the remote engine came
    conn = on_tokens(w, sample_on_token)
    prompt = "Count from one to twenty in words."
    view = _reply(w, prompt, max_tokens=12)
    w.jobs.progress.disconnect(conn)
    system = w.chat.system_prompt.toPlainText()
    with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0,
                       timeout=300) as client:
        direct = client.chat.completions.create(
            model=engine.llm.name, max_tokens=12, temperature=0.0, top_p=0.95,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": prompt}])
    assert view.text == direct.choices[0].message.content and view.text.strip()
    stored = w.store.messages(w.chat.conv_id)
    assert stored[-1].content == view.text
    assert stored[-1].stats["n_prompt"] == direct.usage.prompt_tokens  # the server's count
    # The context indicator: the server's count, and the context said to be unknown.
    assert w.chat.context_label.text().endswith("context unknown")
    assert w.chat.fit_note.isVisible() and "counts tokens itself" in w.chat.fit_note.text()
    # The reply stopped at its limit, but the OpenAI API cannot extend it: no Continue.
    assert view.stats["finish_reason"] == "length" and not w.chat.continue_button.isVisible()

    # Performance: tok/s and TTFT from the stream; no empty memory/CPU/prefill series.
    p = w.perf
    pts = p.points()
    assert pts["decode"] >= 1 and all(x > 0 for x in decode_seen) and pts["ttft"] == 1
    assert all(pts[k] == before[k] for k in ("host_rss", "cpu", "device_used"))
    assert p.mem_plot.scene() is None and p.cpu_plot.scene() is None
    assert p.prefill_plot.scene() is None and not p.ops_box.isVisibleTo(p)
    line = p.remote_label.text()
    assert p.remote_label.isVisibleTo(p) and server.url in line
    assert "memory" in line and "CPU" in line and "not reported" in line

    # Embeddings pane, unchanged, on the remote encoder (float32 through JSON: exact).
    w.embed.input.setPlainText("\n".join(SENTENCES))
    assert w.embed.embed()
    wait_until(lambda: w.embed.result is not None or w.banner.isVisible(), GEN_TIMEOUT_MS,
               "the embeddings")
    assert not w.banner.isVisible(), w.banner.text()
    np.testing.assert_allclose(w.embed.result.vectors, engine.encoder.embed(SENTENCES),
                               atol=1e-6)

    # A local chat model brings the local graphs back.
    w.picker.load(next(s for s in w.picker.specs if s.kind == "causal"
                       and s.source == "bundled"))
    wait_until(lambda: "causal" in w.picker.loaded and not w.picker.loaded["causal"].remote,
               LOAD_TIMEOUT_MS, "a local model")
    assert p.mem_plot.scene() is not None and p.prefill_plot.scene() is not None
    assert p.ops_box.isVisibleTo(p) and "show this process" in p.remote_label.text()
    assert boxes["top_k"].isEnabled()


def test_connection_lost_mid_reply_keeps_the_partial_answer(make_window, engine):  # noqa: F811
    srv = ServerThread(engine).start()
    try:
        w = make_window()
        d = _connect(w, srv.url)
        wait_until(lambda: d.models.count() == 2, 60_000, "the list")
        _use(w, d, engine.llm.name, "causal")
        lost = []

        def drop(ev: object) -> None:  # the network fails after the second token
            if ev.index >= 1 and not lost:
                lost.append(ev.index)
                _abort_connections(srv)

        conn = on_tokens(w, drop)
        view = _reply(w, "Count from one to one hundred in words.", max_tokens=200)
        w.jobs.progress.disconnect(conn)
    finally:
        srv.stop(close_engine=False)
    assert lost
    assert view.text.strip() and view.stats["finish_reason"] == "interrupted"
    assert w.store.messages(w.chat.conv_id)[-1].content == view.text
    assert w.chat.banner.isVisible() and "partial answer is kept" in w.chat.banner.text()
    # The app stays up: the next message says the server is gone, in one sentence.
    assert w.chat.send("Are you there?")
    wait_until(lambda: not w.chat.generating, GEN_TIMEOUT_MS, "the failure")
    assert w.banner.isVisible() and "Cannot reach" in w.banner.text()
    deadline = time.monotonic() + 120
    while engine.scheduler.load() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)  # the shared engine is idle again for the next test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _html_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return HTMLResponse("<html><body>Welcome to nginx!</body></html>")

    return app


def _banner_after_listing(w, url: str, key: str = "") -> str:
    w.banner.hide()
    d = _connect(w, url, key)
    wait_until(w.banner.isVisible, 60_000, f"an error for {url}")
    assert d.models.count() == 0 and d.status.text() == w.banner.text()
    return w.banner.text()


def test_connection_errors_are_one_sentence(make_window, engine):  # noqa: F811
    w = make_window()
    nobody = f"http://127.0.0.1:{_free_port()}/v1"
    assert _banner_after_listing(w, nobody).startswith(f"Cannot reach {nobody}")
    keyed = ServerThread(engine, api_key="right").start()
    html = ServerThread(None, app=_html_app()).start()
    try:
        msg = _banner_after_listing(w, keyed.url, "wrong")
        assert msg.startswith(f"{keyed.url} refused the API key")
        msg = _banner_after_listing(w, html.url)
        assert "not OpenAI's list of models" in msg
        msg = _banner_after_listing(w, html.url.replace("/v1", "/api/v1"))
        assert "not an OpenAI-compatible server" in msg
        # The right key lists the models, and remembering it is the user's choice.
        d = w.picker.show_connect()
        d.remember_key.setChecked(True)
        _connect(w, keyed.url, "right")
        wait_until(lambda: d.models.count() == 2, 60_000, "the list")
        assert w.settings.get("remote/api_key") == "right"
    finally:
        keyed.stop(close_engine=False)
        html.stop()
    assert w.isVisible() and w.jobs.alive()


def test_malformed_chunks_are_a_clear_error(make_window):
    bad = ('data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, '
           '"delta": {"content": 5}}]}\n\n')
    srv = ServerThread(None, app=_broken_server([GOOD, bad, "data: [DONE]\n\n"])).start()
    try:
        w = make_window()
        d = _connect(w, srv.url)
        wait_until(lambda: d.models.count() == 1, 60_000, "the list")
        _use(w, d, "broken", "causal")
        view = _reply(w, "Hello?", max_tokens=5)
    finally:
        srv.stop()
    assert w.banner.isVisible() and "malformed stream chunk" in w.banner.text()
    assert srv.url in w.banner.text()
    assert view.text == "Hel" and w.store.messages(w.chat.conv_id)[-1].content == "Hel"
    assert w.jobs.alive()
