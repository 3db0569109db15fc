"""Conversations kept in SQLite in the user data directory.

Every message is written when it is shown (and a streaming reply is rewritten as it grows),
so killing the app loses nothing already on screen. WAL with synchronous=NORMAL makes each
commit a plain write() into the OS page cache: durable against a process kill, and cheap.

Storage degrades, never breaks the app:
- a write that fails (another process holds the lock, the disk is full) raises
  :class:`StorageError` with one sentence after at most ``BUSY_MS``; the caller keeps the
  data in memory and offers Retry / Save as…;
- a damaged file is moved aside as ``conversations.corrupt-<date>.sqlite3``, the rows that
  can still be read are copied into a fresh database, and :attr:`notice` says so;
- a read-only data folder opens an in-memory copy (:attr:`read_only`): the app works, and
  :attr:`notice` says that nothing from this session is saved.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from inference import files

BUSY_MS = 200  # a locked database costs the GUI thread at most this per write
OPEN_TIMEOUT_S = 2.0  # opening (once, at start) may wait a little longer for a lock
SALVAGE_MISSES = 2000  # consecutive unreadable ids after which salvage stops probing

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    context_policy TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    active INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
CONV_COLS = "id, title, system_prompt, created, updated"
MSG_COLS = "id, conversation_id, role, content, stats, created, active"


@dataclass
class Salvaged:
    """Rows still readable in a damaged file, and how many each table said it held
    (None where even the count could not be read)."""
    conversations: list[tuple]
    messages: list[tuple]
    total_conversations: int | None = None
    total_messages: int | None = None


@dataclass
class Recovery:
    """What a recovery copied into the fresh database and what it could not (None:
    unknown, the damaged file no longer says how many rows it had)."""
    conversations: int
    messages: int
    lost_conversations: int | None
    lost_messages: int | None

    def describe(self) -> str:
        """One sentence with the counts, for the banner."""
        lost = [f"{n:,} {what}{'s' if n != 1 else ''}"
                for n, what in ((self.lost_conversations, "conversation"),
                                (self.lost_messages, "message")) if n]
        unknown = self.lost_conversations is None or self.lost_messages is None
        tail = (f" {' and '.join(lost)} could not be recovered." if lost
                else " Some rows may be missing: the damaged file no longer says how many "
                     "it had." if unknown else " Nothing was lost.")
        return (f"{self.conversations:,} conversations and {self.messages:,} messages were "
                f"recovered from it.{tail}")


def _conv_defaults(row: tuple, now: float) -> tuple:
    cid, title, system, created, updated = row
    return (cid, title if title is not None else "Recovered chat",
            system if system is not None else "", created if created is not None else now,
            updated if updated is not None else created if created is not None else now)


def _msg_defaults(row: tuple, now: float) -> tuple:
    mid, cid, role, content, stats, created, active = row
    return (mid, cid, role if role is not None else "user",
            content if content is not None else "", stats if stats is not None else "{}",
            created if created is not None else now, active if active is not None else 1)


def _fold_wal(path: Path) -> None:
    """Fold a moved-aside file's -wal into it and drop its -shm, so what is kept of it is one
    file; where the damage forbids that, the side files stay (the -wal may hold rows)."""
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.execute("PRAGMA journal_mode=DELETE")
        finally:
            db.close()
    except sqlite3.Error:
        return
    for suffix in ("-wal", "-shm"):
        side = Path(str(path) + suffix)
        if side.exists() and (suffix == "-shm" or side.stat().st_size == 0):
            side.unlink(missing_ok=True)


class StorageError(Exception):
    """A read or write of the conversations database failed; ``str()`` is one sentence."""


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


@dataclass
class DeletedConversation:
    """Everything needed to put a deleted conversation back (undo), ids included."""
    conv: tuple
    messages: list[tuple]
    context_policy: str = ""


def _create(db: sqlite3.Connection) -> None:
    """The schema, with the columns older databases lack added."""
    db.executescript(SCHEMA)
    cols = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    if "active" not in cols:  # databases written before reply versions existed
        db.execute("ALTER TABLE messages ADD COLUMN active INTEGER NOT NULL DEFAULT 1")
    cols = {row[1] for row in db.execute("PRAGMA table_info(conversations)")}
    if "context_policy" not in cols:  # written before per-chat context policies
        db.execute("ALTER TABLE conversations ADD COLUMN context_policy TEXT NOT NULL"
                   " DEFAULT ''")


def default_db_path() -> Path:
    """``<AppDataLocation>/conversations.sqlite3`` (e.g. ~/.local/share/Inferdesk/Inferdesk)."""
    from PySide6.QtCore import QStandardPaths

    base = Path(QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation))
    return base / "conversations.sqlite3"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[0].lower() + text[1:] if text else text


def _writable(path: Path) -> bool:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    if not os.access(path.parent, os.W_OK):
        return False
    return not path.exists() or os.access(path, os.W_OK)


class ConversationStore:
    """All reads and writes happen on the GUI thread, one short transaction each; a lock
    held elsewhere delays one of them at most ``BUSY_MS`` before it fails."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.read_only = False
        self.notice = ""  # one paragraph for the window when the store opened degraded
        self.moved_to: Path | None = None
        self.recovery: Recovery | None = None  # set when a damaged file was recovered
        if not _writable(self.path):
            self._open_memory_copy(
                f"The data folder {self.path.parent} is read-only: your conversations are "
                "shown, but nothing from this session will be saved (use Save as… to keep a "
                "chat elsewhere).")
            return
        try:
            self._db = self._open(self.path)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                self._recover(exc)
                return
            self._open_memory_copy(
                f"The conversations database is locked by another program ({_reason(exc)}): "
                "nothing from this session will be saved; close the other program and "
                "restart to save again.")
        except sqlite3.DatabaseError as exc:
            self._recover(exc)

    # --- opening ---------------------------------------------------------------------
    @staticmethod
    def _open(path: Path | str, uri: bool = False) -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout=OPEN_TIMEOUT_S, isolation_level=None, uri=uri)
        try:
            if str(path) != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                check = db.execute("PRAGMA quick_check").fetchone()[0]
                if check != "ok":
                    raise sqlite3.DatabaseError(f"the integrity check failed ({check})")
            db.execute("PRAGMA foreign_keys=ON")
            _create(db)
            db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        except BaseException:
            db.close()
            raise
        return db

    def _open_memory_copy(self, notice: str) -> None:
        """Read-only mode: the file's contents (if readable) in an in-memory database."""
        self.read_only, self.notice = True, notice
        self._db = sqlite3.connect(":memory:", isolation_level=None)
        if self.path.exists():
            try:
                src = sqlite3.connect(f"file:{self.path}?mode=ro&immutable=1", uri=True)
                src.backup(self._db)
                src.close()
            except sqlite3.Error as exc:
                self.notice += f" The existing conversations could not be read ({_reason(exc)})."
        self._db.execute("PRAGMA foreign_keys=ON")
        _create(self._db)

    def _recover(self, exc: BaseException) -> None:
        """Copy what can still be read into a fresh file beside the damaged one (row by
        row, in one transaction: a row the schema refuses is counted, not fatal), then move
        the damaged file aside and the fresh one into its place. Until that last step the
        damaged file stays where it was, so a start cut short recovers it again."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = self.path.with_name(f"{self.path.stem}.corrupt-{stamp}{self.path.suffix}")
        fresh = self.path.with_name(f"{self.path.name}.recovering")
        for suffix in ("", "-wal", "-shm"):  # what an earlier, interrupted recovery left
            Path(str(fresh) + suffix).unlink(missing_ok=True)
        found = salvage(self.path)
        self._db = self._open(fresh)
        self.recovery = self._copy_in(found)
        self._db.close()  # the last connection: its WAL is folded in and removed
        for suffix in ("", "-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            if side.exists():
                os.replace(side, Path(str(dest) + suffix))
        _fold_wal(dest)
        os.replace(fresh, self.path)
        self.moved_to = dest
        self._db = self._open(self.path)
        self.notice = (
            f"The conversations database was damaged ({_reason(exc)}) and has been moved to "
            f"{dest.name}; {self.recovery.describe()}")

    def _copy_in(self, found: Salvaged) -> Recovery:
        """Insert the salvaged rows, NULLs in NOT NULL columns replaced by defaults; a row
        still refused (a message whose chat is gone) is counted as lost."""
        now = time.time()

        def insert(table: str, cols: str, rows: list[tuple], fill) -> int:  # noqa: ANN001
            sql = f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(rows[0]))})" \
                if rows else ""
            copied = 0
            for row in rows:
                try:
                    self._db.execute(sql, fill(row, now))
                    copied += 1
                except sqlite3.IntegrityError:
                    pass
            return copied

        try:
            with self._db:
                convs = insert("conversations", CONV_COLS, found.conversations, _conv_defaults)
                msgs = insert("messages", MSG_COLS, found.messages, _msg_defaults)
        except sqlite3.Error:  # rolled back whole: nothing half-copied stays
            convs = msgs = 0

        def lost(total: int | None, rows: list[tuple], copied: int) -> int | None:
            if total is not None:
                return max(0, total - copied)
            return len(rows) - copied or None  # refused by the schema; unread ones unknown

        return Recovery(convs, msgs, lost(found.total_conversations, found.conversations, convs),
                        lost(found.total_messages, found.messages, msgs))

    def close(self) -> None:
        self._db.close()

    # --- guarded access --------------------------------------------------------------
    def _write(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.Error as exc:
            raise StorageError(f"Could not save to {self.path.name}: {_reason(exc)}.") from exc

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"Could not read {self.path.name}: {_reason(exc)}.") from exc

    # --- conversations ---------------------------------------------------------------
    def create(self, title: str = "New chat", system_prompt: str = "") -> int:
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations (title, system_prompt, created, updated)"
            " VALUES (?, ?, ?, ?)", (title, system_prompt, now, now))
        return int(cur.lastrowid)

    def conversations(self, query: str = "") -> list[Conversation]:
        """Most recently updated first; ``query`` matches titles and message text."""
        if not query:
            rows = self._read("SELECT id, title, system_prompt, updated FROM conversations"
                              " ORDER BY updated DESC, id DESC")
        else:
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._read(
                "SELECT id, title, system_prompt, updated FROM conversations c"
                " WHERE title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                "  WHERE m.conversation_id = c.id AND m.content LIKE ?1 ESCAPE '\\')"
                " ORDER BY updated DESC, id DESC", (like,))
        return [Conversation(*row) for row in rows]

    def get(self, conv_id: int) -> Conversation | None:
        rows = self._read(
            "SELECT id, title, system_prompt, updated FROM conversations WHERE id = ?",
            (conv_id,))
        return Conversation(*rows[0]) if rows else None

    def find_empty(self, title: str = "New chat") -> int | None:
        """The newest conversation named ``title`` with no messages (reused instead of
        another 'New chat'; an emptied chat with a name of its own is not reused)."""
        rows = self._read(
            "SELECT id FROM conversations c WHERE title = ? AND NOT EXISTS (SELECT 1 FROM"
            " messages m WHERE m.conversation_id = c.id) ORDER BY updated DESC, id DESC"
            " LIMIT 1", (title,))
        return int(rows[0][0]) if rows else None

    def rename(self, conv_id: int, title: str) -> None:
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (title, conv_id))

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._write("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conv_id))

    def context_policy(self, conv_id: int) -> str:
        """The chat's context policy ('' until one is chosen: the app's default applies)."""
        rows = self._read("SELECT context_policy FROM conversations WHERE id = ?", (conv_id,))
        return str(rows[0][0]) if rows else ""

    def set_context_policy(self, conv_id: int, policy: str) -> None:
        self._write("UPDATE conversations SET context_policy = ? WHERE id = ?",
                    (policy, conv_id))

    def delete(self, conv_id: int) -> DeletedConversation | None:
        """Delete a conversation; the returned record puts it back with :meth:`restore`."""
        conv = self._read(f"SELECT {CONV_COLS} FROM conversations WHERE id = ?", (conv_id,))
        if not conv:
            return None
        msgs = self._read(f"SELECT {MSG_COLS} FROM messages WHERE conversation_id = ?"
                          " ORDER BY id", (conv_id,))
        policy = self.context_policy(conv_id)
        self._write("DELETE FROM conversations WHERE id = ?", (conv_id,))
        return DeletedConversation(conv[0], msgs, policy)

    def restore(self, deleted: DeletedConversation) -> int:
        try:
            with self._db:
                self._db.execute(
                    f"INSERT INTO conversations ({CONV_COLS}) VALUES (?, ?, ?, ?, ?)",
                    deleted.conv)
                self._db.executemany(
                    f"INSERT INTO messages ({MSG_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    deleted.messages)
                self._db.execute("UPDATE conversations SET context_policy = ? WHERE id = ?",
                                 (deleted.context_policy, deleted.conv[0]))
        except sqlite3.Error as exc:
            raise StorageError(f"Could not save to {self.path.name}: {_reason(exc)}.") from exc
        return int(deleted.conv[0])

    # --- messages --------------------------------------------------------------------
    def messages(self, conv_id: int) -> list[Message]:
        """The conversation as shown: each reply's chosen version only."""
        rows = self._read(
            "SELECT id, role, content, stats FROM messages WHERE conversation_id = ?"
            " AND active = 1 ORDER BY id", (conv_id,))
        return [Message(i, role, content, _stats(stats)) for i, role, content, stats in rows]

    def add_message(self, conv_id: int, role: str, content: str, stats: dict | None = None) -> int:
        now = time.time()
        try:
            with self._db:
                cur = self._db.execute(
                    "INSERT INTO messages (conversation_id, role, content, stats, created)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (conv_id, role, content, json.dumps(stats or {}), now))
                self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                                 (now, conv_id))
        except sqlite3.Error as exc:
            raise StorageError(f"Could not save to {self.path.name}: {_reason(exc)}.") from exc
        return int(cur.lastrowid)

    def update_message(self, msg_id: int, content: str, stats: dict | None = None) -> None:
        if stats is None:
            self._write("UPDATE messages SET content = ? WHERE id = ?", (content, msg_id))
        else:
            self._write("UPDATE messages SET content = ?, stats = ? WHERE id = ?",
                        (content, json.dumps(stats), msg_id))

    def delete_from(self, conv_id: int, msg_id: int) -> None:
        """Delete message ``msg_id`` and every later one, all versions (edit a message)."""
        self._write("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                    (conv_id, msg_id))

    # --- reply versions (regenerate keeps the earlier ones) -----------------------------
    def versions(self, conv_id: int, after_id: int) -> list[int]:
        """Ids of every version of the reply to user message ``after_id``, oldest first."""
        rows = self._read("SELECT id FROM messages WHERE conversation_id = ? AND id > ?"
                          " AND role = 'assistant' ORDER BY id", (conv_id, after_id))
        return [int(r[0]) for r in rows]

    def choose_version(self, conv_id: int, after_id: int, msg_id: int | None) -> None:
        """Show version ``msg_id`` of that reply (None hides them all, before a regenerate)."""
        self._write("UPDATE messages SET active = (id IS ?) WHERE conversation_id = ?"
                    " AND id > ? AND role = 'assistant'", (msg_id, conv_id, after_id))

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
        conv = self.get(conv_id)
        if conv is None:
            raise KeyError(conv_id)
        return conversation_markdown(conv.title, conv.system_prompt,
                                     [(m.role, m.content, m.stats)
                                      for m in self.messages(conv_id)])


def conversation_markdown(title: str, system_prompt: str,
                          messages: list[tuple[str, str, dict]]) -> str:
    """A conversation as Markdown (export, and Save as… of what a window shows)."""
    from gui.format import message_stats

    out = [f"# {title}", ""]
    if system_prompt:
        out += ["**System:** " + system_prompt, ""]
    for role, content, stats in messages:
        out += [f"## {role.capitalize()}", "", content, ""]
        if stats:
            out += [f"*{message_stats(stats)}*", ""]
    return "\n".join(out)


def write_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) whole or not at all: a full disk leaves the old file whole
    rather than a truncated one (:func:`inference.files.write_atomic`)."""
    return files.write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def _rows(db: sqlite3.Connection, table: str, cols: str) -> tuple[list[tuple], int]:
    """Every readable row of ``table`` (all at once, else id by id around bad pages), and
    how many ids below the last one read could not be read (rows on damaged pages)."""
    try:
        return db.execute(f"SELECT {cols} FROM {table} ORDER BY id").fetchall(), 0
    except sqlite3.Error:
        pass
    out, misses, i, failed = [], 0, 0, []
    while misses < SALVAGE_MISSES:
        i += 1
        try:
            row = db.execute(f"SELECT {cols} FROM {table} WHERE id = ?", (i,)).fetchone()
        except sqlite3.Error:
            row = None
            failed.append(i)
        if row is None:
            misses += 1
        else:
            out.append(row)
            misses = 0
    last = out[-1][0] if out else 0
    return out, sum(1 for j in failed if j < last)


def _count(db: sqlite3.Connection, table: str) -> int | None:
    try:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.Error:
        return None


def salvage(path: Path) -> Salvaged:
    """The rows still readable in a damaged database file, and each table's row count."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        db.execute("SELECT 1 FROM sqlite_master").fetchall()
    except sqlite3.Error:
        return Salvaged([], [])  # the header itself is gone
    try:
        total_c, total_m = _count(db, "conversations"), _count(db, "messages")
        convs, bad_c = _rows(db, "conversations", CONV_COLS)
        try:
            db.execute("SELECT active FROM messages LIMIT 0")
            msgs, bad_m = _rows(db, "messages", MSG_COLS)
        except sqlite3.Error:
            msgs, bad_m = _rows(db, "messages", MSG_COLS.replace("active", "1"))
    finally:
        db.close()
    # Where the count itself is unreadable: the rows read plus the ids that failed.
    total_c = total_c if total_c is not None else len(convs) + bad_c if bad_c else None
    total_m = total_m if total_m is not None else len(msgs) + bad_m if bad_m else None
    known = {c[0] for c in convs}
    now = time.time()
    for conv_id in sorted({m[1] for m in msgs if m[1] is not None} - known):
        convs.append((conv_id, "Recovered chat", "", now, now))  # its row was lost
    return Salvaged(convs, msgs, total_c, total_m)


def _stats(text: str | None) -> dict:
    """A message's stored figures; a damaged value reads as none (the message text is kept)."""
    try:
        stats = json.loads(text or "{}")
    except (ValueError, TypeError):
        return {}
    return stats if isinstance(stats, dict) else {}
