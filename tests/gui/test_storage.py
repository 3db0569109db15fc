"""The crash-safety suite: kill -9 during a reply, a lock held across the end of a reply,
a full filesystem, a corrupt database, a read-only data folder, a bad settings file, and
closing the window while a job runs. In each, the conversation shown equals the one
stored, or the banner says exactly what was not saved and offers to save it elsewhere."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gui.conversations import ConversationStore
from tests.gui.conftest import job_result, make_settings, spin, wait_until

GEN_TIMEOUT_MS = 240_000
REPO = Path(__file__).resolve().parents[2]


def stored(w) -> list[str]:  # noqa: ANN001
    return [m.content for m in w.store.messages(w.chat.conv_id)]


def shown(w) -> list[str]:  # noqa: ANN001
    return [v.text for v in w.chat.views()]


def _quick(w, n: int = 10) -> None:  # noqa: ANN001
    w.chat.sampling.set_values({"max_tokens": n, "temperature": 0.0, "seed": 1})


@contextlib.contextmanager
def small_fs(path: Path, size: str, readonly: bool = False):
    """A real small filesystem at ``path`` (tmpfs; needs mount rights, as root in CI)."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                       capture_output=True)
    if r.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# --- start-up: corrupt database, read-only folder, bad settings ---------------------------
def _filled_db(path: Path, n_conv: int = 4, n_msg: int = 40) -> None:
    s = ConversationStore(path)
    for c in range(n_conv):
        cid = s.create(f"chat {c}")
        for m in range(n_msg):
            s.add_message(cid, "user" if m % 2 == 0 else "assistant", f"{c}-{m} " + "x" * 400)
    s._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()


