"""Conversations kept in SQLite in the user data directory.

Every message is written when it is shown (and a streaming reply is rewritten as it grows),
so killing the app loses nothing already on screen. WAL with synchronous=NORMAL makes each
commit a plain write() into the OS page cache: durable against a process kill, and cheap
enough (well under a millisecond) to run on the GUI thread.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass
class Message:
    id: int
    role: str  # "user" | "assistant"
    content: str
    stats: dict = field(default_factory=dict)


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str
    updated: float


def default_db_path() -> Path:
    """``<AppDataLocation>/conversations.sqlite3`` (e.g. ~/.local/share/Inferdesk/Inferdesk)."""
    from PySide6.QtCore import QStandardPaths

    base = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    return base / "conversations.sqlite3"


class ConversationStore:
    """All reads and writes happen on the GUI thread, one short transaction each."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)  # autocommit
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    # --- conversations ---------------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations (title, system_prompt, created, updated)"
            " VALUES (?, ?, ?, ?)", (title, system_prompt, now, now))
        return int(cur.lastrowid)

    def conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        rows = self._db.execute(
            "SELECT id, title, system_prompt, updated FROM conversations"
            " ORDER BY updated DESC, id DESC").fetchall()
        return [Conversation(*row) for row in rows]

    def get(self, conv_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT id, title, system_prompt, updated FROM conversations WHERE id = ?",
            (conv_id,)).fetchone()
        return Conversation(*row) if row else None

    def rename(self, conv_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._db.execute(
            "UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conv_id))

    def delete(self, conv_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    # --- messages --------------------------------------------------------------------
    def messages(self, conv_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, role, content, stats FROM messages WHERE conversation_id = ?"
            " ORDER BY id", (conv_id,)).fetchall()
        return [Message(i, role, content, json.loads(stats or "{}"))
                for i, role, content, stats in rows]

    def add_message(self, conv_id: int, role: str, content: str, stats: dict | None = None) -> int:
        now = time.time()
        with self._db:
            cur = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, stats, created)"
                " VALUES (?, ?, ?, ?, ?)", (conv_id, role, content, json.dumps(stats or {}), now))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conv_id))
        return int(cur.lastrowid)

    def update_message(self, msg_id: int, content: str, stats: dict | None = None) -> None:
        if stats is None:
            self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, msg_id))
        else:
            self._db.execute("UPDATE messages SET content = ?, stats = ? WHERE id = ?",
                             (content, json.dumps(stats), msg_id))

    def delete_from(self, conv_id: int, msg_id: int) -> None:
        """Delete message ``msg_id`` and every later one (regenerate, edit last message)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conv_id, msg_id))

    # --- export ----------------------------------------------------------------------
    def export_json(self, conv_id: int) -> str:
        conv = self.get(conv_id)
        if conv is None:
            raise KeyError(conv_id)
        doc = {
            "title": conv.title,
            "system_prompt": conv.system_prompt,
            "messages": [{"role": m.role, "content": m.content, "stats": m.stats}
                         for m in self.messages(conv_id)],
        }
        return json.dumps(doc, indent=2, ensure_ascii=False)

    def export_markdown(self, conv_id: int) -> str:
        from gui.format import message_stats

        conv = self.get(conv_id)
        if conv is None:
            raise KeyError(conv_id)
        out = [f"# {conv.title}", ""]
        if conv.system_prompt:
            out += ["**System:** " + conv.system_prompt, ""]
        for m in self.messages(conv_id):
            out += [f"## {m.role.capitalize()}", "", m.content, ""]
            if m.stats:
                out += [f"*{message_stats(m.stats)}*", ""]
        return "\n".join(out)
