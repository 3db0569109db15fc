"""Model picker: discovered models, fit-in-memory, load/unload with progress, add files,
and a remote engine (Connect to server…)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui import worker
from gui.connect_dialog import ConnectDialog
from gui.download_box import DownloadBox
from gui.format import human_bytes, human_count
from gui.jobs import JobRunner, on_progress, on_result
from gui.settings import CONTEXT_RANGE, Settings
from gui.theme import icon
from gui.worker import BackendInfo, LoadedInfo

# The KV cache types a user may ask for: (label, load_model's kv_dtype; "" the backend's own).
KV_CHOICES = (("backend default", ""), ("float32", "float32"), ("float16", "float16"))
COLUMNS = ("Name", "Kind", "Format", "Architecture", "Context", "Quant", "Params",
           "File size", "Est. memory", "Fits", "Source")
MODEL_FILTER = "Model files (*.gguf *.safetensors);;All files (*)"
GOOD, BAD = QColor("#047857"), QColor("#b91c1c")


def file_problem(path: str | Path) -> str | None:
    """Why an added file cannot be a model, in one sentence, from its headers only (None:
    it reads as one). Checked before anything asks to load it."""
    from inference.errors import InferdeskError
    from inference.store import spec_for_path

    p = Path(path)
    if p.is_file() and p.suffix.lower() != ".safetensors":  # else it must be GGUF
        try:
            with p.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            return f"{p.name} cannot be read ({exc.strerror or exc})."
        if magic != b"GGUF":  # even a few bytes say this, before any size check
            return (f"{p.name} is not a GGUF file: it does not start with the GGUF "
                    f"signature ({p.stat().st_size:,} bytes).")
    try:
        spec = spec_for_path(p)
    except InferdeskError as exc:
        return str(exc)
    except OSError as exc:
        return f"{p.name} cannot be read ({exc.strerror or exc})."
    return spec.problem or None


def kv_choice_box(current: str) -> QComboBox:
    """A combo box of :data:`KV_CHOICES` (item data: load_model's kv_dtype), at ``current``."""
    box = QComboBox()
    for label, value in KV_CHOICES:
        box.addItem(label, value)
    box.setToolTip("The element type of a chat's KV cache. float16 holds it in half the "
                   "memory and reads half the bytes per token (cpu and cuda); backends "
                   "without it say so at load")
    box.setCurrentIndex(max(0, box.findData(current)))
    return box


def template_line(info: LoadedInfo) -> str:
    """The chat template a chat model uses and why (where the engine says), as a line."""
    from html import escape

    return f"<br>Chat template: {escape(info.template, quote=False)}" if info.template else ""


class ModelPicker(QWidget):
    model_loaded = Signal(object)  # LoadedInfo
    context_changed = Signal(int)  # tokens a chat may use
    problem = Signal(str)  # an added file that cannot be a model, in one sentence

    def __init__(self, jobs: JobRunner, downloads: JobRunner, settings: Settings,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.setAcceptDrops(True)
        self.jobs, self.settings = jobs, settings
        self.connect_dialog: ConnectDialog | None = None
        self.specs: list[Any] = []
        self.backend_infos: list[BackendInfo] = []
        self.loaded: dict[str, LoadedInfo] = {}  # kind -> info
        self.loading = ""  # name being loaded
        self._pending_path = ""  # a file added by the user, loaded right away
        # {path: MemoryEstimate} for the backend and context now chosen.
        self.estimates: dict[str, Any] = {}
        self._build(downloads)
        # Any load (this tab's, the connect dialog's, the window's autoload) shows here.
        on_result(jobs, "discover", self._on_discovered)
        on_result(jobs, "probe", self._on_backends)
        on_progress(jobs, list, self._on_discovered, "discover")  # the bundled ones at least
        on_progress(jobs, worker.LoadStarted, self._on_load_started, "load")
        on_progress(jobs, worker.LoadProgress, self._on_load_progress, "load")
        on_result(jobs, "load", self._on_loaded)
        on_result(jobs, "unload", self._on_unloaded)
        jobs.failed.connect(self._on_failed)
        jobs.cancelled.connect(self._on_cancelled)

    def _build(self, downloads: JobRunner) -> None:
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(QLabel("Backend:"))
        self.backend_combo = QComboBox()
        self.backend_combo.addItem("auto", "auto")
        self.backend_combo.currentIndexChanged.connect(self._on_backend_changed)
        top.addWidget(self.backend_combo)
        self.backend_note = QLabel("")
        self.backend_note.setObjectName("Hint")
        self.backend_note.setWordWrap(True)
        top.addWidget(self.backend_note, 1)
        self.add_button = QPushButton(icon("add-model"), "Add model file…")
        self.add_button.setToolTip("Add a .gguf or .safetensors file (Ctrl+O); or drop it here")
        self.add_button.clicked.connect(self.add_file_dialog)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.connect_button = QPushButton("Connect to server…")
        self.connect_button.setToolTip("Use a model on an OpenAI-compatible server (vLLM, "
                                       "llama.cpp server, Ollama, another Inferdesk)")
        self.connect_button.clicked.connect(self.show_connect)
        top.addWidget(self.add_button)
        top.addWidget(self.connect_button)
        top.addWidget(self.refresh_button)
        layout.addLayout(top)
        opts = QHBoxLayout()  # what a load sizes: its own row, so the window fits 800 px
        opts.addWidget(QLabel("Context:"))
        self.context_box = QSpinBox()
        self.context_box.setRange(*CONTEXT_RANGE)
        self.context_box.setSingleStep(1024)
        self.context_box.setSuffix(" tokens")
        self.context_box.setToolTip("Tokens a chat may hold (its KV cache is sized for this; "
                                    "capped at each model's own context)")
        self.context_box.setValue(self.context())
        self.context_box.valueChanged.connect(self._on_context_changed)
        opts.addWidget(self.context_box)
        opts.addWidget(QLabel("KV cache:"))
        self.kv_combo = kv_choice_box(self.settings.get("models/kv_dtype", "", str))
        self.kv_combo.currentIndexChanged.connect(self._on_kv_changed)
        opts.addWidget(self.kv_combo)
        opts.addStretch(1)
        layout.addLayout(opts)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeaderItem(COLUMNS.index("Est. memory")).setToolTip(
            "Estimated memory at the full context set above (a short chat uses less); "
            "hover a cell for the parts")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.doubleClicked.connect(lambda _: self.load_selected())
        self.table.itemSelectionChanged.connect(self._update_buttons)
        layout.addWidget(self.table, 1)
        # Why the selected model cannot run (the store's one sentence), before any load.
        self.problem_label = QLabel("")
        self.problem_label.setObjectName("Problem")
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet(f"color: {BAD.name()}")
        self.problem_label.setVisible(False)
        layout.addWidget(self.problem_label)
        # Which chat template the selected chat model gets, and why, before any load.
        self.template_label = QLabel("")
        self.template_label.setObjectName("Hint")
        self.template_label.setWordWrap(True)
        self.template_label.setVisible(False)
        layout.addWidget(self.template_label)

        row = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("Primary")
        self.load_button.clicked.connect(self.load_selected)
        self.unload_chat = QPushButton("Unload chat model")
        self.unload_chat.clicked.connect(lambda: self.unload("causal"))
        self.unload_embed = QPushButton("Unload embedding model")
        self.unload_embed.clicked.connect(lambda: self.unload("encoder"))
        self.load_progress = QProgressBar()
        self.load_progress.setRange(0, 0)  # busy until the first weight-bytes report
        self.load_progress.setVisible(False)
        self.load_status = QLabel("")
        self.load_status.setObjectName("Hint")
        self.load_status.setWordWrap(True)
        self.cancel_load = QPushButton("Cancel")
        self.cancel_load.setVisible(False)
        self.cancel_load.clicked.connect(lambda: self.jobs.cancel("load"))
        for w in (self.load_button, self.unload_chat, self.unload_embed):
            row.addWidget(w)
        row.addWidget(self.load_progress, 1)
        row.addWidget(self.load_status, 1)
        row.addWidget(self.cancel_load)
        layout.addLayout(row)

        box = QGroupBox("Loaded")
        bl = QVBoxLayout(box)
        self.loaded_labels = {"causal": QLabel(), "encoder": QLabel()}
        for lab in self.loaded_labels.values():
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.TextFormat.RichText)
            bl.addWidget(lab)
        layout.addWidget(box)
        self.download_box = DownloadBox(downloads)
        self.download_box.downloaded.connect(lambda _p: self.refresh())
        layout.addWidget(self.download_box)
        self._show_loaded()
        self._update_buttons()

    # --- requests --------------------------------------------------------------------
    def refresh(self) -> None:
        self.jobs.submit("discover", worker.discover, self.settings.extra_paths())

    def probe(self) -> None:
        self.jobs.submit("probe", worker.probe)

    def backend(self) -> str:
        return self.backend_combo.currentData() or "auto"

    def context(self) -> int:
        return self.settings.context()

    def kv_dtype(self) -> str:
        """The KV cache type chosen ("": the backend's own)."""
        return self.kv_combo.currentData() or ""

    def _on_kv_changed(self, *_: object) -> None:
        self.settings.set("models/kv_dtype", self.kv_dtype())
        self.estimates = {}
        self.request_estimates()

    def _on_context_changed(self, value: int) -> None:
        self.settings.set("models/context", int(value))
        self.context_changed.emit(int(value))
        self.request_estimates()

    def request_estimates(self) -> None:
        """Estimates for the chosen backend and context (computed by the worker)."""
        if self.specs:
            self.jobs.submit("estimate", worker.estimate, list(self.specs), self.backend(),
                             int(self.context()), self.kv_dtype(), quiet=True
                             ).result.connect(self._on_estimated)

    def _on_estimated(self, got: worker.Estimates) -> None:
        if (got.backend, got.context, got.kv_dtype) != (self.backend(), self.context(),
                                                        self.kv_dtype()):
            return  # an answer to an earlier choice
        self.estimates = estimates = got.by_path
        col = COLUMNS.index("Est. memory")
        for r, s in enumerate(self.specs):
            e = estimates.get(str(s.path))
            item = self.table.item(r, col)
            if e is None or item is None:
                continue
            item.setText(human_bytes(e.total))
            kv = f" + KV cache {human_bytes(e.kv)} at {e.context:,} tokens" \
                if e.context else ""
            tok = f" + tokenizer {human_bytes(e.tokenizer)}" if e.tokenizer else ""
            item.setToolTip(f"On {e.backend}: weights {human_bytes(e.weights)} as held{kv} "
                            f"+ scratch {human_bytes(e.scratch)}{tok}")
        self._update_fits()
        self._show_loaded()

    def est_memory(self, spec: Any) -> int | None:
        """The backend-aware estimate when known, else the store's allowance."""
        e = self.estimates.get(str(spec.path))
        return e.total if e is not None else spec.est_memory

    def load(self, target: Any) -> None:
        """Load a ModelSpec, a model name or a path on the chosen backend."""
        self.jobs.submit("load", worker.load, target, self.backend(), self.kv_dtype())

    def unload(self, kind: str) -> None:
        self.jobs.submit("unload", worker.unload, kind)

    def selected_spec(self) -> Any | None:
        row = self.table.currentRow()
        return self.specs[row] if 0 <= row < len(self.specs) else None

    def load_selected(self) -> None:
        spec = self.selected_spec()
        if spec is not None and not spec.problem:  # a model that cannot run is not tried
            self.load(spec)

    def add_files(self, paths: list[str]) -> None:
        """Remember files (or folders) the user added, list them, and load the first."""
        paths = [str(Path(p).resolve()) for p in paths if p]
        problems = [msg for p in paths if (msg := file_problem(p))]
        paths = [p for p in paths if not file_problem(p)]
        if problems:  # said before anything is asked or replaced
            text = " ".join(problems)
            self.load_status.setText(text)
            self.problem_label.setText(text)
            self.problem_label.setVisible(True)
            self.problem.emit(text)
        if not paths:
            return
        for p in paths:
            self.settings.add_extra_path(p)
        if not self.loaded or self.confirm_replace(Path(paths[0]).name):
            self._pending_path = paths[0]
            self.load(paths[0])
        self.refresh()

    def confirm_replace(self, name: str) -> bool:
        """Ask before a new file takes the place of a loaded model (No: only list it)."""
        from PySide6.QtWidgets import QMessageBox

        loaded = ", ".join(i.name for i in self.loaded.values())
        answer = QMessageBox.question(
            self, "Load the added model?",
            f"Load {name} now? It replaces the loaded model of the same kind ({loaded}). "
            "Choose No to only add it to the list.")
        return answer == QMessageBox.StandardButton.Yes

    def show_connect(self) -> ConnectDialog:
        """The Connect to server… dialog (one, kept: it remembers the listed models)."""
        if self.connect_dialog is None:
            self.connect_dialog = ConnectDialog(self.jobs, self.settings, self)
        self.connect_dialog.show()
        self.connect_dialog.raise_()
        return self.connect_dialog

    def add_file_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Add model file", str(Path.home()),
                                                MODEL_FILTER)
        self.add_files(paths)

    def dragEnterEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt override
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt override
        self.add_files([u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()])

    # --- results ---------------------------------------------------------------------
    def _on_discovered(self, specs: list) -> None:
        self.specs = sorted(specs, key=lambda s: (s.kind != "causal", s.source != "bundled",
                                                  s.name.lower()))
        selected = self.table.currentRow()
        self.table.setRowCount(len(self.specs))
        for r, s in enumerate(self.specs):
            kind = {"causal": "chat", "encoder": "embedding"}.get(s.kind, "?")
            cells = (s.name, kind, s.format, s.architecture,
                     f"{s.context_length:,}" if s.context_length else "?",
                     ", ".join(s.quant_types) or "—", human_count(s.n_params),
                     human_bytes(s.file_size),
                     human_bytes(s.est_memory) if s.est_memory else "—", "", s.source)
            tip = f"{s.path}\nCannot run: {s.problem}" if s.problem else str(s.path)
            for c, text in enumerate(cells):
                item = QTableWidgetItem(str(text))
                item.setToolTip(tip)
                if s.problem:
                    item.setForeground(QBrush(BAD))
                self.table.setItem(r, c, item)
        if self.specs:
            self.table.selectRow(max(0, min(selected, len(self.specs) - 1)))
        self._update_fits()
        self._mark_loaded()
        self._update_buttons()  # the row under the selection may be another model now
        self.request_estimates()

    def _on_backends(self, infos: list) -> None:
        self.backend_infos = infos
        want = self.settings.get("models/backend", "auto", str)
        self.backend_combo.blockSignals(True)
        self.backend_combo.clear()
        self.backend_combo.addItem("auto", "auto")
        for info in infos:
            label = info.name if info.available else f"{info.name} (unavailable)"
            self.backend_combo.addItem(label, info.name)
            idx = self.backend_combo.count() - 1
            self.backend_combo.setItemData(idx, info.reason, Qt.ItemDataRole.ToolTipRole)
            if not info.available:  # visible but not selectable, with the reason as tooltip
                self.backend_combo.model().item(idx).setEnabled(False)
        idx = self.backend_combo.findData(want)
        self.backend_combo.setCurrentIndex(max(idx, 0))
        self.backend_combo.blockSignals(False)
        self._on_backend_changed()

    def _on_backend_changed(self, *_: object) -> None:
        self.settings.set("models/backend", self.backend())
        self.estimates = {}
        self.request_estimates()
        info = self._backend_info()
        if info is not None:
            free = human_bytes(info.free_memory) if info.free_memory is not None else "unknown"
            if self.backend() == "auto":
                names = ", ".join(i.name for i in self.backend_infos if i.available)
                self.backend_note.setText(
                    f"auto: the engine picks the fastest backend here that has every op "
                    f"the model needs (available: {names}) · {free} free")
            else:
                self.backend_note.setText(f"{info.name}: {free} free · {info.reason}")
        self._update_fits()

    def _backend_info(self) -> BackendInfo | None:
        available = [i for i in self.backend_infos if i.available]
        if self.backend() == "auto":
            return available[0] if available else None
        return next((i for i in self.backend_infos if i.name == self.backend()), None)

    def _update_fits(self) -> None:
        info = self._backend_info()
        free = info.free_memory if info is not None else None
        for r, s in enumerate(self.specs):
            item = self.table.item(r, COLUMNS.index("Fits"))
            if item is None:
                continue
            if s.problem:
                item.setText("cannot run")
                item.setForeground(QBrush(BAD))
                item.setToolTip(s.problem)
                continue
            need = self.est_memory(s)
            if free is None or not need:
                item.setText("?")
                item.setToolTip("The free memory of this backend is unknown.")
                continue
            fits = need <= free
            item.setText("yes" if fits else "no")
            item.setForeground(QBrush(GOOD if fits else BAD))
            where = "device memory free" if info.name == "cuda" else "RAM available"
            item.setToolTip(f"needs about {human_bytes(need)}; {human_bytes(free)} {where} "
                            f"for {info.name}")

    def _on_load_started(self, started: worker.LoadStarted) -> None:
        self.loading = name = started.name
        self.load_status.setText(f"Loading {name}…")
        self.load_progress.setRange(0, 0)
        self.load_progress.setVisible(True)
        self.cancel_load.setVisible(True)
        self._update_buttons()

    def _on_load_progress(self, p: worker.LoadProgress) -> None:
        # Bytes can pass 2**31: show per mille, not raw counts, in the int-ranged bar.
        self.load_progress.setRange(0, 1000)
        self.load_progress.setValue(int(1000 * p.done / max(p.total, 1)))

    def _load_ended(self, text: str = "") -> None:
        self.loading = ""
        self._pending_path = ""
        self.load_progress.setVisible(False)
        self.cancel_load.setVisible(False)
        self.load_status.setText(text)
        self._update_buttons()

    def _on_loaded(self, info: LoadedInfo) -> None:
        self.loaded[info.kind] = info
        if not info.remote:  # the next start loads local models; a server's URL is kept apart
            key = "models/chat" if info.kind == "causal" else "models/encoder"
            self.settings.set(key, info.path)
        self._load_ended(f"Loaded {info.name} on {info.backend}.")
        self._show_loaded()
        self._mark_loaded()
        self.model_loaded.emit(info)

    def _on_unloaded(self, kind: str) -> None:
        self.loaded.pop(kind, None)
        if self.load_status.text().startswith("Loaded") and not self.loading:
            self.load_status.setText("")  # no stale "Loaded …" line after an unload
        self._show_loaded()
        self._mark_loaded()
        self._update_buttons()

    def _on_failed(self, kind: str, message: str) -> None:
        if kind == "load":
            dropped = self._pending_path
            if dropped:  # a file that cannot be loaded is not kept in the list
                self.settings.remove_extra_path(dropped)
            self._load_ended(message)
            if dropped:
                self.refresh()

    def _on_cancelled(self, kind: str) -> None:
        if kind == "load":
            self._load_ended("Loading cancelled.")

    def _show_loaded(self) -> None:
        for kind, label in self.loaded_labels.items():
            what = "Chat model" if kind == "causal" else "Embedding model"
            info = self.loaded.get(kind)
            if info is None:
                label.setText(f"<b>{what}:</b> none")
                continue
            if info.remote:
                label.setText(f"<b>{what}:</b> {info.name} — {info.reason}<br>"
                              "Memory: held by the server, which does not report it")
                continue
            e = self.estimates.get(info.path)
            est = e.total if e is not None and e.backend == info.backend else info.est_memory
            full = f" at full context ({e.context:,} tokens)" if e is not None and e.context \
                else ""
            where = "process memory" if info.backend in ("numpy", "cpu") else "device memory"
            label.setText(
                f"<b>{what}:</b> {info.name} on <b>{info.backend}</b> — {info.reason}<br>"
                f"Memory: estimated {human_bytes(est)}{full}; measured: {where} grew "
                f"{human_bytes(info.used_memory)} during the load{template_line(info)}")

    def _mark_loaded(self) -> None:
        paths = {i.path for i in self.loaded.values()}
        for r, s in enumerate(self.specs):
            item = self.table.item(r, 0)
            if item is not None:
                font = QFont(item.font())
                font.setBold(str(s.path) in paths)
                item.setFont(font)

    def _update_buttons(self) -> None:
        spec = self.selected_spec()
        problem = spec.problem if spec is not None else None
        self.load_button.setEnabled(not self.loading and spec is not None and not problem)
        self.load_button.setToolTip(f"Cannot load {spec.name}: {problem}" if problem else "")
        self.problem_label.setText(f"{spec.name} cannot run: {problem}" if problem else "")
        self.problem_label.setVisible(bool(problem))
        template = getattr(spec, "chat_template", None) if spec is not None and not problem \
            else None
        self.template_label.setText(f"{spec.name} — chat template: {template}" if template
                                    else "")
        self.template_label.setVisible(bool(template))
        self.unload_chat.setEnabled("causal" in self.loaded)
        self.unload_embed.setEnabled("encoder" in self.loaded)
