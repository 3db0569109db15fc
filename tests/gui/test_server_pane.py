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
