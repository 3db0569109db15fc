"""The app as people use it every day: exact text, nothing lost, layout that fits."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from tests.gui.conftest import job_result, wait_until
from tests.gui.test_render import CPP, shown

GEN_TIMEOUT_MS = 240_000


def _quick(w, n: int = 6) -> None:  # noqa: ANN001
    w.chat.sampling.set_values({"max_tokens": n, "temperature": 0.0, "seed": 1})


def test_angle_brackets_sent_to_the_real_model_are_shown_in_full(loaded_window, qtbot) -> None:
    w = loaded_window
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    _quick(w, 4)
    w.chat.input.setPlainText(CPP)
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS):
        QTest.keyClick(w.chat.input, Qt.Key.Key_Return)  # Enter sends (the default)
    user = w.chat.views()[0]
    assert user.text == CPP and CPP in shown(user)
    assert w.store.messages(w.chat.conv_id)[0].content == CPP
    # The context indicator: prompt + reply of the last turn against the model's context.
    stats = w.chat.views()[1].stats
    used = stats["n_prompt"] + stats["n_generated"]
    assert w.chat.context_label.text() == f"{used} / 4.1K tokens"  # the default context


def test_shift_enter_adds_a_line_and_the_setting_switches_to_ctrl_enter(make_window) -> None:
    w = make_window()
    w.tabs.setCurrentWidget(w.chat)
    box = w.chat.input
    box.setFocus()
    QTest.keyClicks(box, "one")
    QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(box, "two")
    assert box.toPlainText() == "one\ntwo"
    w.enter_action.trigger()  # Enter sends: off
    assert not w.chat.enter_sends()
    QTest.keyClick(box, Qt.Key.Key_Return)
    assert box.toPlainText() == "one\ntwo\n"


def test_no_model_keeps_the_message_in_the_box(make_window) -> None:
    w = make_window()
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    w.chat.input.setPlainText("hello?")
    assert not w.chat.send()
    assert w.chat.input.toPlainText() == "hello?" and w.chat.views() == []
    assert w.store.messages(w.chat.conv_id) == []  # no orphan turn
    assert w.chat.banner.isVisible() and "Load SmolLM2…" in w.chat.banner.actions


def test_system_prompt_is_per_chat_and_default_is_explicit(make_window) -> None:
    w = make_window()
    a = w.chat.new_conversation()
    w.store.add_message(a, "user", "x")  # so the next New chat is a new one
    w.chat.system_prompt.setPlainText("Talk like a pirate.")
    b = w.chat.new_conversation()
    assert b != a and w.chat.system_prompt.toPlainText() != "Talk like a pirate."
    w.chat.open_conversation(a)
    assert w.chat.system_prompt.toPlainText() == "Talk like a pirate."
    w.chat.default_button.click()
    w.store.add_message(b, "user", "y")
    c = w.chat.new_conversation()
    assert c not in (a, b) and w.chat.system_prompt.toPlainText() == "Talk like a pirate."


def test_ctrl_n_reuses_the_empty_chat(make_window) -> None:
    w = make_window()
    w.activateWindow()
    for _ in range(3):
        w.new_chat_action.trigger()
    assert len(w.store.conversations()) == 1 and w.chat.conv_list.count() == 1


def test_delete_is_undoable(make_window) -> None:
    w = make_window()
    a = w.chat.new_conversation()
    w.store.add_message(a, "user", "keep me")
    w.store.add_message(a, "assistant", "kept")
    w.chat.open_conversation(a)
    w.chat.delete_button.click()
    assert w.store.get(a) is None and w.undo_button.isVisibleTo(w)
    w.undo_action.trigger()  # Ctrl+Z
    assert w.chat.conv_id == a and [v.text for v in w.chat.views()] == ["keep me", "kept"]
    assert not w.undo_button.isVisibleTo(w)


def test_rename_search_and_dates(make_window) -> None:
    w = make_window()
    a = w.chat.new_conversation()
    w.store.add_message(a, "user", "about tigers")
    b = w.store.create("Other")
    w.store.add_message(b, "user", "about lions")
    w.chat.refresh_list()
    w.chat.rename_conversation(a, "Big cats")
    wait_until(lambda: any(w.chat.conv_list.item(i).text() == "Big cats"
                           for i in range(w.chat.conv_list.count())), 5000)
    w.chat.search.setText("tiger")
    assert [w.chat.conv_list.item(i).text() for i in range(w.chat.conv_list.count())] \
        == ["Big cats"]
    assert "20" in w.chat.conv_list.item(0).toolTip()  # the date is shown
    w.chat.search.setText("")
    assert w.chat.conv_list.count() == 2


def test_usable_at_800x600_with_collapsible_panels(make_window, tmp_path) -> None:
    w = make_window()
    assert w.minimumSizeHint().width() <= 800 and w.minimumSizeHint().height() <= 600
    w.resize(800, 600)
    w.tabs.setCurrentWidget(w.chat)
    assert w.width() == 800
    w.chat.toggle_panel(0)
    w.chat.toggle_panel(2)
    assert w.chat.split.sizes()[0] == 0 and w.chat.split.sizes()[2] == 0
    w.close()
    w2 = make_window(tmp_path)  # remembered
    assert w2.chat.split.sizes()[0] == 0 and w2.chat.split.sizes()[2] == 0


def test_neighbours_count_adapts_and_counts_read_right(loaded_window, qtbot) -> None:
    w = loaded_window
    pane = w.embed
    pane.set_sentences(["only one"])
    assert pane.count_label.text() == "1 sentence"
    pane.set_sentences(["a cat sleeps", "a dog barks", "stock prices fell"])
    assert pane.count_label.text() == "3 sentences"
    with job_result(qtbot, w.jobs, "embed", timeout=GEN_TIMEOUT_MS):
        pane.embed()
    assert pane.k_box.maximum() == 2  # k <= n - 1: never every point circled
    with job_result(qtbot, w.jobs, "query", timeout=GEN_TIMEOUT_MS) as got:
        assert pane.query("a kitten naps", k=10)
    assert len(got.args[0].hits) == 2


def test_adding_a_file_asks_before_replacing_a_loaded_model(loaded_window, monkeypatch
                                                            ) -> None:
    from tests.gui.conftest import spec_of

    w = loaded_window
    path = str(spec_of(w, "causal").path)
    asked: list[str] = []
    monkeypatch.setattr(w.picker, "confirm_replace", lambda name: asked.append(name) or False)
    loads: list[object] = []
    monkeypatch.setattr(w.picker, "load", lambda *a: loads.append(a))
    try:
        w.picker.add_files([path])
        assert asked and not loads  # "No": listed, not loaded
    finally:
        w.settings.remove_extra_path(str(Path(path).resolve()))


def test_memory_graph_shows_only_series_with_data(make_window) -> None:
    w = make_window()
    w.tabs.setCurrentWidget(w.perf)
    w.perf.sample()
    names = [label.text for _item, label in w.perf.mem_legend.items]
    assert names == ["host RSS"] and not w.perf.curves["device_used"].isVisible()
    assert "no GPU device: showing process RAM" in w.perf.mem_plot.titleLabel.text
    assert w.perf.mem_plot.getAxis("left").labelText == "MiB"
    w.perf.device = (100 * 2**20, 120 * 2**20)  # a backend that reports device memory
    w.perf.sample()
    assert [label.text for _i, label in w.perf.mem_legend.items] == \
        ["host RSS", "device used", "device peak"]


def test_embedding_pane_glitches(make_window) -> None:
    import numpy as np
    from PySide6.QtCore import QEvent, QPointF
    from PySide6.QtGui import QEnterEvent  # noqa: F401 - Leave is a plain QEvent
    from PySide6.QtWidgets import QApplication

    from gui import analysis
    from gui.worker import EmbedResult

    w = make_window()
    pane = w.embed
    w.tabs.setCurrentWidget(pane)
    axis = pane.heat_plot.getAxis("bottom")
    assert not axis.autoSIPrefix  # empty state: "sentence", never "sentence (x0.001)"
    v = np.ones((1, 4), np.float32) / 2
    heat, block = analysis.heatmap(v)
    pane._on_embedded(EmbedResult(["alone"], v, heat, block, np.zeros((1, 2)), 0.1))
    lo, hi = pane.colorbar.levels()
    assert (lo, hi) == (0.0, 1.0)  # self-similarity 1.0 is the top of the scale
    pane.heat_label.setVisible(True)
    QApplication.sendEvent(pane.heat_plot, QEvent(QEvent.Type.Leave))
    assert not pane.heat_label.isVisible()
    pane._hover_heatmap(QPointF(-1e6, -1e6))
    assert not pane.heat_label.isVisible()
