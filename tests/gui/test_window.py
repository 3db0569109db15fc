"""The window opens, lists the bundled models and backends, and keeps its settings."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from gui.model_picker import COLUMNS
from tests.gui.conftest import wait_until


def test_window_lists_bundled_models_and_backends(make_window, qtbot) -> None:
    w = make_window()
    wait_until(lambda: len(w.picker.specs) >= 2 and w.picker.backend_combo.count() > 1,
               30_000)
    kinds = {(s.kind, s.source) for s in w.picker.specs}
    assert {("causal", "bundled"), ("encoder", "bundled")} <= kinds
    names = [w.picker.table.item(r, 0).text() for r in range(w.picker.table.rowCount())]
    assert any("SmolLM2" in n for n in names) and any("MiniLM" in n for n in names)
    # The fit column is decided against the chosen backend's free memory.
    col = COLUMNS.index("Fits")
    fits = {w.picker.table.item(r, col).text() for r in range(w.picker.table.rowCount())}
    assert fits <= {"yes", "no"} and "yes" in fits
    combo = [w.picker.backend_combo.itemData(i) for i in range(w.picker.backend_combo.count())]
    assert combo[0] == "auto" and "numpy" in combo
    assert [w.tabs.tabText(i) for i in range(w.tabs.count())][:5] == [
        "Models", "Chat", "Embeddings", "Performance", "Server"]
    assert "free" in w.picker.backend_note.text()


def test_shortcuts_new_chat_and_add_model(make_window, qtbot, monkeypatch) -> None:
    w = make_window()
    with qtbot.waitActive(w):
        w.activateWindow()
    before = len(w.store.conversations())
    QTest.keyClick(w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert len(w.store.conversations()) == before + 1
    assert w.tabs.currentWidget() is w.chat
    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileNames",
                        lambda *a, **k: (asked.append(a) or [], ""))
    QTest.keyClick(w, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier)
    assert asked, "Ctrl+O opens the add-model dialog"
    keys = {a.text(): [k.toString() for k in a.shortcuts()] for a in w.findChildren(
        type(w.send_action))}
    assert "Ctrl+Return" in keys["Send"] and "Esc" in keys["Stop"]


def test_settings_persist_across_restart(make_window, qtbot, tmp_path) -> None:
    d = tmp_path / "persist"
    w = make_window(d)
    w.chat.sampling.set_values({"temperature": 0.3, "max_tokens": 99, "top_k": 7, "seed": 42})
    w.resize(1000, 700)
    w.tabs.setCurrentWidget(w.perf)
    w.close()
    w2 = make_window(d)
    v = w2.chat.sampling.values()
    assert (v["temperature"], v["max_tokens"], v["top_k"], v["seed"]) == (0.3, 99, 7, 42)
    assert w2.tabs.currentWidget() is w2.perf
    assert (w2.width(), w2.height()) == (1000, 700)
