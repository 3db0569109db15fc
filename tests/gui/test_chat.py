"""Chat with the real bundled SmolLM2: stream, stop, regenerate, edit, export, persist."""

from __future__ import annotations

import json
import sqlite3

from PySide6.QtCore import QCoreApplication, Qt, QThread
from PySide6.QtTest import QTest

from tests.gui.conftest import LOAD_TIMEOUT_MS, job_result, on_tokens, spec_of, wait_until

GEN_TIMEOUT_MS = 120_000


def _quick(window, max_tokens: int = 8) -> None:
    window.chat.sampling.set_values({"max_tokens": max_tokens, "temperature": 0.0, "seed": 1})


def test_send_streams_tokens_on_the_gui_thread(loaded_window, qtbot) -> None:
    w = loaded_window
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    _quick(w)
    threads = []
    on_tokens(w, lambda _ev: threads.append(QThread.currentThread()))
    with qtbot.waitActive(w):
        w.activateWindow()
    w.chat.input.setPlainText("Say hello in three words.")
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS) as done:
        QTest.keyClick(w.chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    ev = done.args[0]
    assert ev.n_generated >= 1 and threads
    # Widgets hear the worker only on the GUI thread.
    assert all(t is QCoreApplication.instance().thread() for t in threads)
    views = w.chat.views()
    assert [v.role for v in views] == ["user", "assistant"]
    assert views[1].text == ev.text and ev.text.strip()
    assert "tokens" in views[1].stats_label.text() and "TTFT" in views[1].stats_label.text()
    stored = w.store.messages(w.chat.conv_id)
    assert stored[1].content == ev.text and stored[1].stats["n_generated"] == ev.n_generated
    assert w.chat.input.toPlainText() == "" and w.chat.send_button.isEnabled()
    assert w.store.get(w.chat.conv_id).title.startswith("Say hello")


def test_stop_halts_within_one_token(loaded_window, qtbot) -> None:
    w = loaded_window
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 400, "temperature": 0.8, "seed": 3})
    tokens = []
    on_tokens(w, tokens.append)
    assert w.chat.send("Write a very long story about a dragon who learns to cook.")
    wait_until(lambda: len(tokens) >= 3, GEN_TIMEOUT_MS)
    with qtbot.waitActive(w):
        w.activateWindow()
    with job_result(qtbot, w.jobs, "generate", timeout=30_000) as done:
        at_stop = w.chat.views()[-1]
        n_at_stop = len(tokens)
        QTest.keyClick(w, Qt.Key.Key_Escape)  # Esc = Stop
    ev = done.args[0]
    assert ev.finish_reason == "cancelled"
    # At most the token being computed when Stop was pressed, plus the final text flush.
    assert len(tokens) - n_at_stop <= 2 and ev.n_generated <= n_at_stop + 1
    assert at_stop.text == ev.text and "cancelled" in at_stop.stats_label.text()
    assert not w.chat.generating and w.chat.send_button.isEnabled()


def test_regenerate_edit_last_and_export(loaded_window, qtbot, tmp_path) -> None:
    w = loaded_window
    # The shared window shows the tab the last test left: the version buttons are visible
    # only on the chat's.
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    _quick(w, 6)
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS):
        w.chat.send("Name a colour.")
    first = w.store.messages(w.chat.conv_id)
    w.chat.sampling.set_values({"temperature": 1.0, "seed": 99})
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS):
        w.chat.regenerate()
    again = w.store.messages(w.chat.conv_id)
    assert [m.role for m in again] == ["user", "assistant"]
    assert again[0].id == first[0].id and again[1].id != first[1].id
    # Regenerate kept the first reply as version 1 of 2.
    last = w.chat.views()[-1]
    assert last.version_label.text() == "2/2" and last.prev_button.isVisible()
    last.prev_button.click()
    assert w.chat.views()[-1].text == first[1].content
    assert w.chat.views()[-1].version_label.text() == "1/2"
    w.chat.input.setPlainText("a draft")
    w.chat.edit_last()
    assert w.chat.input.toPlainText() == "Name a colour."
    # Nothing is removed until the edit is sent; Esc puts the draft back.
    assert len(w.store.messages(w.chat.conv_id)) == 2 and len(w.chat.views()) == 2
    QTest.keyClick(w.chat.input, Qt.Key.Key_Escape)
    assert w.chat.input.toPlainText() == "a draft" and len(w.chat.views()) == 2
    w.chat.edit_last()
    w.chat.input.setPlainText("Name a fruit.")
    _quick(w, 6)
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS):
        assert w.chat.send()
    assert [v.text for v in w.chat.views()][0] == "Name a fruit."
    assert len(w.store.messages(w.chat.conv_id)) == 2
    md = w.chat.export(tmp_path / "chat.md").read_text()
    doc = json.loads(w.chat.export(tmp_path / "chat.json").read_text())
    assert "Name a fruit." in md and "## Assistant" in md
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert doc["messages"][1]["stats"]["n_generated"] >= 1


def test_streamed_reply_is_on_disk_as_soon_as_it_is_shown(loaded_window, qtbot) -> None:
    """A kill mid-reply loses nothing already shown: the row matches the view on screen."""
    w = loaded_window
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 40, "temperature": 0.8, "seed": 5})
    assert w.chat.send("Tell me about the sea.")
    wait_until(lambda: len(w.chat.views()) == 2 and w.chat.views()[1].text != "",
               GEN_TIMEOUT_MS)
    shown = w.chat.views()[1]
    # A separate connection, as a restarted app would open it; no event loop ran since.
    db = sqlite3.connect(w.store.path)
    (content,) = db.execute("SELECT content FROM messages WHERE id = ?",
                            (shown.msg_id,)).fetchone()
    assert content == shown.text
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS):
        w.chat.stop()
    db.close()


def test_conversation_survives_closing_and_reopening(make_window, qtbot, tmp_path) -> None:
    d = tmp_path / "reopen"
    w = make_window(d)
    wait_until(lambda: bool(w.picker.specs), 30_000)
    with job_result(qtbot, w.jobs, "load", timeout=LOAD_TIMEOUT_MS):
        w.picker.load(spec_of(w, "causal"))
    w.chat.new_conversation()
    w.chat.system_prompt.setPlainText("Answer briefly.")
    _quick(w, 6)
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS) as done:
        w.chat.send("What is two plus two?")
    reply, conv_id = done.args[0].text, w.chat.conv_id
    w.close()

    w2 = make_window(d)
    assert w2.chat.conv_id == conv_id  # the most recent conversation reopens
    assert [v.text for v in w2.chat.views()] == ["What is two plus two?", reply]
    assert w2.chat.system_prompt.toPlainText() == "Answer briefly."
    assert w2.chat.conv_list.count() == 1
    assert w2.chat.conv_list.item(0).text().startswith("What is two plus two")
