"""An in-window message (not a modal dialog: the app keeps working behind it), with
optional action buttons such as Retry or Save as…."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget


class ErrorBanner(QFrame):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("ErrorBanner")
        self._layout = QHBoxLayout(self)
        self._layout.setContentsMargins(10, 4, 4, 4)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setMinimumWidth(120)
        self.actions: dict[str, QPushButton] = {}
        self.close_button = QPushButton("Dismiss")
        self.close_button.clicked.connect(self.hide)
        self._layout.addWidget(self.label, 1)
        self._layout.addWidget(self.close_button)
        self.hide()

    def show_error(self, message: str,
                   actions: Sequence[tuple[str, Callable[[], object]]] = (),
                   persistent: bool = False) -> None:
        """Show ``message`` with one button per (text, callback); replaces earlier ones.
        ``persistent``: a condition that still holds, so no Dismiss button."""
        self.close_button.setVisible(not persistent)
        for b in self.actions.values():
            self._layout.removeWidget(b)
            b.deleteLater()
        self.actions = {}
        for text, callback in actions:
            b = QPushButton(text)
            b.clicked.connect(lambda _=False, cb=callback: cb())
            self._layout.insertWidget(self._layout.count() - 1, b)
            self.actions[text] = b
        self.label.setText(message)
        self.show()

    def text(self) -> str:
        return self.label.text()
