"""Connect to server…: a remote engine (any OpenAI-compatible server) as the chat and/or
embedding model. The worker lists the server's ``/v1/models`` and loads the chosen ones;
failures reach the window's banner like any other worker failure.

The last URL is remembered in the settings. The API key is kept in memory only, unless
"Remember the key" is ticked: then it is stored in the settings file in plain text.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from gui import worker
from gui.jobs import JobRunner, on_result
from gui.settings import Settings
from gui.worker import RemoteTarget

DEFAULT_URL = "http://127.0.0.1:8080/v1"
KIND_TEXT = {"causal": "chat", "encoder": "embedding"}


class ConnectDialog(QDialog):
    def __init__(self, jobs: JobRunner, settings: Settings, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Connect to server")
        self.setModal(False)  # the app keeps working (and reporting errors) behind it
        self.jobs, self.settings = jobs, settings
        self.listed_url = ""  # the server the list below comes from
        self._build()
        on_result(jobs, "connect", self._on_listed)
        jobs.failed.connect(self._on_failed)
        on_result(jobs, "load", self._on_loaded)

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.url_edit = QLineEdit(self.settings.get("remote/url", DEFAULT_URL, str))
        self.url_edit.setPlaceholderText(DEFAULT_URL)
        self.url_edit.setToolTip("An OpenAI-compatible server: vLLM, a llama.cpp server, "
                                 "Ollama (http://host:11434/v1), LM Studio, another Inferdesk")
        self.url_edit.returnPressed.connect(self.list_models)
        self.key_edit = QLineEdit(self.settings.get("remote/api_key", "", str))
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional")
        self.remember_key = QCheckBox("Remember the key (stored in the settings file in "
                                      "plain text)")
        self.remember_key.setChecked(bool(self.key_edit.text()))
        form.addRow("Server URL", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("", self.remember_key)
        layout.addLayout(form)
        self.list_button = QPushButton("List models")
        self.list_button.setObjectName("Primary")
        self.list_button.clicked.connect(self.list_models)
        layout.addWidget(self.list_button)
        self.models = QListWidget()
        self.models.itemSelectionChanged.connect(self._update_buttons)
        layout.addWidget(self.models, 1)
        self.status = QLabel("")
        self.status.setObjectName("Hint")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        row = QHBoxLayout()
        self.chat_button = QPushButton("Use as chat model")
        self.chat_button.clicked.connect(lambda: self.use("causal"))
        self.embed_button = QPushButton("Use as embedding model")
        self.embed_button.clicked.connect(lambda: self.use("encoder"))
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        for b in (self.chat_button, self.embed_button):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(close)
        layout.addLayout(row)
        self.resize(560, 420)
        self._update_buttons()

    def url(self) -> str:
        return self.url_edit.text().strip()

    def api_key(self) -> str:
        return self.key_edit.text().strip()

    def list_models(self) -> None:
        """Ask the server for its models (answered by remote_listed or failed)."""
        url = self.url()
        if not url.startswith(("http://", "https://")):
            self.status.setText("The URL starts with http:// or https://, e.g. "
                                f"{DEFAULT_URL}.")
            return
        self.settings.set("remote/url", url)
        if self.remember_key.isChecked():
            self.settings.set("remote/api_key", self.api_key())
        else:
            self.settings.remove("remote/api_key")
        self.models.clear()
        self.listed_url = ""
        self.status.setText(f"Asking {url} for its models…")
        self.list_button.setEnabled(False)
        self.jobs.submit("connect", worker.list_remote, url, self.api_key())
        self._update_buttons()

    def use(self, kind: str) -> None:
        """Load the selected model as the chat (``causal``) or embedding (``encoder``) model."""
        item = self.models.currentItem()
        if item is None or not self.listed_url:
            return
        model_id = item.data(Qt.ItemDataRole.UserRole)
        self.status.setText(f"Connecting to {model_id} as the {KIND_TEXT[kind]} model…")
        self.jobs.submit("load", worker.load,
                         RemoteTarget(self.listed_url, model_id, kind, self.api_key() or None))

    def _on_listed(self, listed: tuple[str, list]) -> None:
        url, models = listed
        if url != self.url():
            return  # an answer for a URL since edited
        self.list_button.setEnabled(True)
        self.listed_url = url
        self.models.clear()
        for m in models:
            item = QListWidgetItem(f"{m.id}  ({KIND_TEXT[m.kind]})")
            item.setData(Qt.ItemDataRole.UserRole, m.id)
            self.models.addItem(item)
        if models:
            self.models.setCurrentRow(0)
        self.status.setText(f"{url} serves {len(models)} model{'s' if len(models) != 1 else ''}"
                            ": pick one, then use it as the chat or embedding model."
                            if models else f"{url} serves no models.")
        self._update_buttons()

    def _on_failed(self, kind: str, message: str) -> None:
        if kind in ("connect", "load"):
            self.list_button.setEnabled(True)
            self.status.setText(message)

    def _on_loaded(self, info: object) -> None:
        if getattr(info, "remote", False):
            self.status.setText(f"Using {info.name} as the {KIND_TEXT[info.kind]} model.")

    def _update_buttons(self) -> None:
        # Both stay possible: for servers other than Inferdesk the kind is a guess by name.
        picked = self.models.currentItem() is not None
        self.chat_button.setEnabled(picked)
        self.embed_button.setEnabled(picked)