def test_corrupt_header_is_moved_aside_and_the_app_starts(make_window, tmp_path) -> None:
    db = tmp_path / "conversations.sqlite3"
    db.write_bytes(b"this is not a database" * 100)
    w = make_window(tmp_path)
    aside = list(tmp_path.glob("conversations.corrupt-*.sqlite3"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    assert w.chat.store_banner.isVisible() and aside[0].name in w.chat.store_banner.text()
    assert "0 conversations and 0 messages were recovered" in w.chat.store_banner.text()
    assert w.chat.new_conversation() is not None  # the fresh database works


def test_corrupt_page_is_salvaged(make_window, tmp_path) -> None:
    db = tmp_path / "conversations.sqlite3"
    _filled_db(db)
    page = 4096
    n_pages = db.stat().st_size // page
    with open(db, "r+b") as f:  # one page in the middle of the messages
        f.seek(page * (n_pages // 2))
        f.write(b"\xff" * page)
    w = make_window(tmp_path)
    text = w.chat.store_banner.text()
    assert "was damaged" in text and list(tmp_path.glob("conversations.corrupt-*"))
    s = w.store
    n = sum(len(s.messages(c.id)) for c in s.conversations())
    assert 0 < n < 160 and f"{n} messages were recovered" in text
    assert w.chat.conv_list.count() >= 1


def test_read_only_data_folder_means_read_only_mode(make_window, tmp_path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    _filled_db(folder / "conversations.sqlite3", 2, 4)
    # Root ignores permission bits: a read-only bind of the folder is the real thing.
    r = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)],
                       capture_output=True)
    if r.returncode != 0:
        folder.chmod(0o555)
    try:
        store = ConversationStore(folder / "conversations.sqlite3")
        assert store.read_only and "read-only" in store.notice
        assert [c.title for c in store.conversations()] == ["chat 1", "chat 0"]
        store.close()
        settings = make_settings(tmp_path / "settings.ini")
        from gui.main_window import MainWindow

        w = MainWindow(settings, ConversationStore(folder / "conversations.sqlite3"),
                       autoload=False)
        w.show()
        assert w.chat.store_banner.isVisible() and "read-only" in w.chat.store_banner.text()
        assert "Save as…" in w.chat.store_banner.actions
        assert w.chat.conv_list.count() == 2 and len(w.chat.views()) == 4
        out = tmp_path / "elsewhere.md"
        w.chat.save_as(out)
        assert "1-3 " in out.read_text()
        w.close()
    finally:
        if r.returncode == 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        else:
            folder.chmod(0o755)


def test_out_of_range_settings_are_clamped(make_window, tmp_path) -> None:
    ini = tmp_path / "settings.ini"
    ini.write_text("[sampling]\nmax_tokens=99999999999\ntemperature=nan\ntop_k=-5\n"
                   "seed=abc\n[window]\ntab=99999999999\n")
    w = make_window(tmp_path)
    v = w.chat.sampling.values()
    assert v["max_tokens"] == 32768 and v["temperature"] == 0.7 and v["top_k"] == 0
    assert v["seed"] == -1 and w.tabs.currentIndex() == w.tabs.count() - 1


# --- failures at the end of a reply (the real model) ---------------------------------------
@pytest.fixture
def chat_window(make_window, tmp_path, qtbot):  # noqa: ANN001, ANN201
    from tests.gui.conftest import LOAD_TIMEOUT_MS, spec_of

    def make(data: Path):  # noqa: ANN202
        w = make_window(data)
        wait_until(lambda: bool(w.picker.specs), 60_000)
        with job_result(qtbot, w.jobs, "load", timeout=LOAD_TIMEOUT_MS):
            w.picker.load(spec_of(w, "causal"))
        w.tabs.setCurrentWidget(w.chat)
        w.chat.new_conversation()
        _quick(w)
        return w

    return make


LOCKER = textwrap.dedent("""
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until the test closes our stdin
    db.execute("COMMIT")
""")


def test_lock_held_across_the_end_of_a_reply(chat_window, tmp_path, qtbot) -> None:
    w = chat_window(tmp_path)
    _quick(w, 48)
    assert w.chat.send("Name three colours and say why you like each.")
    wait_until(lambda: len(w.chat.views()) == 2 and w.chat.views()[1].msg_id is not None,
               GEN_TIMEOUT_MS, "the reply's first token")
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(w.store.path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        assert w.chat.generating  # the lock is taken mid-reply and held past its end
        wait_until(lambda: not w.chat.generating, GEN_TIMEOUT_MS, "the reply to end")
        reply = w.chat.views()[1].text
        assert reply  # the view has the whole reply although the database is locked
        banner = w.chat.banner.text()
        assert w.chat.banner.isVisible() and "locked" in banner
        assert f"the reply ({len(reply):,} characters)" in banner
        assert {"Retry", "Save as…"} <= set(w.chat.banner.actions)
        assert w.chat.send_button.isEnabled()  # never stuck
        assert not w.chat.retry_pending()  # still locked: still pending, still shown
        w.chat.save_as(tmp_path / "saved.md")
        assert reply in (tmp_path / "saved.md").read_text()
    finally:
        locker.stdin.close()
        locker.wait(30)
    w.chat.banner.actions["Retry"].click()
    assert not w.chat.banner.isVisible() and not w.chat.pending
    assert stored(w) == shown(w)


def test_full_disk_keeps_the_reply_and_retry_saves_it(chat_window, tmp_path, qtbot) -> None:
    data = tmp_path / "small"
    with small_fs(data, "1m") as mounted:
        w = chat_window(data)
        filler = data / "filler"
        if mounted:
            # Fill the filesystem to the last few KiB before the reply starts.
            with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 4096)
        else:  # no mount rights: SQLite's own limit gives the same SQLITE_FULL
            n = w.store._db.execute("PRAGMA page_count").fetchone()[0]
            w.store._db.execute(f"PRAGMA max_page_count={n}")
        long_q = "Explain, in detail, how rain forms. " * 30
        assert w.chat.send(long_q)
        wait_until(lambda: not w.chat.generating, GEN_TIMEOUT_MS, "the reply to end")
        views = shown(w)
        assert views[0] == long_q and views[1]  # the message as typed
        banner = w.chat.banner.text()
        assert "full" in banner and w.chat.send_button.isEnabled()
        for pw in w.chat.pending:  # the banner names each unsaved message and its length
            assert pw.describe() in banner
        assert w.chat.pending
        if mounted:
            filler.unlink()
        else:
            w.store._db.execute("PRAGMA max_page_count=1073741823")
        assert w.chat.retry_pending()
        assert stored(w) == shown(w)
        w.close()
        spin(50)


# --- a process killed mid-reply, and closing while a job runs (child processes) -------------
KILLER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    from PySide6.QtWidgets import QApplication
    from gui import theme
    from gui.main_window import MainWindow
    from gui.conversations import ConversationStore
    from tests.gui.conftest import make_settings, wait_until
    d = Path(sys.argv[1]); report = d / "shown.json"
    app = QApplication([]); theme.apply(app)
    w = MainWindow(make_settings(d / "s.ini"), ConversationStore(d / "c.sqlite3"),
                   autoload=False)
    w.show()
    wait_until(lambda: bool(w.picker.specs), 60_000)
    w.picker.load(next(s for s in w.picker.specs if s.kind == "causal"
                       and s.source == "bundled"))
    wait_until(lambda: "causal" in w.picker.loaded, 240_000)
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 40, "temperature": 0.0, "seed": 1})
    render, renders = w.chat._render_reply, []
    def render_then_die():
        render()
        views = w.chat.views()
        if len(views) == 2 and views[1].text:
            renders.append(1)
            if len(renders) == 3:  # killed right after the third render is on screen
                report.write_text(json.dumps([v.text for v in views]))
                os.kill(os.getpid(), signal.SIGKILL)
    w.chat._render_timer.timeout.disconnect()
    w.chat._render_timer.timeout.connect(render_then_die)
    w.chat.send("Tell me about the sea.")
    wait_until(lambda: False, 240_000)
