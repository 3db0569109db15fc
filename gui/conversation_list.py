"""The chat tab's left column: New chat, a search box, the conversations (newest first,
renamed in place with F2 or a double-click) and Delete. It shows what it is given and says
what the user did; the chat pane reads and writes the store."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from gui.theme import icon


class ConversationList(QWidget):
    picked = Signal(int)  # conversation id
    renamed = Signal(int, str)  # conversation id, the new title (blanks folded)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lv = QVBoxLayout(self)
        lv.setContentsMargins(0, 0, 0, 0)
        self.new_button = QPushButton(icon("new-chat"), "New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda t: self.search_changed.emit(t.strip()))
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setEditTriggers(QListWidget.EditTrigger.EditKeyPressed
                                  | QListWidget.EditTrigger.DoubleClicked)
        self.list.currentItemChanged.connect(self._on_pick)
        self.list.itemChanged.connect(self._on_renamed)
        self.delete_button = QPushButton(icon("trash"), "Delete")
        self.delete_button.setToolTip("Delete this chat (Ctrl+Z undoes it)")
        lv.addWidget(self.new_button)
        lv.addWidget(self.search)
        lv.addWidget(self.list, 1)
        lv.addWidget(self.delete_button)

    def query(self) -> str:
        """The search text ("" lists every chat)."""
        return self.search.text().strip()

    def show_conversations(self, convs: list[Any], current: int | None) -> None:
        """List ``convs`` (store Conversation rows), ``current`` selected, silently."""
        self.list.blockSignals(True)
        self.list.clear()
        for conv in convs:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.updated))
            item.setToolTip(f"{conv.title}\n{when} (F2 or double-click renames)")
            self.list.addItem(item)
            if conv.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def _on_pick(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is not None:
            self.picked.emit(int(item.data(Qt.ItemDataRole.UserRole)))

    def _on_renamed(self, item: QListWidgetItem) -> None:
        title = " ".join(item.text().split())
        if title:
            self.renamed.emit(int(item.data(Qt.ItemDataRole.UserRole)), title)
