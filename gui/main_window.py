"""The main window: tabs for models, chat, embeddings and performance, plus a status bar."""

from __future__ import annotations

import psutil
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gui import gc_guard, theme
from gui.chat_pane import ChatPane
from gui.compare_pane import ComparePane
from gui.conversations import ConversationStore, default_db_path
from gui.embed_pane import EmbedPane
from gui.error_banner import ErrorBanner
from gui.format import human_bytes
from gui.jobs import JobRunner, on_progress, on_result
from gui.model_picker import ModelPicker
from gui.perf_pane import PerfPane
from gui.server_pane import ServerPane
from gui.settings import Settings
from gui.theme import icon
from gui.worker import Compiling, LoadedInfo

BUSY_TEXT = {"load": "Loading model…", "generate": "Generating…", "embed": "Embedding…",
             "discover": "Looking for models…", "probe": "Checking backends…",
             "query": "Searching…", "export": "Saving…",
             "connect": "Asking the server for its models…", "compare": "Comparing…",
             "serve": "Starting the server…", "unload": "Unloading…"}


CLOSE_WAIT_MS = 2000
# The widest the status bar's model names and memory reading may get: in an 800 px window
# the permanent widgets (Undo, backend, models, memory) leave a status message such as
# "Deleted …" its ~240 px only within these (at 260 and unbounded they left 141-186 px once
# the memory reading showed, more so with a device's memory beside the RSS). The whole text
# is each label's tooltip; the memory's is the performance pane's too.
STATUS_MODEL_PX = 170
STATUS_MEMORY_PX = 110