""")


def _child(script: str, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_kill_9_during_a_reply_keeps_what_was_shown(tmp_path) -> None:
    r = _child(KILLER, str(tmp_path))
    assert r.returncode == -9, r.stderr[-2000:]
    import json

    was_shown = json.loads((tmp_path / "shown.json").read_text())
    db = sqlite3.connect(tmp_path / "c.sqlite3")
    rows = [c for (c,) in db.execute("SELECT content FROM messages ORDER BY id")]
    db.close()
    assert rows == was_shown  # the view is written before the database, in the same tick


CLOSER = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    import inference
    from PySide6.QtWidgets import QApplication
    from gui import theme
    from gui.main_window import MainWindow
    from gui.conversations import ConversationStore
    from tests.gui.conftest import make_settings, wait_until
    d = Path(sys.argv[1])
    started = threading.Event()
    def stubborn_load(*a, **k):  # a job that ignores its cancel (e.g. a runaway template)
        started.set()
        time.sleep(60)
    inference.load_model = stubborn_load
    app = QApplication([]); theme.apply(app)
    w = MainWindow(make_settings(d / "s.ini"), ConversationStore(d / "c.sqlite3"),
                   autoload=False)
    w.show()
    wait_until(lambda: bool(w.picker.specs), 60_000)
    w.picker.load(w.picker.specs[0])
    wait_until(started.is_set, 60_000)
    t = time.monotonic()
    w.close()
    print(f"closed in {time.monotonic() - t:.1f} s", flush=True)
    app.quit()
""")


def test_closing_while_a_job_ignores_cancel_exits_cleanly(tmp_path) -> None:
    r = _child(CLOSER, str(tmp_path))
    # Not 134 (SIGABRT from "QThread: Destroyed while thread is still running").
    assert r.returncode == 0, r.stderr[-2000:]
    assert "closed in" in r.stdout and "Destroyed while thread" not in r.stderr
    assert "did not stop within" in r.stderr  # left to end with the process
