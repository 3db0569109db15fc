"""The chat's messages on their way to the database, without widgets: each message the
window shows is written (inserted, then updated as a reply streams or is edited or
regenerated); a write that fails (lock, full disk) stays in memory, in order, until a
retry succeeds, so nothing typed or generated is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gui.conversations import ConversationStore, StorageError


@dataclass
class PendingWrite:
    """A message the window shows that the database does not hold (yet)."""
    conv_id: int
    role: str
    content: str
    stats: dict | None = None
    msg_id: int | None = None  # None: its row was never inserted
    view: Any = None  # what shows it: its ``msg_id`` follows the row's once inserted

    def describe(self) -> str:
        who = "your message" if self.role == "user" else "the reply"
        return f"{who} ({len(self.content):,} characters)"


class ReplyStore:
    """Writes messages in order; ``pending``: those not saved yet (oldest first).
    ``on_failure(exc)`` hears of each failed write (the pane shows what is unsaved)."""

    def __init__(self, store: ConversationStore,
                 on_failure: Callable[[StorageError], None] = lambda _e: None):
        self.store = store
        self.on_failure = on_failure
        self.pending: list[PendingWrite] = []
        self.last_error = ""

    def persist(self, pw: PendingWrite) -> bool:
        """Write one message (insert or update). On failure it joins :attr:`pending`;
        while anything is pending, later writes queue behind it to keep their order."""
        if pw in self.pending:
            return False
        if self.pending:
            self.pending.append(pw)
            self.on_failure(StorageError(self.last_error))
            return False
        try:
            self._write(pw)
            return True
        except StorageError as exc:
            self.pending.append(pw)
            self._failed(exc)
            return False

    def retry(self) -> bool:
        """Write what is pending, in order; True when nothing is left unsaved."""
        while self.pending:
            try:
                self._write(self.pending[0])
            except StorageError as exc:
                self._failed(exc)
                return False
            self.pending.pop(0)
        return True

    def unsaved(self) -> str:
        """What is pending, for a sentence: "your message (12 characters), the reply …"."""
        return ", ".join(pw.describe() for pw in self.pending)

    def _failed(self, exc: StorageError) -> None:
        self.last_error = str(exc)
        self.on_failure(exc)

    def _write(self, pw: PendingWrite) -> None:
        if pw.msg_id is None:
            pw.msg_id = self.store.add_message(pw.conv_id, pw.role, pw.content, pw.stats)
            if pw.view is not None:
                pw.view.msg_id = pw.msg_id
        else:
            self.store.update_message(pw.msg_id, pw.content, pw.stats)
