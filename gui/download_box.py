"""Download a model from the Hugging Face Hub by repo id, with progress and Cancel."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from gui.format import human_bytes
from gui.theme import icon
from gui.worker import WorkerHandle


class DownloadBox(QGroupBox):
    downloaded = Signal(str)  # local path

    def __init__(self, handle: WorkerHandle, parent: QWidget | None = None):
        super().__init__("Download from the Hugging Face Hub", parent)
        self.handle = handle
        self.active = False
        self.repo = QLineEdit()
        self.repo.setPlaceholderText("repo id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
        self.filename = QLineEdit()
        self.filename.setPlaceholderText("file (optional), e.g. smollm2-135m-instruct-q8_0.gguf")
        self.start_button = QPushButton(icon("download"), "Download")
        self.start_button.clicked.connect(self.start)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel("")
        self.status.setObjectName("Hint")
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.repo, 3)
        row.addWidget(self.filename, 2)
        row.addWidget(self.start_button)
        row.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        handle.download_progress.connect(self._on_progress)
        handle.downloaded.connect(self._on_done)
        handle.failed.connect(self._on_failed)
        handle.cancelled.connect(self._on_cancelled)
        self.repo.returnPressed.connect(self.start)
        self._set_active(False)

    def start(self) -> None:
        repo = self.repo.text().strip()
        if not repo or self.active:
            return
        self._set_active(True)
        self.progress.setRange(0, 0)  # busy until the first byte count arrives
        self.status.setText(f"Downloading {repo}…")
        self.handle.download(repo, self.filename.text().strip())

    def cancel(self) -> None:
        if self.active:
            self.handle.cancel("download")
            self.status.setText("Cancelling…")

    def _set_active(self, active: bool) -> None:
        self.active = active
        self.start_button.setEnabled(not active)
        self.cancel_button.setEnabled(active)
        self.progress.setVisible(active)

    def _on_progress(self, done: int, total: int) -> None:
        if total > 0:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
            self.progress.setFormat(f"{human_bytes(done)} / {human_bytes(total)}")
        else:
            self.progress.setRange(0, 0)

    def _on_done(self, path: str) -> None:
        self._set_active(False)
        self.status.setText(f"Downloaded to {path}")
        self.downloaded.emit(path)

    def _on_failed(self, kind: str, message: str) -> None:
        if kind == "download":
            self._set_active(False)
            self.status.setText(message)

    def _on_cancelled(self, kind: str) -> None:
        if kind == "download":
            self._set_active(False)
            self.status.setText("Download cancelled.")
