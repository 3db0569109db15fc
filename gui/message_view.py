"""One chat message: role, body (exact text for the user, Markdown for the assistant),
a Copy button, version navigation for regenerated replies, and a stats line."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from gui.format import message_stats
from gui.render import COPY_SCHEME, assistant_html, code_blocks, user_html

READING_WIDTH = 820  # px: the message column stops growing here, for readable line lengths


class MessageView(QFrame):
    version_step = Signal(int)  # -1 / +1: show the previous / next version of this reply

    def __init__(self, role: str, text: str = "", stats: dict | None = None,
                 msg_id: int | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.msg_id = msg_id
        self.text = ""
        self.stats: dict = {}
        self.setObjectName("UserMessage" if role == "user" else "AssistantMessage")
        self.setMaximumWidth(READING_WIDTH)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        head = QHBoxLayout()
        self.role_label = QLabel("You" if role == "user" else "Assistant")
        self.role_label.setObjectName("Role")
        self.prev_button = QPushButton("‹")
        self.version_label = QLabel()
        self.next_button = QPushButton("›")
        for b, step in ((self.prev_button, -1), (self.next_button, 1)):
            b.setFlat(True)
            b.setFixedWidth(24)
            b.clicked.connect(lambda _=False, s=step: self.version_step.emit(s))
        self.copy_button = QPushButton("Copy")
        self.copy_button.setFlat(True)
        self.copy_button.setToolTip("Copy this message's text")
        self.copy_button.clicked.connect(lambda: self.copy(self.text))
        head.addWidget(self.role_label)
        head.addStretch(1)
        for w in (self.prev_button, self.version_label, self.next_button, self.copy_button):
            head.addWidget(w)
        self.body = QLabel()
        self.body.setTextFormat(Qt.TextFormat.RichText)
        self.body.setWordWrap(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.body.linkActivated.connect(self._on_link)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("Stats")
        self.stats_label.setWordWrap(True)
        self.stats_label.setVisible(False)
        layout.addLayout(head)
        layout.addWidget(self.body)
        layout.addWidget(self.stats_label)
        self.set_text(text)
        self.set_stats(stats or {})
        self.set_versions(1, 1)

    def set_text(self, text: str) -> None:
        self.text = text
        if not text:
            self.body.setText("…")
        elif self.role == "user":
            self.body.setText(user_html(text))
        else:
            self.body.setText(assistant_html(text))

    def set_stats(self, stats: dict) -> None:
        self.stats = stats
        line = message_stats(stats)
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def set_versions(self, index: int, count: int) -> None:
        """Show ‹ index/count › when the reply has more than one version (1-based)."""
        many = count > 1
        for w in (self.prev_button, self.version_label, self.next_button):
            w.setVisible(many)
        self.version_label.setText(f"{index}/{count}")
        self.prev_button.setEnabled(index > 1)
        self.next_button.setEnabled(index < count)

    @staticmethod
    def copy(text: str) -> None:
        QGuiApplication.clipboard().setText(text)

    def _on_link(self, href: str) -> None:
        if href.startswith(COPY_SCHEME):
            blocks = code_blocks(self.text)
            i = int(href[len(COPY_SCHEME):])
            if 0 <= i < len(blocks):
                self.copy(blocks[i])
        else:
            QDesktopServices.openUrl(QUrl(href))
