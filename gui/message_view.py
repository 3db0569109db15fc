"""One chat message: role, Markdown body, and a stats line for assistant replies."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from gui.format import message_stats


class MessageView(QFrame):
    def __init__(self, role: str, text: str = "", stats: dict | None = None,
                 msg_id: int | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.msg_id = msg_id
        self.text = ""
        self.setObjectName("UserMessage" if role == "user" else "AssistantMessage")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        self.role_label = QLabel("You" if role == "user" else "Assistant")
        self.role_label.setObjectName("Role")
        self.body = QLabel()
        self.body.setTextFormat(Qt.TextFormat.MarkdownText)
        self.body.setWordWrap(True)
        self.body.setOpenExternalLinks(True)
        self.body.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("Stats")
        self.stats_label.setVisible(False)
        layout.addWidget(self.role_label)
        layout.addWidget(self.body)
        layout.addWidget(self.stats_label)
        self.set_text(text)
        self.set_stats(stats or {})

    def set_text(self, text: str) -> None:
        self.text = text
        self.body.setText(text if text else "…")

    def set_stats(self, stats: dict) -> None:
        line = message_stats(stats)
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))
