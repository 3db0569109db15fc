"""The Server tab: serve the app's loaded models (the same objects, not a copy), see a
request in its log, stop; a chat reply and a server request take turns on the model."""

from __future__ import annotations

import threading

import httpx2 as httpx

from gui.jobs import JobRunner
from gui.server_pane import ServerPane
from tests.gui.conftest import wait_until

GEN_TIMEOUT_MS = 120_000


def _start(pane: ServerPane, qtbot) -> str:  # noqa: ANN001
    pane.port.setValue(0)  # a free port
    with qtbot.waitSignal(pane.bridge.started, timeout=60_000) as started:
        pane.toggle()
    return started.args[0]


def _stop(pane: ServerPane, qtbot) -> None:  # noqa: ANN001
    with qtbot.waitSignal(pane.bridge.stopped, timeout=60_000):
        pane.toggle()
    assert pane.url.text() == "Stopped." and pane.server is None


def test_serves_the_loaded_models_logs_and_stops(loaded_window, qtbot) -> None:
    w = loaded_window
    pane = w.server
    url = _start(pane, qtbot)
    assert url in pane.url.text() and pane.button.text() == "Stop server"
    engine = pane.server.engine
    assert engine.llm is w.jobs.models.get("causal")  # the app's own objects
    assert engine.encoder is w.jobs.models.get("encoder")
    ids = [m["id"] for m in httpx.get(f"{url}/models", timeout=60).json()["data"]]
    assert sorted(ids) == sorted([w.picker.loaded["causal"].name,
                                  w.picker.loaded["encoder"].name])
    assert httpx.post(f"{url}/embeddings", json={"model": "nope", "input": "x"},
                      timeout=60).status_code == 404
    qtbot.waitUntil(lambda: "GET /v1/models" in pane.log.toPlainText(), timeout=10_000)
    qtbot.waitUntil(lambda: "404  POST /v1/embeddings" in pane.log.toPlainText(),
                    timeout=10_000)
    _stop(pane, qtbot)
    assert w.jobs.models.get("causal") is engine.llm  # stopping keeps the app's models


def test_a_chat_reply_and_a_server_request_take_turns_on_the_model(loaded_window, qtbot,
                                                                  monkeypatch) -> None:
    """While a chat reply is in its forward pass, a server request on the same model waits
    at the model's lock (no step of it runs), then both finish."""
    w = loaded_window
    model = w.jobs.models.get("causal")
    lock = w.jobs.models.locks["causal"]
    in_chat, release = threading.Event(), threading.Event()
    real_generate = model.generate

    def held_generate(**kw):  # noqa: ANN003, ANN202
        in_chat.set()
        release.wait(60)  # the chat's turn stays open until the test has looked
        yield from real_generate(**kw)

    monkeypatch.setattr(model, "generate", held_generate)
    url = _start(w.server, qtbot)
    scheduler = w.server.server.engine.scheduler
    answer: dict = {}

    def ask() -> None:
        r = httpx.post(f"{url}/chat/completions", timeout=120, json={
            "model": model.name, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}]})
        answer["status"] = r.status_code

    try:
        w.chat.new_conversation()
        w.chat.sampling.set_values({"max_tokens": 2, "temperature": 0.0, "seed": 1})
        assert w.chat.send("Say hi.")
        wait_until(in_chat.is_set, GEN_TIMEOUT_MS, "the chat's turn")
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        wait_until(lambda: lock.waiting >= 1, GEN_TIMEOUT_MS, "the server at the lock")
        assert scheduler.steps == 0  # nothing of the request ran beside the chat
    finally:
        release.set()
    wait_until(lambda: not w.chat.generating, GEN_TIMEOUT_MS, "the chat reply")
    asker.join(120)
    assert answer.get("status") == 200 and scheduler.steps >= 1
    assert w.chat.views()[-1].role == "assistant"
    _stop(w.server, qtbot)


def test_exposed_without_key_is_refused(qtbot):
    pane = ServerPane(JobRunner("test-serve"))
    qtbot.addWidget(pane)
    pane.host.setText("0.0.0.0")
    with qtbot.waitSignal(pane.bridge.failed, timeout=60_000) as failed:
        pane.toggle()
    assert "api-key" in failed.args[0] and pane.server is None
    assert pane.button.isEnabled() and pane.button.text() == "Start server"
    pane.host.setText("127.0.0.1")  # no model loaded: says where to load one
    with qtbot.waitSignal(pane.bridge.failed, timeout=60_000) as failed:
        pane.toggle()
    assert "Models tab" in failed.args[0] and pane.server is None
    pane.jobs.shutdown()


def test_options_reach_the_server_and_are_remembered(qtbot, tmp_path, monkeypatch):
    """Parallel requests and prompt cache size reach the engine, with the registry's
    locks; the form comes back the same in a new pane on the same settings, without the
    API key."""
    from inference.server import app
    from inference.server.run import InvalidInputError
    from tests.gui.conftest import make_settings

    seen = {}

    def refuse(*args, **kwargs):  # stop before serving: this test is about what is passed
        seen.update(args=args, kwargs=kwargs)
        raise InvalidInputError("Not serving in this test.")

    monkeypatch.setattr(app, "Engine", refuse)
    settings = make_settings(tmp_path / "settings.ini")
    jobs = JobRunner("test-serve")
    fake = type("Model", (), {"kind": "causal", "backend": type("B", (), {"name": "cpu"}),
                              "close": lambda self: None})()
    jobs.models.put(fake)
    pane = ServerPane(jobs, settings)
    qtbot.addWidget(pane)
    assert pane.prompt_cache.value() == 256
    pane.port.setValue(8123)
    pane.parallel.setValue(6)
    pane.api_key.setText("secret")
    pane.prompt_cache.setValue(0)
    with qtbot.waitSignal(pane.bridge.failed, timeout=60_000) as failed:
        pane.toggle()
    assert failed.args[0] == "Not serving in this test."
    assert seen["args"] == (fake, None)
    assert seen["kwargs"] == {"parallel": 6, "prompt_cache_mb": 0, "locks": jobs.models.locks}

    again = ServerPane(jobs, settings)
    qtbot.addWidget(again)
    assert (again.port.value(), again.parallel.value(), again.prompt_cache.value()
            ) == (8123, 6, 0)
    assert again.api_key.text() == ""
    settings.q.sync()
    assert "secret" not in (tmp_path / "settings.ini").read_text()
    jobs.shutdown()
