"""The Server tab: start a real server from the pane, see a request in its log, stop it."""

from __future__ import annotations

import httpx2 as httpx

from gui.server_pane import ServerPane


def test_start_request_log_stop(qtbot):
    pane = ServerPane()
    qtbot.addWidget(pane)
    pane.model.setText("")  # the encoder alone loads fastest
    pane.embed_model.setText("minilm")
    pane.port.setValue(0)  # a free port
    with qtbot.waitSignal(pane.bridge.started, timeout=300_000) as started:
        pane.toggle()
    url = started.args[0]
    assert url in pane.url.text() and pane.button.text() == "Stop server"
    ids = [m["id"] for m in httpx.get(f"{url}/models", timeout=60).json()["data"]]
    assert ids == ["all-MiniLM-L6-v2"]
    assert httpx.post(f"{url}/embeddings", json={"model": "nope", "input": "x"},
                      timeout=60).status_code == 404
    qtbot.waitUntil(lambda: "GET /v1/models" in pane.log.toPlainText(), timeout=10_000)
    qtbot.waitUntil(lambda: "404  POST /v1/embeddings" in pane.log.toPlainText(),
                    timeout=10_000)
    with qtbot.waitSignal(pane.bridge.stopped, timeout=60_000):
        pane.toggle()
    assert pane.url.text() == "Stopped." and pane.server is None


def test_exposed_without_key_is_refused(qtbot):
    pane = ServerPane()
    qtbot.addWidget(pane)
    pane.host.setText("0.0.0.0")
    with qtbot.waitSignal(pane.bridge.failed, timeout=60_000) as failed:
        pane.toggle()
    assert "api-key" in failed.args[0] and pane.server is None
    assert pane.button.isEnabled() and pane.button.text() == "Start server"


def test_options_reach_the_server_and_are_remembered(qtbot, tmp_path, monkeypatch):
    """KV cache type and prompt cache size go to load_engine; the form comes back the same
    in a new pane on the same settings, without the API key."""
    from gui.model_picker import KV_CHOICES
    from inference.server import run
    from tests.gui.conftest import make_settings

    seen = {}

    def refuse(*args, **kwargs):  # stop before loading: this test is about what is passed
        seen.update(args=args, kwargs=kwargs)
        raise run.InvalidInputError("Not loading in this test.")

    monkeypatch.setattr(run, "load_engine", refuse)
    settings = make_settings(tmp_path / "settings.ini")
    pane = ServerPane(settings)
    qtbot.addWidget(pane)
    assert pane.kv_dtype.count() == len(KV_CHOICES) and pane.prompt_cache.value() == 256
    pane.model.setText("smollm2")
    pane.embed_model.setText("")
    pane.port.setValue(8123)
    pane.parallel.setValue(6)
    pane.api_key.setText("secret")
    pane.kv_dtype.setCurrentIndex(pane.kv_dtype.findData("float16"))
    pane.prompt_cache.setValue(0)
    with qtbot.waitSignal(pane.bridge.failed, timeout=60_000) as failed:
        pane.toggle()
    assert failed.args[0] == "Not loading in this test."
    assert seen["args"] == ("smollm2", None)
    assert seen["kwargs"] == {"parallel": 6, "kv_dtype": "float16", "prompt_cache_mb": 0}

    again = ServerPane(settings)
    qtbot.addWidget(again)
    assert (again.model.text(), again.embed_model.text(), again.port.value(),
            again.parallel.value(), again.kv_dtype.currentData(),
            again.prompt_cache.value()) == ("smollm2", "", 8123, 6, "float16", 0)
    assert again.api_key.text() == ""
    settings.q.sync()
    assert "secret" not in (tmp_path / "settings.ini").read_text()
