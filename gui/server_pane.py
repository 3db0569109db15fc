"""The Server tab: serve models over the OpenAI API from the app (start/stop, the URL, a
live request log), with the options of `inferdesk serve` a user tunes (parallel requests,
KV cache type, prompt cache size), remembered from one start to the next (the API key is
not stored). Loading and serving run off the GUI thread; a QObject carries their results
back as signals, so no widget is touched from another thread."""

from __future__ import annotations

import threading
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

from gui.model_picker import kv_choice_box
from gui.settings import Settings

LOG_LINES = 500  # the log keeps the last requests only
PROMPT_CACHE_MAX_MB = 1 << 16  # the box's bound; the server takes any size


class ServerBridge(QObject):
    """Signals from the loader and uvicorn threads to the pane."""

    started = Signal(str)  # url
    failed = Signal(str)  # one sentence
    stopped = Signal()
    request = Signal(dict)  # method, path, status, seconds


class ServerPane(QWidget):
    def __init__(self, settings: Settings | None = None, parent: QWidget | None = None):
        from inference.server.prefix_pool import PROMPT_CACHE_MB

        super().__init__(parent)
        self.settings = settings  # None: nothing remembered (tests, embedding the pane)
        self.bridge = ServerBridge(self)
        self.server: Any = None  # inference.server.run.ServerThread while serving
        self._busy = False

        def saved(key: str, default: Any, type_: type) -> Any:
            return default if settings is None else settings.get(f"server/{key}", default,
                                                                 type_)

        self.model = QLineEdit(saved("model", "smollm2", str),
                               placeholderText="chat model (store name or path)")
        self.embed_model = QLineEdit(saved("embed_model", "minilm", str),
                                     placeholderText="embedding model (optional)")
        self.host = QLineEdit(saved("host", "127.0.0.1", str))
        def number(key: str, default: int, lo: int, hi: int) -> int:
            """A saved count within its box's range (a hand-edited file cannot overflow it)."""
            return default if settings is None else int(settings.number(f"server/{key}",
                                                                        default, lo, hi))

        self.port = QSpinBox(minimum=0, maximum=65535, value=number("port", 8080, 0, 65535))
        self.api_key = QLineEdit(placeholderText="required off loopback",
                                 echoMode=QLineEdit.EchoMode.Password)
        self.parallel = QSpinBox(minimum=1, maximum=8, value=number("parallel", 4, 1, 8))
        self.kv_dtype = kv_choice_box(saved("kv_dtype", "", str))
        self.prompt_cache = QSpinBox(minimum=0, maximum=PROMPT_CACHE_MAX_MB, suffix=" MB",
                                     value=number("prompt_cache_mb", PROMPT_CACHE_MB, 0,
                                                        PROMPT_CACHE_MAX_MB))
        self.prompt_cache.setToolTip("Memory for finished requests' prompt starts (a system "
                                     "prompt or document sent again is not prefilled again); "
                                     "0 keeps none")
        form = QFormLayout()
        for label, w in (("Chat model", self.model), ("Embedding model", self.embed_model),
                         ("Host", self.host), ("Port", self.port), ("API key", self.api_key),
                         ("Parallel requests", self.parallel), ("KV cache", self.kv_dtype),
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
        lay.addLayout(form)
        lay.addLayout(row)
        lay.addWidget(QLabel("Requests"))
        lay.addWidget(self.log, 1)

        self.bridge.started.connect(self._on_started)
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
            self.url.setText("Loading models…")
            self._remember()
            args = (self.model.text().strip() or None, self.embed_model.text().strip() or None,
                    self.host.text().strip(), self.port.value(),
                    self.api_key.text() or None, self.parallel.value(),
                    self.kv_dtype.currentData() or None, self.prompt_cache.value())
            threading.Thread(target=self._start, args=args, name="inferdesk-serve-start",
                             daemon=True).start()
        else:
            self.url.setText("Stopping…")
            server, self.server = self.server, None
            threading.Thread(target=self._stop, args=(server,), name="inferdesk-serve-stop",
                             daemon=True).start()

    def _remember(self) -> None:
        if self.settings is None:
            return
        for key, value in (("model", self.model.text()), ("embed_model", self.embed_model.text()),
                           ("host", self.host.text()), ("port", self.port.value()),
                           ("parallel", self.parallel.value()),
                           ("kv_dtype", self.kv_dtype.currentData()),
                           ("prompt_cache_mb", self.prompt_cache.value())):
            self.settings.set(f"server/{key}", value)

    def shutdown(self) -> None:
        """Stop serving now (the window is closing)."""
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()

    # --- worker threads (no widgets here) --------------------------------------------------
    def _start(self, model: str | None, embed: str | None, host: str, port: int,
               key: str | None, parallel: int, kv_dtype: str | None,
               prompt_cache_mb: int) -> None:
        from inference.errors import InferdeskError
        from inference.server.run import ServerThread, check_exposure, load_engine

        try:
            check_exposure(host, key)
            engine = load_engine(model, embed, parallel=parallel, kv_dtype=kv_dtype,
                                 prompt_cache_mb=prompt_cache_mb)
            try:
                server = ServerThread(engine, host, port, key, log=self.bridge.request.emit)
                server.start()
            except BaseException:
                engine.close()
                raise
        except InferdeskError as e:
            self.bridge.failed.emit(str(e))
            return
        except Exception as e:  # noqa: BLE001 - shown in the pane, the app stays up
            self.bridge.failed.emit(f"The server could not start: {e}")
            return
        self.server = server
        self.bridge.started.emit(server.url)

    def _stop(self, server: Any) -> None:
        server.stop()
        self.bridge.stopped.emit()

    # --- slots (GUI thread) ----------------------------------------------------------------
    def _on_started(self, url: str) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.button.setText("Stop server")
        self.url.setText(f"Serving at {url}")

    def _on_failed(self, message: str) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.url.setText(message)

    def _on_stopped(self) -> None:
        self._busy = False
        self.button.setEnabled(True)
        self.button.setText("Start server")
        self.url.setText("Stopped.")

    def _on_request(self, entry: dict) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.log.appendPlainText(f"{stamp}  {entry['status']}  {entry['method']} "
                                 f"{entry['path']}  {entry['seconds'] * 1e3:.0f} ms")