def _show_elided(label: QLabel, text: str, px: int, mode: Qt.TextElideMode) -> None:
    """``text`` in ``label``, cut to ``px`` wide; whole in its tooltip."""
    label.setText(label.fontMetrics().elidedText(text, mode, px))
    label.setToolTip(text)


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings | None = None, store: ConversationStore | None = None,
                 autoload: bool = True):
        super().__init__()
        self.setWindowTitle("Inferdesk")
        self.setWindowIcon(icon("inferdesk"))
        self.settings = settings or Settings()
        wanted = self.settings.get("appearance/theme", "system", str)
        if theme.choice() != wanted:  # before the widgets exist: styled once
            theme.set_choice(QApplication.instance(), wanted)
        self.store = store or ConversationStore(default_db_path())
        self.autoload = autoload
        self._autoloaded = False
        self._closed = False
        # One runner for everything that uses the models (their owner: self.jobs.models);
        # downloads queue apart, so a large one does not hold a chat reply back.
        self.jobs = JobRunner("inferdesk-models", parent=self)
        self.downloads = JobRunner("inferdesk-downloads", parent=self)
        gc_guard.install(busy=lambda: self.jobs.job in ("generate", "embed", "compare")
                         )  # no full collection inside a timed step

        self.picker = ModelPicker(self.jobs, self.downloads, self.settings)
        self.chat = ChatPane(self.jobs, self.store, self.settings)
        self.embed = EmbedPane(self.jobs)
        self.perf = PerfPane(self.jobs)
        self.server = ServerPane(self.jobs, self.settings)
        self.compare = ComparePane(self.jobs)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        for pane, name, ico in ((self.picker, "Models", "models"), (self.chat, "Chat", "chat"),
                                (self.embed, "Embeddings", "embeddings"),
                                (self.perf, "Performance", "performance"),
                                (self.server, "Server", "models"),
                                (self.compare, "Compare", "performance")):
            self.tabs.addTab(pane, icon(ico), name)
        self.banner = ErrorBanner()
        central = QWidget()
        cv = QVBoxLayout(central)
        cv.setContentsMargins(0, 0, 0, 0)
        cv.setSpacing(0)
        cv.addWidget(self.banner)
        cv.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self.status_backend = QLabel("Backend: —")
        self.status_model = QLabel("Model: —")
        self.status_memory = QLabel("")
        self.undo_button = QPushButton("Undo delete")
        self.undo_button.setFlat(True)
        self.undo_button.setToolTip("Bring back the chat just deleted (Ctrl+Z)")
        self.undo_button.clicked.connect(self.undo_delete)
        self.undo_button.hide()
        # Permanent (right-hand) side: the status message on the left is never covered.
        self.statusBar().addPermanentWidget(self.undo_button)
        for w in (self.status_backend, self.status_model, self.status_memory):
            w.setMinimumWidth(20)
            self.statusBar().addPermanentWidget(w)
        self._mem_timer = QTimer(self, interval=1000)
        self._mem_timer.timeout.connect(self._update_memory)
        self._mem_timer.start()
        self._build_actions()

        for runner in (self.jobs, self.downloads):
            runner.failed.connect(self._on_failed)
            runner.cancelled.connect(lambda kind: self.statusBar().showMessage(
                f"{kind.capitalize()} cancelled.", 4000))
        self.jobs.busy.connect(self._on_busy)
        # Kernels compiling or loading at model load: said, with the time, as it goes.
        self.compiling: Compiling | None = None
        self._compile_timer = QTimer(self, interval=1000)
        self._compile_timer.timeout.connect(self._show_compiling)
        on_progress(self.jobs, Compiling, self._on_compiling)
        self.chat.generation_started.connect(self._show_compiling)
        on_result(self.jobs, "load", self._on_loaded)
        on_result(self.jobs, "unload", lambda _k: self._update_models())
        on_result(self.jobs, "discover", self._maybe_autoload)
        self.chat.load_requested.connect(self.load_bundled_chat)
        self.picker.problem.connect(self.banner.show_error)
        self.picker.context_changed.connect(lambda _n: self.chat.set_context_length(
            self.chat.context_length))
        self.chat.deleted.connect(self._on_chat_deleted)
        self.perf.profile_changed.connect(self._set_profile)
        self.perf.profile_box.setChecked(self.settings.get("perf/profile", False, bool))
        self._restore()
        if self.store.notice:  # the chat's banner says what happened to the conversations
            self.tabs.setCurrentWidget(self.chat)
        self.picker.probe()
        self.picker.refresh()

    # --- actions ---------------------------------------------------------------------
    def _build_actions(self) -> None:
        def action(menu, text: str, slot, keys=(), ico: str = "") -> QAction:  # noqa: ANN001
            a = QAction(icon(ico) if ico else QIcon(), text, self)
            a.setShortcuts([QKeySequence(k) for k in keys])
            a.triggered.connect(slot)
            menu.addAction(a)
            self.addAction(a)  # shortcuts work even where the menu bar is hidden or native
            return a

        bar = self.menuBar()
        file = bar.addMenu("&File")
        self.new_chat_action = action(file, "New chat", self.new_chat, ["Ctrl+N"], "new-chat")
        self.add_model_action = action(file, "Add model file…", self.picker.add_file_dialog,
                                       ["Ctrl+O"], "add-model")
        action(file, "Connect to server…", self.picker.show_connect)
        file.addSeparator()
        action(file, "Export chat as Markdown…", lambda: self.chat._export_dialog("md"))
        action(file, "Export chat as JSON…", lambda: self.chat._export_dialog("json"))
        file.addSeparator()
        action(file, "Quit", self.close, ["Ctrl+Q"])
        chat = bar.addMenu("&Chat")
        self.send_action = action(chat, "Send", self.send, ["Ctrl+Return", "Ctrl+Enter"], "send")
        self.stop_action = action(chat, "Stop", self.stop, ["Esc"], "stop")
        action(chat, "Regenerate", self.chat.regenerate, [], "regenerate")
        action(chat, "Edit last message", self.chat.edit_last, [], "edit")
        self.undo_action = action(chat, "Undo delete", self.undo_delete, ["Ctrl+Z"])
        chat.addSeparator()
        self.enter_action = action(chat, "Enter sends (Shift+Enter adds a line)",
                                   self.chat.set_enter_sends)
        self.enter_action.setCheckable(True)
        self.enter_action.setChecked(self.chat.enter_sends())
        view = bar.addMenu("&View")
        for i in range(self.tabs.count()):
            action(view, self.tabs.tabText(i), lambda _=False, i=i: self.tabs.setCurrentIndex(i),
                   [f"Ctrl+{i + 1}"])
        view.addSeparator()
        action(view, "Chats panel", lambda: self.chat.toggle_panel(0), ["Ctrl+Shift+L"])
        action(view, "Settings panel", lambda: self.chat.toggle_panel(2), ["Ctrl+Shift+R"])
        view.addSeparator()
        themes = view.addMenu("Theme")
        group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for name in theme.CHOICES:
            a = action(themes, "Follow the system" if name == "system" else name.title(),
                       lambda _=False, n=name: self.set_theme(n))
            a.setCheckable(True)
            a.setChecked(name == theme.choice())
            group.addAction(a)
            self.theme_actions[name] = a

    def set_theme(self, name: str) -> None:
        """The user's theme choice ("system", "light", "dark"): applied and remembered."""
        name = theme.set_choice(QApplication.instance(), name)
        self.settings.set("appearance/theme", name)
        self.theme_actions[name].setChecked(True)

    def new_chat(self) -> None:
        self.tabs.setCurrentWidget(self.chat)
        self.chat.new_conversation()

    def send(self) -> None:
        """Ctrl+Enter: send in the chat tab, embed in the embeddings tab."""
        if self.tabs.currentWidget() is self.embed:
            self.embed.embed()
        else:
            self.tabs.setCurrentWidget(self.chat)
            self.chat.send()

    def stop(self) -> None:
        """Esc: stop generation (within one token), cancel embedding, or end an edit."""
        if not self.chat.generating:
            self.chat.cancel_edit()
        self.chat.stop()
        self.embed.cancel()

    def undo_delete(self) -> None:
        if self.chat.undo_delete() is not None:
            self.tabs.setCurrentWidget(self.chat)
            self.statusBar().showMessage("Chat restored.", 4000)
        self.undo_button.setVisible(self.chat.can_undo())

    def _on_chat_deleted(self, title: str) -> None:
        short = title if len(title) <= 28 else title[:27] + "…"  # fits beside Undo at 800 px
        self.statusBar().showMessage(f'Deleted "{short}".', 8000)
        self.undo_button.show()

    def load_bundled_chat(self) -> None:
        """The chat banner's "Load SmolLM2…": the bundled chat model (or the Models tab)."""
        spec = next((s for s in self.picker.specs
                     if s.kind == "causal" and s.source == "bundled"), None)
        if spec is None:
            self.tabs.setCurrentWidget(self.picker)
        else:
            self.picker.load(spec)

    def _set_profile(self, on: bool) -> None:
        self.chat.profile = on
        self.settings.set("perf/profile", on)

    # --- worker results --------------------------------------------------------------
    def _on_failed(self, kind: str, message: str) -> None:
        self.banner.show_error(message)
        self.statusBar().showMessage(f"{kind.capitalize()} failed.", 6000)

    def _on_compiling(self, c: Compiling) -> None:
        self.compiling = None if c.ended else c
        if c.ended:
            self._compile_timer.stop()
            self.chat.show_waiting("")
            self._on_busy(self.jobs.job)
        else:
            self._compile_timer.start()
            self._show_compiling()

    def _show_compiling(self) -> None:
        """The status bar, and a reply waiting for its first token, say what compiles."""
        if self.compiling is None:
            self._compile_timer.stop()
            return
        text = self.compiling.text()
        self.statusBar().showMessage(text)
        self.chat.show_waiting(text)

    def _on_busy(self, kind: str) -> None:
        if self.compiling is not None:
            if kind != "":
                return  # the compile's line stays until it ends
            self.compiling = None  # the load ended (or failed) before its last report
            self._compile_timer.stop()
            self.chat.show_waiting("")
        if kind in BUSY_TEXT:
            self.statusBar().showMessage(BUSY_TEXT[kind])
        else:
            self.statusBar().clearMessage()

    def _on_loaded(self, info: LoadedInfo) -> None:
        if self.jobs.job not in ("generate", "embed"):
            gc_guard.freeze_heap()
        if info.kind == "causal":
            self.chat.set_model(info.name, info.remote)
            self.chat.set_context_length(info.context_length)
        self.banner.hide()
        self._update_models()

    def _update_models(self) -> None:
        loaded = self.picker.loaded
        chat, enc = loaded.get("causal"), loaded.get("encoder")
        if "causal" not in loaded:
            self.chat.set_model("")
        backends = sorted({i.backend for i in loaded.values()})
        self.status_backend.setText(f"Backend: {', '.join(backends) or '—'}")
        text = f"Chat: {chat.name if chat else '—'} · Embed: {enc.name if enc else '—'}"
        # Elided: the status message on the left keeps room in a narrow window.
        _show_elided(self.status_model, text, STATUS_MODEL_PX, Qt.TextElideMode.ElideMiddle)

    def _update_memory(self) -> None:
        used, peak = self.perf.device
        text = f"RSS {human_bytes(psutil.Process().memory_info().rss)}"
        if used is not None:
            text += f" · device {human_bytes(used)} (peak {human_bytes(peak)})"
        _show_elided(self.status_memory, text, STATUS_MEMORY_PX, Qt.TextElideMode.ElideRight)

    def _maybe_autoload(self, specs: list) -> None:
        """First discovery: load the last-used models, else the bundled ones."""
        if not self.autoload or self._autoloaded:
            return
        self._autoloaded = True
        for kind, key in (("causal", "models/chat"), ("encoder", "models/encoder")):
            want = self.settings.get(key, "", str)
            of_kind = [s for s in specs if s.kind == kind]
            pick = next((s for s in of_kind if want and str(s.path) == want), None) \
                or next((s for s in of_kind if s.source == "bundled"), None)
            if pick is not None:
                self.picker.load(pick)

    # --- persistence -----------------------------------------------------------------
    def _restore(self) -> None:
        geometry = self.settings.get("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        else:
            self.resize(1280, 800)
        self.tabs.setCurrentIndex(self.settings.number("window/tab", 0, 0, self.tabs.count() - 1))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        if self._closed:
            return super().closeEvent(event)
        self._closed = True
        self.settings.set("window/geometry", self.saveGeometry())
        self.settings.set("window/tab", self.tabs.currentIndex())
        self.settings.set_sampling(self.chat.sampling.values())
        self.settings.sync()
        self.perf.timer.stop()
        self._mem_timer.stop()
        self.chat._render_reply(final=True)  # flush the streaming reply before the worker stops
        # A job that ignores its cancel must not hold the window: 2 s each, then detach.
        self.compare.shutdown(CLOSE_WAIT_MS)
        self.server.shutdown()  # before the models it serves close
        self.jobs.shutdown(CLOSE_WAIT_MS)
        self.downloads.shutdown(CLOSE_WAIT_MS)
        self.store.close()
        super().closeEvent(event)
