"""Chat: conversations list, streamed Markdown replies, system prompt and sampling.

Tokens arrive as queued signals; the reply is re-rendered and saved at most every
RENDER_MS, not per token, so a fast model cannot flood the event loop with layouts.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gui.conversations import ConversationStore, Message
from gui.message_view import MessageView
from gui.sampling_panel import SamplingPanel
from gui.settings import DEFAULT_SYSTEM_PROMPT, Settings
from gui.theme import icon
from gui.worker import GenerateRequest, WorkerHandle

RENDER_MS = 50
TITLE_CHARS = 48


class ChatPane(QWidget):
    generation_started = Signal()
    generation_finished = Signal(object)  # DoneEvent, or None after a failure

    def __init__(self, handle: WorkerHandle, store: ConversationStore, settings: Settings,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.handle, self.store, self.settings = handle, store, settings
        self.conv_id: int | None = None
        self.model_name = ""
        self.profile = False
        self.generating = False
        self._reply: MessageView | None = None  # the streaming reply's view, if shown
        self._reply_id: int | None = None  # its row in the store
        self._reply_conv: int | None = None
        self._reply_text = ""
        self._dirty = False
        self._render_timer = QTimer(self, interval=RENDER_MS)
        self._render_timer.timeout.connect(self._render_reply)
        self._build()
        handle.token.connect(self._on_token)
        handle.generated.connect(self._on_done)
        handle.failed.connect(self._on_failed)
        self.refresh_list()
        convs = store.conversations()
        if convs:
            self.open_conversation(convs[0].id)
        self._update_buttons()

    # --- layout ----------------------------------------------------------------------
    def _build(self) -> None:
        split = QSplitter(Qt.Orientation.Horizontal, self)
        outer = QHBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.addWidget(split)

        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        self.new_button = QPushButton(icon("new-chat"), "New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_conversation)
        self.conv_list = QListWidget()
        self.conv_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conv_list.currentItemChanged.connect(self._on_pick)
        self.delete_button = QPushButton(icon("trash"), "Delete")
        self.delete_button.clicked.connect(self.delete_conversation)
        lv.addWidget(self.new_button)
        lv.addWidget(self.conv_list, 1)
        lv.addWidget(self.delete_button)

        middle = QWidget()
        mv = QVBoxLayout(middle)
        mv.setContentsMargins(0, 0, 0, 0)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.messages_box = QWidget()
        self.messages_layout = QVBoxLayout(self.messages_box)
        self.messages_layout.setSpacing(8)
        self.messages_layout.addStretch(1)
        self.scroll.setWidget(self.messages_box)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._follow)
        self._at_bottom = True
        bar.valueChanged.connect(
            lambda v: setattr(self, "_at_bottom", v >= bar.maximum() - 4))
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message the model… (Ctrl+Enter sends, Esc stops)")
        self.input.setMaximumHeight(110)
        buttons = QHBoxLayout()
        self.send_button = QPushButton(icon("send"), "Send")
        self.send_button.setObjectName("Primary")
        self.send_button.setToolTip("Send (Ctrl+Enter)")
        self.send_button.clicked.connect(lambda: self.send())
        self.stop_button = QPushButton(icon("stop"), "Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(self.stop)
        self.regen_button = QPushButton(icon("regenerate"), "Regenerate")
        self.regen_button.clicked.connect(self.regenerate)
        self.edit_button = QPushButton(icon("edit"), "Edit last")
        self.edit_button.setToolTip("Move your last message back into the input box")
        self.edit_button.clicked.connect(self.edit_last)
        self.export_button = QPushButton(icon("export"), "Export")
        menu = QMenu(self.export_button)
        menu.addAction("Markdown…", lambda: self._export_dialog("md"))
        menu.addAction("JSON…", lambda: self._export_dialog("json"))
        self.export_button.setMenu(menu)
        self.model_label = QLabel("No chat model loaded")
        self.model_label.setObjectName("Hint")
        for b in (self.send_button, self.stop_button, self.regen_button, self.edit_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.model_label)
        buttons.addWidget(self.export_button)
        mv.addWidget(self.scroll, 1)
        mv.addWidget(self.input)
        mv.addLayout(buttons)

        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
        sys_box = QGroupBox("System prompt")
        sv = QVBoxLayout(sys_box)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setMaximumHeight(120)
        self.system_prompt.textChanged.connect(self._save_system_prompt)
        sv.addWidget(self.system_prompt)
        samp_box = QGroupBox("Sampling")
        sb = QVBoxLayout(samp_box)
        self.sampling = SamplingPanel(self.settings.sampling())
        self.sampling.changed.connect(self.settings.set_sampling)
        sb.addWidget(self.sampling)
        rv.addWidget(sys_box)
        rv.addWidget(samp_box)
        rv.addStretch(1)

        split.addWidget(left)
        split.addWidget(middle)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([180, 640, 240])

    # --- conversations ---------------------------------------------------------------
    def refresh_list(self) -> None:
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        for conv in self.store.conversations():
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setToolTip(conv.title)
            self.conv_list.addItem(item)
            if conv.id == self.conv_id:
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def new_conversation(self) -> int:
        if self.generating:
            self.stop()
        prompt = self.settings.get("chat/system_prompt", DEFAULT_SYSTEM_PROMPT, str)
        conv_id = self.store.create("New chat", prompt)
        self.open_conversation(conv_id)
        self.input.setFocus()
        return conv_id

    def open_conversation(self, conv_id: int) -> None:
        conv = self.store.get(conv_id)
        if conv is None:
            return
        if self.generating and conv_id != self.conv_id:
            self.stop()
        self.conv_id = conv_id
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(conv.system_prompt)
        self.system_prompt.blockSignals(False)
        self._show_messages(self.store.messages(conv_id))
        self.refresh_list()
        self._update_buttons()

    def delete_conversation(self) -> None:
        if self.conv_id is None:
            return
        if self.generating:
            self.stop()
        self.store.delete(self.conv_id)
        self.conv_id = None
        self._show_messages([])
        convs = self.store.conversations()
        if convs:
            self.open_conversation(convs[0].id)
        else:
            self.refresh_list()
        self._update_buttons()

    def _on_pick(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is not None:
            self.open_conversation(int(item.data(Qt.ItemDataRole.UserRole)))

    def _save_system_prompt(self) -> None:
        text = self.system_prompt.toPlainText()
        self.settings.set("chat/system_prompt", text)
        if self.conv_id is not None:
            self.store.set_system_prompt(self.conv_id, text)

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
        self._reply = None
        for m in messages:
            self._append_view(MessageView(m.role, m.content, m.stats, m.id))

    def _append_view(self, view: MessageView) -> MessageView:
        self.messages_layout.insertWidget(self.messages_layout.count() - 1, view)
        self._at_bottom = True
        return view

    def _follow(self, _lo: int, hi: int) -> None:
        if self._at_bottom:
            self.scroll.verticalScrollBar().setValue(hi)

    # --- generation ------------------------------------------------------------------
    def send(self, text: str | None = None) -> bool:
        """Send ``text`` (default: the input box). False if nothing was sent."""
        text = (self.input.toPlainText() if text is None else text).strip()
        if not text or self.generating:
            return False
        if self.conv_id is None:
            self.new_conversation()
        conv = self.store.get(self.conv_id)
        if conv is not None and conv.title == "New chat":
            title = " ".join(text.split())
            self.store.rename(self.conv_id, title[:TITLE_CHARS] + ("…" if len(title) >
                                                                   TITLE_CHARS else ""))
        msg_id = self.store.add_message(self.conv_id, "user", text)
        self._append_view(MessageView("user", text, msg_id=msg_id))
        self.input.clear()
        self.refresh_list()
        self._start()
        return True

    def _start(self) -> None:
        conv = self.store.get(self.conv_id)
        messages = [{"role": "system", "content": conv.system_prompt}] \
            if conv and conv.system_prompt.strip() else []
        messages += [{"role": m.role, "content": m.content}
                     for m in self.store.messages(self.conv_id)]
        sampling, max_tokens = self.sampling.sampling_params()
        self.generating = True
        self._reply, self._reply_id, self._reply_text, self._dirty = None, None, "", False
        self._reply_conv = self.conv_id
        self.handle.generate(GenerateRequest(messages, max_tokens, sampling, self.profile))
        self._render_timer.start()
        self._update_buttons()
        self.generation_started.emit()

    def stop(self) -> None:
        """Stop the running generation; the engine ends it within one token."""
        if self.generating:
            self.handle.cancel("generate")

    def regenerate(self) -> None:
        msgs = self._current_messages()
        if self.generating or not msgs:
            return
        if msgs[-1].role == "assistant":
            self.store.delete_from(self.conv_id, msgs[-1].id)
            self._show_messages(self.store.messages(self.conv_id))
        if self.store.messages(self.conv_id):
            self._start()

    def edit_last(self) -> None:
        """Put the last user message back into the input and drop it and its reply."""
        msgs = self._current_messages()
        users = [m for m in msgs if m.role == "user"]
        if self.generating or not users:
            return
        last = users[-1]
        self.store.delete_from(self.conv_id, last.id)
        self._show_messages(self.store.messages(self.conv_id))
        self.input.setPlainText(last.content)
        self.input.setFocus()
        self._update_buttons()

    def _current_messages(self) -> list[Message]:
        return self.store.messages(self.conv_id) if self.conv_id is not None else []

    def _ensure_reply(self) -> None:
        """The reply's row exists from its first token on (so a kill keeps it)."""
        if self._reply_id is None:
            self._reply_id = self.store.add_message(self._reply_conv, "assistant", "")
            if self._reply_conv == self.conv_id:
                self._reply = self._append_view(MessageView("assistant", msg_id=self._reply_id))

    def _on_token(self, ev: object) -> None:
        if not self.generating:
            return
        self._ensure_reply()
        self._reply_text += ev.text
        self._dirty = True

    def _render_reply(self) -> None:
        if self._dirty and self._reply_id is not None:
            self.store.update_message(self._reply_id, self._reply_text)
            if self._reply is not None:
                self._reply.set_text(self._reply_text)
            self._dirty = False

    def _on_done(self, done: object) -> None:
        if not self.generating:
            return
        self._render_timer.stop()
        stats = {
            "n_prompt": done.n_prompt, "n_generated": done.n_generated,
            "ttft_s": done.ttft_s, "prefill_tok_s": done.prefill_tok_s,
            "decode_tok_s": done.decode_tok_s, "total_s": done.total_s,
            "finish_reason": done.finish_reason, "model": self.model_name,
        }
        if done.text or done.n_generated:
            self._ensure_reply()
        if self._reply_id is not None:
            self.store.update_message(self._reply_id, done.text, stats)
        if self._reply is not None:
            self._reply.set_text(done.text)
            self._reply.set_stats(stats)
        self.generating = False
        self._update_buttons()
        self.generation_finished.emit(done)

    def _on_failed(self, kind: str, _message: str) -> None:
        if kind == "generate" and self.generating:
            self._render_timer.stop()
            self._render_reply()
            self.generating = False
            self._update_buttons()
            self.generation_finished.emit(None)

    def _update_buttons(self) -> None:
        has_msgs = bool(self._current_messages())
        self.send_button.setEnabled(not self.generating)
        self.stop_button.setEnabled(self.generating)
        self.regen_button.setEnabled(not self.generating and has_msgs)
        self.edit_button.setEnabled(not self.generating and has_msgs)
        self.export_button.setEnabled(self.conv_id is not None)
        self.delete_button.setEnabled(self.conv_id is not None)

    def set_model(self, name: str) -> None:
        self.model_name = name
        self.model_label.setText(f"Model: {name}" if name else "No chat model loaded")

    # --- export ----------------------------------------------------------------------
    def export(self, path: str | Path) -> Path:
        """Write the open conversation to ``path`` (.json -> JSON, anything else Markdown)."""
        path = Path(path)
        if self.conv_id is None:
            raise ValueError("no conversation open")
        text = self.store.export_json(self.conv_id) if path.suffix == ".json" \
            else self.store.export_markdown(self.conv_id)
        path.write_text(text, encoding="utf-8")
        return path

    def _export_dialog(self, fmt: str) -> None:
        conv = self.store.get(self.conv_id) if self.conv_id is not None else None
        if conv is None:
            return
        stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip()
        filt = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation",
                                              f"{stem or 'conversation'}.{fmt}", filt)
        if path:
            self.export(path)
