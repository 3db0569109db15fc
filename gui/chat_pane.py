"""Chat: the conversation list (gui.conversation_list), the streamed Markdown replies,
the composer and settings column (gui.composer), and the messages' way to the database
(gui.reply_store), composed into one pane that runs the replies.

Tokens arrive as queued signals; the reply is re-rendered and saved at most every
RENDER_MS, not per token, so a fast model cannot flood the event loop with layouts, and
less often as rendering grows dearer (gui.pacing), so the window leaves the cores to the
engine.

Nothing typed or generated is lost: the view is updated before the database, and a write
that fails (lock, full disk) leaves a :class:`PendingWrite` in memory, a banner naming
what is unsaved with Retry / Save as…, and a chat that keeps working.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLineEdit,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gui import worker
from gui.composer import ChatSettings, Composer
from gui.conversation_list import ConversationList
from gui.conversations import (
    ConversationStore,
    DeletedConversation,
    Message,
    StorageError,
    conversation_markdown,
    write_atomic,
)
from gui.error_banner import ErrorBanner
from gui.jobs import JobRunner
from gui.message_view import MessageView
from gui.pacing import RenderPacer
from gui.reply_store import PendingWrite, ReplyStore
from gui.settings import DEFAULT_SYSTEM_PROMPT, Settings
from gui.worker import GenerateRequest, prefill_of
from inference.context import DEFAULT_POLICY, POLICIES

RENDER_MS = 50
MEASURE_MS = 400  # the idle context indicator re-counts this long after the last keystroke
TITLE_CHARS = 48
NEW_TITLE = "New chat"
NEAR_COLOR, OVER_COLOR = "#d97706", "#dc2626"  # readable on the light and the dark theme


class ChatPane(QWidget):
    generation_started = Signal()
    generation_finished = Signal(object)  # DoneEvent, or None after a failure
    load_requested = Signal()  # the banner's "Load SmolLM2…" action
    deleted = Signal(str)  # title of a conversation just deleted (undo is offered)

    def __init__(self, jobs: JobRunner, store: ConversationStore, settings: Settings,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.jobs, self.store, self.settings = jobs, store, settings
        self.conv_id: int | None = None
        self.model_name = ""
        self.remote = False  # the chat model is a remote engine (it counts tokens itself)
        self.profile = False
        self.generating = False
        self.replies = ReplyStore(store, on_failure=self._storage_failed)
        self._undo: list[DeletedConversation] = []
        self._editing: tuple[int, str] | None = None  # (user message id, draft it replaced)
        self._reply: PendingWrite | None = None  # the streaming reply (text kept in memory)
        self._base = ""  # the text a continued reply already had
        self._base_stats: dict = {}
        self._n_prompt = 0  # tokens sent with the running generation
        self._n_gen = 0  # tokens generated so far
        self._dirty = False
        self._measure_timer = QTimer(self, singleShot=True, interval=MEASURE_MS)
        self._measure_timer.timeout.connect(self._measure)
        self._render_timer = QTimer(self, interval=RENDER_MS)
        self._render_timer.timeout.connect(self._render_reply)
        self._pacer = RenderPacer()
        self._build()
        self.refresh_list()
        convs = self._safe(store.conversations) or []
        if convs:
            self.open_conversation(convs[0].id)
        else:  # no chat yet: the box shows the prompt the first chat will start with
            self._show_system_prompt(self.default_system_prompt())
        if store.notice:
            self.store_banner.show_error(store.notice, [("Save as…", self._save_as_dialog)]
                                         if store.read_only else [], persistent=store.read_only)
        self._update_buttons()

    # --- layout ----------------------------------------------------------------------
    def _build(self) -> None:
        self.split = split = QSplitter(Qt.Orientation.Horizontal, self)
        split.setChildrenCollapsible(True)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.addWidget(split)

        self.conversations = left = ConversationList()
        self.new_button, self.search = left.new_button, left.search
        self.conv_list, self.delete_button = left.list, left.delete_button
        left.new_button.clicked.connect(lambda: self.new_conversation())
        left.delete_button.clicked.connect(self.delete_conversation)
        left.search_changed.connect(lambda _t: self.refresh_list())
        left.picked.connect(self.open_conversation)
        left.renamed.connect(self.rename_conversation)

        middle = QWidget()
        mv = QVBoxLayout(middle)
        mv.setContentsMargins(0, 0, 0, 0)
        self.banner = ErrorBanner()
        # The store's own state (read-only, recovered): apart from the chat's passing
        # messages, so nothing else hides it while the condition holds.
        self.store_banner = ErrorBanner()
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.messages_box = QWidget()
        self.messages_layout = QVBoxLayout(self.messages_box)
        self.messages_layout.setSpacing(8)
        self.messages_layout.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.messages_layout.addStretch(1)
        self.scroll.setWidget(self.messages_box)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._follow)
        self._at_bottom = True
        bar.valueChanged.connect(
            lambda v: setattr(self, "_at_bottom", v >= bar.maximum() - 4))
        self.composer = composer = Composer()
        self.wait_label, self.input = composer.wait_label, composer.input
        self.send_button, self.stop_button = composer.send_button, composer.stop_button
        self.regen_button, self.edit_button = composer.regen_button, composer.edit_button
        self.continue_button, self.export_button = (composer.continue_button,
                                                    composer.export_button)
        self.context_label, self.model_label = composer.context_label, composer.model_label
        self.context_length: int | None = None  # the loaded model's context
        self.input.installEventFilter(self)
        self.input.textChanged.connect(self._measure_timer.start)
        self.send_button.clicked.connect(lambda: self.send())
        self.stop_button.clicked.connect(self.stop)
        self.regen_button.clicked.connect(self.regenerate)
        self.edit_button.clicked.connect(self.edit_last)
        self.continue_button.clicked.connect(self.continue_reply)
        composer.export_menu.addAction("Markdown…", lambda: self._export_dialog("md"))
        composer.export_menu.addAction("JSON…", lambda: self._export_dialog("json"))
        mv.addWidget(self.store_banner)
        mv.addWidget(self.banner)
        mv.addWidget(self.scroll, 1)
        mv.addWidget(composer)

        self.chat_settings = right = ChatSettings(self.settings.sampling())
        self.system_prompt, self.default_button = right.system_prompt, right.default_button
        self.policy_combo, self.fit_note = right.policy_combo, right.fit_note
        self.sampling = right.sampling
        self.system_prompt.textChanged.connect(self._save_system_prompt)
        self.default_button.clicked.connect(self.make_default_prompt)
        self.policy_combo.currentIndexChanged.connect(self._on_policy_changed)
        self.sampling.changed.connect(self.settings.set_sampling)

        for w in (left, right):
            w.setMinimumWidth(150)
        middle.setMinimumWidth(300)
        split.addWidget(left)
        split.addWidget(middle)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        state = self.settings.get("chat/splitter")
        if state is None or not split.restoreState(state):
            split.setSizes([180, 640, 240])
        split.splitterMoved.connect(
            lambda *_: self.settings.set("chat/splitter", split.saveState()))
        self._apply_enter_setting()
        for box in (self.system_prompt, self.search):  # the input has the filter already
            box.installEventFilter(self)

    def toggle_panel(self, index: int) -> None:
        """Collapse or reopen side panel ``index`` (0 chats, 2 settings); remembered."""
        sizes = self.split.sizes()
        if sizes[index] > 0:
            sizes[1] += sizes[index]
            sizes[index] = 0
        else:
            give = 180 if index == 0 else 240
            sizes[index], sizes[1] = give, max(0, sizes[1] - give)
        self.split.setSizes(sizes)
        self.settings.set("chat/splitter", self.split.saveState())

    # --- Enter sends (a setting) -----------------------------------------------------
    def enter_sends(self) -> bool:
        return bool(self.settings.get("chat/enter_sends", True, bool))

    def set_enter_sends(self, on: bool) -> None:
        self.settings.set("chat/enter_sends", bool(on))
        self._apply_enter_setting()

    def _apply_enter_setting(self) -> None:
        if self.enter_sends():
            hint, tip = "Enter sends, Shift+Enter adds a line", "Send (Enter or Ctrl+Enter)"
        else:
            hint, tip = "Ctrl+Enter sends", "Send (Ctrl+Enter)"
        self.input.setPlaceholderText(f"Message the model… ({hint}; Esc stops)")
        self.send_button.setToolTip(tip)

    def text_boxes(self) -> tuple[QWidget, ...]:
        """The pane's text boxes: where they have nothing to undo, Ctrl+Z undoes a
        deletion instead (:meth:`eventFilter`)."""
        return (self.input, self.system_prompt, self.search)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.ShortcutOverride and obj in self.text_boxes() \
                and event.matches(QKeySequence.StandardKey.Undo):
            own = obj.isUndoAvailable() if isinstance(obj, QLineEdit) \
                else obj.document().isUndoAvailable()
            if not own:  # not claimed by the box: the window's Undo delete runs
                event.ignore()
                return True
        if obj is self.input and event.type() == QEvent.Type.KeyPress:
            key: QKeyEvent = event  # type: ignore[assignment]
            mods = key.modifiers()
            if key.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                plain = not (mods & (Qt.KeyboardModifier.ShiftModifier
                                     | Qt.KeyboardModifier.ControlModifier
                                     | Qt.KeyboardModifier.AltModifier
                                     | Qt.KeyboardModifier.MetaModifier))
                if plain and self.enter_sends():
                    self.send()
                    return True
            elif key.key() == Qt.Key.Key_Escape and self._editing and not self.generating:
                self.cancel_edit()
                return True
        return super().eventFilter(obj, event)

    # --- storage that degrades -------------------------------------------------------
    def _safe(self, fn, *args, what: str = ""):  # noqa: ANN001, ANN202
        """Run a store call; a failure goes to the banner (naming ``what``), not a trace."""
        try:
            return fn(*args)
        except StorageError as exc:
            self._storage_failed(exc, what)
            return None

    def _ok(self, fn, *args, what: str = "") -> bool:  # noqa: ANN001
        """:meth:`_safe` for calls that return nothing: True when the call succeeded."""
        try:
            fn(*args)
            return True
        except StorageError as exc:
            self._storage_failed(exc, what)
            return False

    @property
    def pending(self) -> list[PendingWrite]:
        """Messages shown but not saved yet, oldest first (the reply store's)."""
        return self.replies.pending

    def _persist(self, pw: PendingWrite) -> bool:
        return self.replies.persist(pw)

    def retry_pending(self) -> bool:
        """Write what is pending, in order; True when nothing is left unsaved."""
        if not self.replies.retry():
            return False
        self.banner.hide()
        self.refresh_list()
        return True

    def _storage_failed(self, exc: StorageError, what: str = "") -> None:
        self._last_storage_error = str(exc)
        if what and not self.pending:
            self.banner.show_error(f"{exc} Not saved: {what}.",
                                   [("Save as…", self._save_as_dialog)])
        else:
            self._show_pending()

    def _show_pending(self) -> None:
        if not self.pending:
            return
        items = self.replies.unsaved()
        reason = getattr(self, "_last_storage_error", "")
        self.banner.show_error(
            f"{reason} Not saved: {items}. It is kept in this window until you quit: "
            "Retry, or Save as… to keep the chat in a file.",
            [("Retry", self.retry_pending), ("Save as…", self._save_as_dialog)])

    def save_as(self, path: str | Path) -> Path:
        """Write the open chat as shown (saved or not) to ``path`` as Markdown."""
        conv = self._safe(self.store.get, self.conv_id) if self.conv_id is not None else None
        system = self.system_prompt.toPlainText()
        return write_atomic(path, conversation_markdown(
            conv.title if conv else "Chat", system,
            [(v.role, v.text, {}) for v in self.views()]))

    def _save_as_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save chat as", "chat.md",
                                              "Markdown (*.md)")
        if path:
            try:
                self.save_as(path)
            except OSError as exc:
                self.banner.show_error(f"Could not write {path}: {exc.strerror or exc}.",
                                       [("Save as…", self._save_as_dialog)])

    # --- conversations ---------------------------------------------------------------
    def refresh_list(self) -> None:
        convs = self._safe(self.store.conversations, self.conversations.query()) or []
        self.conversations.show_conversations(convs, self.conv_id)

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self._ok(self.store.rename, conv_id, title, what=f'the new name "{title}"')
        QTimer.singleShot(0, self.refresh_list)  # not inside the list's own signal

    def default_system_prompt(self) -> str:
        return self.settings.get("chat/system_prompt", DEFAULT_SYSTEM_PROMPT, str)

    def _show_system_prompt(self, text: str) -> None:
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(text)
        self.system_prompt.blockSignals(False)

    def new_conversation(self, system_prompt: str | None = None) -> int | None:
        """Open an empty chat: the existing empty one if there is one, else a new one; it
        starts with ``system_prompt`` (default: the default prompt, or the reused chat's)."""
        if self.generating:
            self.stop()
        conv_id = self._safe(self.store.find_empty, NEW_TITLE)
        if conv_id is None:
            prompt = self.default_system_prompt() if system_prompt is None else system_prompt
            conv_id = self._safe(self.store.create, NEW_TITLE, prompt, what="the new chat")
        elif system_prompt is not None:
            self._ok(self.store.set_system_prompt, conv_id, system_prompt,
                     what="the system prompt")
        if conv_id is None:
            return None
        self.search.clear()
        self.open_conversation(conv_id)
        self.input.setFocus()
        return conv_id

    def open_conversation(self, conv_id: int) -> None:
        conv = self._safe(self.store.get, conv_id)
        if conv is None:
            return
        if self.generating and conv_id != self.conv_id:
            self.stop()
        if conv_id != self.conv_id:
            self.cancel_edit()
        self.conv_id = conv_id
        self._show_system_prompt(conv.system_prompt)
        policy = self._safe(self.store.context_policy, conv_id) or self.default_policy()
        self.policy_combo.blockSignals(True)
        self.policy_combo.setCurrentIndex(max(0, self.policy_combo.findData(policy)))
        self.policy_combo.blockSignals(False)
        self.fit_note.setVisible(False)
        self._show_messages(self._safe(self.store.messages, conv_id) or [])
        self.refresh_list()
        self._update_buttons()
        self._update_context()
        self._measure_timer.start()

    def delete_conversation(self) -> None:
        """Delete the open chat; :meth:`undo_delete` (Ctrl+Z) brings it back this session."""
        if self.conv_id is None:
            return
        if self.generating:
            self.stop()
        conv = self._safe(self.store.get, self.conv_id)
        record = self._safe(self.store.delete, self.conv_id, what="the deletion")
        if record is None:
            return
        self._undo.append(record)
        self.conv_id = None
        self._show_messages([])
        convs = self._safe(self.store.conversations) or []
        if convs:
            self.open_conversation(convs[0].id)
        else:
            self.refresh_list()
        self._update_buttons()
        self.deleted.emit(conv.title if conv else "")

    def can_undo(self) -> bool:
        return bool(self._undo)

    def undo_delete(self) -> int | None:
        if not self._undo:
            return None
        record = self._undo[-1]
        conv_id = self._safe(self.store.restore, record, what="the restored chat")
        if conv_id is None:
            return None
        self._undo.pop()
        self.open_conversation(conv_id)
        return conv_id

    def _save_system_prompt(self) -> None:
        """The prompt belongs to this chat only; the default changes only on request."""
        if self.conv_id is not None:
            self._ok(self.store.set_system_prompt, self.conv_id,
                     self.system_prompt.toPlainText(), what="the system prompt")

    def make_default_prompt(self) -> None:
        self.settings.set("chat/system_prompt", self.system_prompt.toPlainText())

    def views(self) -> list[MessageView]:
        return [w for i in range(self.messages_layout.count())
                if isinstance(w := self.messages_layout.itemAt(i).widget(), MessageView)]

    def _show_messages(self, messages: list[Message]) -> None:
        for view in self.views():
            # Qt deletes it on the GUI thread's next loop; the parent keeps owning it until
            # then (setParent(None) would hand it to Python's refcounting instead).
            self.messages_layout.removeWidget(view)
            view.hide()
            view.deleteLater()
        for m in messages:
            self._append_view(MessageView(m.role, m.content, m.stats, m.id))
        # What this chat holds in memory but not in the database is shown too (shown ==
        # kept): rows never inserted are appended, rows whose update failed overlaid.
        by_id = {v.msg_id: v for v in self.views()}
        for pw in self.pending:
            if pw.conv_id != self.conv_id:
                pw.view = None
            elif pw.msg_id is None:
                pw.view = self._append_view(MessageView(pw.role, pw.content, pw.stats))
            elif pw.msg_id in by_id:
                pw.view = by_id[pw.msg_id]
                pw.view.set_text(pw.content)
        r = self._reply
        if r is not None and r not in self.pending:
            r.view = by_id.get(r.msg_id) if r.conv_id == self.conv_id else None
        self._update_versions()

    def _append_view(self, view: MessageView) -> MessageView:
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, view)
        view.version_step.connect(self._step_version)
        self._at_bottom = True
        return view

    def _follow(self, _lo: int, hi: int) -> None:
        if self._at_bottom:
            self.scroll.verticalScrollBar().setValue(hi)

    # --- generation ------------------------------------------------------------------
    def send(self, text: str | None = None) -> bool:
        """Send ``text`` (default: the input box). False if nothing was sent; without a
        chat model the text stays where it is and the banner offers to load one."""
        from_box = text is None
        text = self.input.toPlainText() if from_box else text  # kept exactly, indent and all
        if not text.strip() or self.generating:
            return False
        if not self.model_name:
            if not from_box and not self.input.toPlainText().strip():
                self.input.setPlainText(text)
            self.banner.show_error("No chat model is loaded: your message is still in the box.",
                                   [("Load SmolLM2…", self.load_requested.emit)])
            return False
        if self._editing is not None:
            msg_id, _draft = self._editing
            self._editing = None
            if not self._ok(self.store.delete_from, self.conv_id, msg_id, what="the edit"):
                self._editing = (msg_id, _draft)
                return False
            self._show_messages(self._safe(self.store.messages, self.conv_id) or [])
        # A prompt typed before the first chat exists is the one that chat starts with.
        if self.conv_id is None \
                and self.new_conversation(self.system_prompt.toPlainText()) is None:
            return False
        conv = self._safe(self.store.get, self.conv_id)
        if conv is not None and conv.title == NEW_TITLE:
            title = " ".join(text.split())
            self._ok(self.store.rename, self.conv_id, title[:TITLE_CHARS]
                       + ("…" if len(title) > TITLE_CHARS else ""))
        view = self._append_view(MessageView("user", text))
        self._persist(PendingWrite(self.conv_id, "user", text, view=view))
        if from_box:
            self.input.clear()
        self.refresh_list()
        self._start()
        return True

    def _history(self) -> list[dict]:
        """The messages the model sees: this chat's prompt and what the window shows."""
        system = self.system_prompt.toPlainText()
        messages = [{"role": "system", "content": system}] if system.strip() else []
        return messages + [{"role": v.role, "content": v.text} for v in self.views()
                           if v.text]

    def _start(self, continue_reply: MessageView | None = None) -> None:
        sampling, max_tokens = self.sampling.sampling_params()
        messages = self._history()
        self.generating = True
        self._measure_timer.stop()
        self._reply, self._dirty = None, False
        self._reply_conv = self.conv_id
        self._base, self._base_stats = "", {}
        self._n_prompt = self._n_gen = 0
        if continue_reply is not None:  # the reply grows in place: same row, same view
            self._base, self._base_stats = continue_reply.text, dict(continue_reply.stats)
            self._reply = PendingWrite(self.conv_id, "assistant", continue_reply.text,
                                       continue_reply.stats, continue_reply.msg_id,
                                       continue_reply)
        if not self.pending:
            self.banner.hide()
        self.request_reply(GenerateRequest(
            messages, max_tokens, sampling, self.profile, context_limit=self.context_limit(),
            policy=self.policy(), continue_final=continue_reply is not None))
        self._pacer.restart()
        self._render_timer.start()
        self._update_buttons()
        self.generation_started.emit()

    def request_reply(self, req: GenerateRequest) -> None:
        """Queue the reply job; its plan, tokens and end come back to this pane."""
        from inference.context import Fitted
        from inference.events import TokenEvent

        def progress(payload: object) -> None:
            if isinstance(payload, TokenEvent):
                self._on_token(payload)
            elif isinstance(payload, Fitted):
                self._on_planned(payload)

        job = self.jobs.submit("generate", worker.generate, req)
        job.progress.connect(progress)
        job.result.connect(lambda done: self._end_without_reply() if done is None
                           else self._on_done(done))
        job.error.connect(self._end_without_reply)
        job.cancelled.connect(self._end_without_reply)

    def continue_reply(self) -> bool:
        """Write more of a reply that stopped at its token limit (finish reason "length")."""
        views = self.views()
        if self.generating or not self.model_name or not views \
                or views[-1].role != "assistant" or not views[-1].text:
            return False
        self._start(continue_reply=views[-1])
        return True

    def stop(self) -> None:
        """Stop the running generation; the engine ends it within one token."""
        if self.generating:
            self.jobs.cancel("generate")

    def regenerate(self) -> None:
        """A new version of the last reply; the earlier versions stay (‹ 1/2 ›)."""
        msgs = self._current_messages()
        if self.generating or not msgs:
            return
        if msgs[-1].role == "assistant":
            users = [m for m in msgs if m.role == "user"]
            after = users[-1].id if users else 0
            if not self._ok(self.store.choose_version, self.conv_id, after, None,
                            what="the regenerate"):
                return
            self._show_messages(self._current_messages())
        if self.views():
            self._start()

    def _last_user_id(self) -> int:
        users = [v.msg_id for v in self.views() if v.role == "user" and v.msg_id is not None]
        return users[-1] if users else 0

    def _update_versions(self) -> None:
        views = self.views()
        if not views or views[-1].role != "assistant" or views[-1].msg_id is None \
                or self.conv_id is None:
            return
        ids = self._safe(self.store.versions, self.conv_id, self._last_user_id()) or []
        if views[-1].msg_id in ids:
            views[-1].set_versions(ids.index(views[-1].msg_id) + 1, len(ids))

    def _step_version(self, step: int) -> None:
        views = self.views()
        if self.generating or not views or views[-1].msg_id is None:
            return
        after = self._last_user_id()
        ids = self._safe(self.store.versions, self.conv_id, after) or []
        if views[-1].msg_id not in ids:
            return
        i = ids.index(views[-1].msg_id) + step
        if 0 <= i < len(ids):
            self._ok(self.store.choose_version, self.conv_id, after, ids[i])
            self._show_messages(self._current_messages())

    def edit_last(self) -> None:
        """Put the last user message in the box for editing. Nothing is removed until the
        edited text is sent; Esc (or :meth:`cancel_edit`) puts the draft back."""
        if self.generating or self._editing is not None:
            return
        users = [v for v in self.views() if v.role == "user" and v.msg_id is not None]
        if not users:
            return
        last = users[-1]
        self._editing = (last.msg_id, self.input.toPlainText())
        self.input.setPlainText(last.text)
        self.input.setFocus()
        self.banner.show_error("Editing your last message: sending replaces it and the "
                               "replies after it; Esc cancels.", [("Cancel edit",
                                                                   self.cancel_edit)])
        self._update_buttons()

    def cancel_edit(self) -> None:
        if self._editing is None:
            return
        _msg_id, draft = self._editing
        self._editing = None
        self.input.setPlainText(draft)
        self.banner.hide()
        self._show_pending()
        self._update_buttons()

    def _current_messages(self) -> list[Message]:
        return (self._safe(self.store.messages, self.conv_id) or []) \
            if self.conv_id is not None else []

    def _ensure_reply(self) -> None:
        """The reply's view, then its row, exist from its first token on (a kill keeps it)."""
        if self._reply is None:
            view = self._append_view(MessageView("assistant")) \
                if self._reply_conv == self.conv_id else None
            self._reply = PendingWrite(self._reply_conv, "assistant", "", view=view)
            self._persist(self._reply)

    def _on_planned(self, fitted: object) -> None:
        if not self.generating:
            return
        self._n_prompt = fitted.n_prompt or 0
        self._show_note(fitted.note())
        self._show_used(self._n_prompt, fitted.limit)

    def show_waiting(self, text: str) -> None:
        """Say what the reply waits for before its first token ("": nothing now)."""
        waiting = bool(text) and self.generating and self._n_gen == 0
        self.wait_label.setText(text if waiting else "")
        self.wait_label.setVisible(waiting)

    def _on_token(self, ev: object) -> None:
        if not self.generating:
            return
        if self.wait_label.isVisible():
            self.show_waiting("")
        self._ensure_reply()
        self._reply.content += ev.text
        self._n_gen = ev.index + 1
        self._dirty = True

    def _render_reply(self, final: bool = False) -> None:
        """View first, then the database (a failed write never holds the view back). While
        streaming, at the pacer's rate; ``final``: now (the stream has ended)."""
        r = self._reply
        if not self._dirty or r is None or not (final or self._pacer.due()):
            return
        self._dirty = False
        if r.view is not None:
            r.view.set_text(r.content)
        self._show_used(self._n_prompt + self._n_gen)  # live, at the render rate
        if r not in self.pending and not self.pending:
            self._persist(r)

    def _on_done(self, done: object) -> None:
        if not self.generating:
            return
        try:
            self._render_timer.stop()
            base = self._base_stats
            stats = {
                "n_prompt": done.n_prompt,
                "n_generated": done.n_generated + base.get("n_generated", 0),
                "ttft_s": done.ttft_s, "prefill_tok_s": prefill_of(done).tok_s,
                "decode_tok_s": done.decode_tok_s,
                "total_s": done.total_s + base.get("total_s", 0.0),
                "finish_reason": done.finish_reason, "model": self.model_name,
                "n_cached": done.n_cached,
            }
            if done.text or done.n_generated:
                self._ensure_reply()
            r = self._reply
            if done.finish_reason == "interrupted":
                self.banner.show_error(
                    "The connection to the remote engine was lost mid-reply: the partial "
                    "answer is kept." if r is not None else
                    "The connection to the remote engine was lost before the reply began.")
            if r is not None:
                r.content, r.stats, self._dirty = self._base + done.text, stats, False
                if r.view is not None:
                    r.view.set_text(r.content)
                    r.view.set_stats(stats)
                if r in self.pending:
                    self.retry_pending()  # one more try now the reply is complete
                else:
                    self._persist(r)
        finally:
            self.generating = False
            self.show_waiting("")
            if self._n_prompt or done.n_prompt:
                self._show_used(done.n_prompt + done.n_generated)
            self._update_versions()
            self._update_buttons()
            self.generation_finished.emit(done)

    def _end_without_reply(self, *_: object) -> None:
        if self.generating:
            try:
                self._render_timer.stop()
                self._render_reply(final=True)
            finally:
                self.generating = False
                self.show_waiting("")
                self._update_buttons()
                self.generation_finished.emit(None)

    def _update_buttons(self) -> None:
        has_msgs = bool(self.views())
        self.send_button.setEnabled(not self.generating)
        self.stop_button.setEnabled(self.generating)
        self.regen_button.setEnabled(not self.generating and has_msgs)
        views = self.views()
        self.continue_button.setVisible(
            not self.generating and bool(views) and views[-1].role == "assistant"
            and views[-1].stats.get("finish_reason") == "length" and not self.remote)
        self.edit_button.setEnabled(not self.generating and has_msgs and self._editing is None)
        self.export_button.setEnabled(self.conv_id is not None)
        self.delete_button.setEnabled(self.conv_id is not None)

    def set_context_length(self, n: int | None) -> None:
        """The loaded model's context (None: no chat model)."""
        self.context_length = n
        self._update_context()
        self._measure_timer.start()

    def context_limit(self) -> int | None:
        """Tokens this chat may use: the context set in Models, within the model's own."""
        if not self.context_length:
            return None
        return min(self.context_length, self.settings.context())

    def default_policy(self) -> str:
        policy = self.settings.get("chat/context_policy", DEFAULT_POLICY, str)
        return policy if policy in POLICIES else DEFAULT_POLICY

    def policy(self) -> str:
        return self.policy_combo.currentData() or DEFAULT_POLICY

    def _on_policy_changed(self, *_: object) -> None:
        if self.conv_id is not None:
            self._ok(self.store.set_context_policy, self.conv_id, self.policy(),
                     what="the context policy")
        self._show_note("")  # said of the policy before; the new count replaces it
        self._measure_timer.start()

    def _show_note(self, note: str) -> None:
        self.fit_note.setText(note)
        self.fit_note.setVisible(bool(note))

    def _measure(self) -> None:
        """Ask the worker how many tokens the chat plus the draft would send now."""
        if self.generating or not self.model_name or not self.context_length:
            return
        messages = self._history()
        draft = self.input.toPlainText()
        if draft.strip():
            messages.append({"role": "user", "content": draft})
        if any(m["role"] != "system" for m in messages):
            self.jobs.submit("measure", worker.measure, messages, int(self.context_limit() or 0),
                             self.policy(), quiet=True).result.connect(self._on_measured)
        else:
            self._show_used(0)

    def _on_measured(self, got: worker.Measured | None) -> None:
        """The count of the chat plus the draft, under the chat's policy: what it would
        leave out, or (Stop at limit) the refusal a send would get."""
        if got is not None and not self.generating:
            used, limit, note = got.used, got.limit, got.note
            self._show_used(used, limit or None)
            self._show_note(note)

    def _update_context(self) -> None:
        """Until the worker has counted: the last reply's prompt plus reply, if any."""
        last = next((v.stats for v in reversed(self.views())
                     if v.role == "assistant" and v.stats), None)
        self._show_used((last.get("n_prompt", 0) + last.get("n_generated", 0)) if last else 0)

    def _show_used(self, used: int, limit: int | None = None) -> None:
        """'1.2K / 4.1K tokens': what the chat sends against the context it may use."""
        from gui.format import human_count

        limit = limit or self.context_limit()
        if not limit and self.remote and self.model_name:  # known only to the server
            self.context_label.setText(
                f"{human_count(used)} tokens · context unknown" if used else "context unknown")
            self.context_label.setStyleSheet("")
            return
        if not limit:
            self.context_label.setText("")
            return
        self.context_label.setText(
            f"{human_count(used) if used else '0'} / {human_count(limit)} tokens")
        if used >= limit:  # this chat cannot be sent whole
            self.context_label.setStyleSheet(f"color: {OVER_COLOR}; font-weight: bold;")
            self.context_label.setToolTip("More tokens than this chat's context holds: "
                                          "the panel under the context policy says what "
                                          "happens")
        else:
            near = used >= limit * 0.9
            self.context_label.setStyleSheet(f"color: {NEAR_COLOR};" if near else "")
            self.context_label.setToolTip("Tokens this chat sends the model, against the "
                                          "context it may use")

    def set_model(self, name: str, remote: bool = False) -> None:
        """The loaded chat model ('' none); ``remote``: an engine on a server, which takes
        only the OpenAI API's sampling fields and counts tokens itself."""
        self.model_name, self.remote = name, bool(name) and remote
        self.sampling.set_remote(self.remote)
        self._update_buttons()
        if not name:
            self.context_length = None
            self.context_label.setText("")
        self.model_label.setText(f"Model: {name}" if name else "No chat model loaded")
        self._measure_timer.start()
        if name and self.banner.actions.keys() == {"Load SmolLM2…"}:
            self.banner.hide()

    # --- export ----------------------------------------------------------------------
    def export(self, path: str | Path) -> Path:
        """Write the open conversation to ``path`` (.json -> JSON, anything else Markdown)."""
        path = Path(path)
        if self.conv_id is None:
            raise ValueError("no conversation open")
        text = self.store.export_json(self.conv_id) if path.suffix == ".json" \
            else self.store.export_markdown(self.conv_id)
        return write_atomic(path, text)

    def _export_dialog(self, fmt: str) -> None:
        conv = self._safe(self.store.get, self.conv_id) if self.conv_id is not None else None
        if conv is None:
            return
        stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip()
        filt = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation",
                                              f"{stem or 'conversation'}.{fmt}", filt)
        if path:
            try:
                self.export(path)
            except (OSError, StorageError) as exc:
                self.banner.show_error(f"Could not export to {path}: {exc}.")
