"""Find a model on the Hugging Face Hub by text, choose a file in a repository, and
download it with progress and Cancel (the repo id and file can also be typed)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui import worker
from gui.format import human_bytes, human_count
from gui.jobs import JobRunner
from gui.theme import icon


class DownloadBox(QGroupBox):
    downloaded = Signal(str)  # local path

    def __init__(self, jobs: JobRunner, parent: QWidget | None = None):
        super().__init__("Download from the Hugging Face Hub", parent)
        self.jobs = jobs
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
        jobs.failed.connect(self._on_failed)
        jobs.cancelled.connect(self._on_cancelled)
        self.repo.returnPressed.connect(self.start)
        self._build_search(layout)
        self._set_active(False)

    # --- search --------------------------------------------------------------------
    def _build_search(self, layout: QVBoxLayout) -> None:
        row = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hub, e.g. smollm2 gguf")
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(lambda: self.search())
        row.addWidget(self.query, 1)
        row.addWidget(self.search_button)
        layout.insertLayout(0, row)

        def table(headers: tuple[str, ...]) -> QTableWidget:
            t = QTableWidget(0, len(headers))
            t.setHorizontalHeaderLabels(headers)
            t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
            t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
            t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
            t.verticalHeader().setVisible(False)
            t.horizontalHeader().setStretchLastSection(True)
            return t

        self.results = table(("Repository", "Downloads", "Weights"))
        self.results.itemSelectionChanged.connect(self._on_pick_repo)
        self.files = table(("File", "Quant", "Size"))
        self.files.itemSelectionChanged.connect(self._on_pick_file)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.results)
        split.addWidget(self.files)
        split.setVisible(False)
        self.search_split = split
        layout.insertWidget(1, split, 1)
        self.found_models: list = []
        self.repo_files: list = []

    def search(self, query: str | None = None) -> bool:
        """Ask the Hub for repositories matching the text (answered by :meth:`_on_found`)."""
        query = (self.query.text() if query is None else query).strip()
        if not query:
            return False
        self.query.setText(query)
        self.status.setText(f"Searching the Hub for “{query}”…")
        self.jobs.submit("search", worker.search, query).result.connect(self._on_found)
        return True

    def _on_found(self, found: tuple[str, list]) -> None:
        query, models = found
        self.found_models = models
        self.results.setRowCount(len(models))
        for r, m in enumerate(models):
            for c, text in enumerate((m.repo_id, human_count(m.downloads) if m.downloads
                                      else "0", ", ".join(m.formats) or "—")):
                self.results.setItem(r, c, QTableWidgetItem(text))
        self.files.setRowCount(0)
        self.search_split.setVisible(True)
        self.status.setText(f"{len(models)} repositories for “{query}”; pick one to see "
                            "its files." if models else f"Nothing on the Hub matches "
                            f"“{query}”.")

    def _on_pick_repo(self) -> None:
        r = self.results.currentRow()
        if 0 <= r < len(self.found_models):
            repo = self.found_models[r].repo_id
            self.repo.setText(repo)
            self.filename.clear()
            self.status.setText(f"Listing the files of {repo}…")
            self.jobs.submit("list_repo", worker.list_repo, repo).result.connect(
                self._on_listed)

    def _on_listed(self, listed: tuple[str, list]) -> None:
        repo, files = listed
        if repo != self.repo.text().strip():
            return  # an answer for a repository no longer chosen
        self.repo_files = files
        self.files.setRowCount(len(files))
        for r, f in enumerate(files):
            for c, text in enumerate((f.name, f.quant or "—", human_bytes(f.size))):
                self.files.setItem(r, c, QTableWidgetItem(text))
        self.status.setText(f"{len(files)} model files in {repo}: pick one, then Download."
                            if files else f"{repo} holds no .gguf or .safetensors file.")

    def _on_pick_file(self) -> None:
        r = self.files.currentRow()
        if 0 <= r < len(self.repo_files):
            f = self.repo_files[r]
            # A .gguf is one file; safetensors weights come with their config: the repo.
            self.filename.setText(f.name if f.name.endswith(".gguf") else "")

    def start(self) -> None:
        repo = self.repo.text().strip()
        if not repo or self.active:
            return
        self._set_active(True)
        self.progress.setRange(0, 0)  # busy until the first byte count arrives
        self.status.setText(f"Downloading {repo}…")
        job = self.jobs.submit("download", worker.download, repo, self.filename.text().strip())
        job.progress.connect(self._on_progress)
        job.result.connect(self._on_done)

    def cancel(self) -> None:
        if self.active:
            self.jobs.cancel("download")
            self.status.setText("Cancelling…")

    def _set_active(self, active: bool) -> None:
        self.active = active
        self.start_button.setEnabled(not active)
        self.cancel_button.setEnabled(active)
        self.progress.setVisible(active)

    def _on_progress(self, p: worker.Progress) -> None:
        done, total = p.done, p.total
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
        elif kind in ("search", "list_repo"):
            self.status.setText(message)

    def _on_cancelled(self, kind: str) -> None:
        if kind == "download":
            self._set_active(False)
            self.status.setText("Download cancelled.")
