"""The Server tab: serve the app's loaded models over the OpenAI API (start/stop, the URL,
a live request log), with the options of `inferdesk serve` a user tunes (parallel requests,
prompt cache size), remembered from one start to the next (the API key is not stored).

The server uses the very models the Models tab loaded (the registry's objects, never a
second copy); its batching threads hold each model's forward lock per step, so a chat reply
and a server request take turns on the model. Starting and stopping are jobs on the app's
runner; the server's own threads (uvicorn, the batcher) report through a QObject's signals,
so no widget is touched from another thread. Loading another model or unloading one the
server serves stops the server first.
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gui.jobs import JobContext, JobRunner
from gui.settings import Settings

LOG_LINES = 500  # the log keeps the last requests only
PROMPT_CACHE_MAX_MB = 1 << 16  # the box's bound; the server takes any size


class ServerBridge(QObject):
    """Signals from the loader and uvicorn threads to the pane."""

    started = Signal(str)  # url
    failed = Signal(str)  # one sentence
    stopped = Signal(str)  # why ("": asked to)
    request = Signal(dict)  # method, path, status, seconds


class Serving:
    """The running server, if any (set and cleared on the runner's thread, where models
    are loaded and unloaded, so an unload never misses a server just started)."""
    server: Any = None


def start_server(ctx: JobContext, slot: Serving, host: str, port: int, key: str | None,
                 parallel: int, prompt_cache_mb: int, log: Any) -> Any:
    """Serve the registry's models (on the runner's thread); the running ServerThread."""
    from inference.errors import InvalidInputError
    from inference.server import app
    from inference.server.run import ServerThread, check_exposure

    check_exposure(host, key)
    llm, enc = ctx.models.get("causal"), ctx.models.get("encoder")
    local = [m for m in (llm, enc) if m is not None and m.backend.name != "remote"]
    if not local:
        raise InvalidInputError("Load a chat or embedding model first (Models tab); the "
                                "server serves the models loaded there.")
    llm = llm if llm in local else None
    enc = enc if enc in local else None
    engine = app.Engine(llm, enc, parallel=parallel, prompt_cache_mb=prompt_cache_mb,
                        locks=ctx.models.locks)
    try:
        server = ServerThread(engine, host, port, key, log=log)
        server.start()
    except BaseException:
        engine.close()
        raise
    slot.server = server
    return server


def stop_server(ctx: JobContext, slot: Serving) -> str:
    server, slot.server = slot.server, None
    if server is not None:
        server.stop()  # closes the batching threads; the models stay the app's
    return ""


class ServerPane(QWidget):
    def __init__(self, jobs: JobRunner, settings: Settings | None = None,
                 parent: QWidget | None = None):
        from inference.server.prefix_pool import PROMPT_CACHE_MB

        super().__init__(parent)
        self.jobs = jobs
        self.settings = settings  # None: nothing remembered (tests, embedding the pane)
        self.bridge = ServerBridge(self)
        self.slot = Serving()
        self._busy = False
        jobs.models.on_release(self._model_released)

        def saved(key: str, default: Any, type_: type) -> Any:
            return default if settings is None else settings.get(f"server/{key}", default,
                                                                 type_)

        def number(key: str, default: int, lo: int, hi: int) -> int:
            """A saved count within its box's range (a hand-edited file cannot overflow it)."""
            return default if settings is None else int(settings.number(f"server/{key}",
                                                                        default, lo, hi))

        self.serves = QLabel("Serves the models loaded in the Models tab.")
        self.serves.setWordWrap(True)
        self.host = QLineEdit(saved("host", "127.0.0.1", str))
        self.port = QSpinBox(minimum=0, maximum=65535, value=number("port", 8080, 0, 65535))
        self.api_key = QLineEdit(placeholderText="required off loopback",
                                 echoMode=QLineEdit.EchoMode.Password)
        self.parallel = QSpinBox(minimum=1, maximum=8, value=number("parallel", 4, 1, 8))
        self.prompt_cache = QSpinBox(minimum=0, maximum=PROMPT_CACHE_MAX_MB, suffix=" MB",
                                     value=number("prompt_cache_mb", PROMPT_CACHE_MB, 0,
                                                  PROMPT_CACHE_MAX_MB))
        self.prompt_cache.setToolTip("Memory for finished requests' prompt starts (a system "
                                     "prompt or document sent again is not prefilled again); "
                                     "0 keeps none")
        form = QFormLayout()
        for label, w in (("Host", self.host), ("Port", self.port), ("API key", self.api_key),
                         ("Parallel requests", self.parallel),
                         ("Prompt cache", self.prompt_cache)):
            form.addRow(label, w)
        self.button = QPushButton("Start server")
        self.button.clicked.connect(self.toggle)
        self.url = QLabel("Stopped.")
        self.url.setTextInteractionFlags(self.url.textInteractionFlags().TextSelectableByMouse)
        row = QHBoxLayout()
        row.addWidget(self.button)
        row.addWidget(self.url, 1)
        self.log = QPlainTextEdit(readOnly=True)
        self.log.setMaximumBlockCount(LOG_LINES)
        lay = QVBoxLayout(self)
        lay.addWidget(self.serves)
        lay.addLayout(form)
        lay.addLayout(row)
        lay.addWidget(QLabel("Requests"))
        lay.addWidget(self.log, 1)

        self.bridge.failed.connect(self._on_failed)
        self.bridge.stopped.connect(self._on_stopped)
        self.bridge.request.connect(self._on_request)

    # --- actions -------------------------------------------------------------------------
    def toggle(self) -> None:
        if self._busy:
            return
        self._busy = True
        self.button.setEnabled(False)
        if self.server is None:
            self.url.setText("Starting…")
            self._remember()
            job = self.jobs.submit("serve", start_server, self.slot, self.host.text().strip(),
                                   self.port.value(), self.api_key.text() or None,
                                   self.parallel.value(), self.prompt_cache.value(),
                                   self.bridge.request.emit)
            job.result.connect(self._on_started)
            job.error.connect(self.bridge.failed.emit)
        else:
            self.url.setText("Stopping…")
            self.jobs.submit("serve", stop_server, self.slot).finished.connect(
                lambda: self.bridge.stopped.emit(""))

    def _remember(self) -> None:
        if self.settings is None:
            return
        for key, value in (("host", self.host.text()), ("port", self.port.value()),
                           ("parallel", self.parallel.value()),
                           ("prompt_cache_mb", self.prompt_cache.value())):
            self.settings.set(f"server/{key}", value)

    @property
    def server(self) -> Any:
        """The running ServerThread, or None."""
        return self.slot.server

    def shutdown(self) -> None:
        """Stop serving now (the window is closing)."""
        server, self.slot.server = self.slot.server, None
        if server is not None:
            server.stop()

    def _model_released(self, kind: str) -> None:
        """On the runner's thread, before a model closes: stop a server that serves it."""
        server = self.slot.server
        if server is None or server.engine is None:
            return
        if kind == "causal" and server.engine.llm is None \
                or kind == "encoder" and server.engine.encoder is None:
            return
        self.slot.server = None
        server.stop()
        self.bridge.stopped.emit("Stopped: the model it served was unloaded or replaced.")

    # --- slots (GUI thread) ----------------------------------------------------------------
    def _on_started(self, server: Any) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.button.setText("Stop server")
        names = ", ".join(m.name for m in server.engine.models())
        self.url.setText(f"Serving {names} at {server.url}")
        self.bridge.started.emit(server.url)

    def _on_failed(self, message: str) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.url.setText(message)

    def _on_stopped(self, why: str) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.button.setText("Start server")
        self.url.setText(why or "Stopped.")

    def _on_request(self, entry: dict) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.log.appendPlainText(f"{stamp}  {entry['status']}  {entry['method']} "
                                 f"{entry['path']}  {entry['seconds'] * 1e3:.0f} ms")
