"""The Compare tab: the loaded chat model's file on two backends, driven as a user would,
at 800x600, on the tiny Qwen 3 Q4_0 GGUF (tests/goldens/tiny)."""

from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
import pytest
from PySide6.QtCore import Qt

from gui.compare_pane import COLUMNS, MAX_TOKENS, ComparePane
from gui.worker import BackendInfo, load
from tests.gui.conftest import wait_until

TINY = Path(__file__).resolve().parents[1] / "goldens" / "tiny" / "qwen3_q4_0.gguf"


@pytest.fixture
def window(make_window):
    w = make_window(autoload=False)
    w.resize(800, 600)
    w.tabs.setCurrentWidget(w.compare)
    wait_until(lambda: w.compare.backend_infos, 30_000, "the backend probe")
    return w


def choose(pane: ComparePane, a: str, b: str) -> None:
    pane.combo_a.setCurrentIndex(pane.combo_a.findData(a))
    pane.combo_b.setCurrentIndex(pane.combo_b.findData(b))


def test_compare_tab_runs_end_to_end(window, qtbot):
    pane = window.compare
    assert window.tabs.tabText(window.tabs.indexOf(pane)) == "Compare"
    assert pane.minimumSizeHint().width() <= 800
    qtbot.mouseClick(pane.run_button, Qt.MouseButton.LeftButton)
    assert "Load a chat model first" in pane.message.text() and not pane.running

    window.jobs.submit("load", load, str(TINY), "numpy")  # any load: the pane hears of it
    wait_until(lambda: pane.model_path == str(TINY), 30_000, "the tiny model to load")
    choose(pane, "numpy", "cpu")
    pane.tokens.setValue(6)
    pane.prompt.setPlainText("Hello there")
    pane.run()
    assert pane.running and not pane.run_button.isEnabled() and pane.stop_button.isEnabled()
    wait_until(lambda: not pane.running, 60_000, "the comparison to finish")
    s = pane.summary
    assert s is not None, pane.message.text()
    assert pane.table.rowCount() == s.steps >= 1
    for row in range(s.steps):
        for col in range(len(COLUMNS)):
            assert pane.table.item(row, col) is not None, (row, col)
        top1 = pane.table.item(row, 3).text()
        assert top1 == "same" if s.records[row].agree else top1.startswith("B: ")
    xs, ys = pane.curve.getData()
    assert list(ys) == [r.max_abs_diff for r in s.records]
    lines = [lab.text() for lab in pane.summary_labels]
    assert lines[0].startswith("A numpy:") and lines[1].startswith("B cpu:")
    assert "peak RSS" in lines[0] and "top-1 agrees at" in lines[2]
    assert pane.run_button.isEnabled() and not pane.stop_button.isEnabled()


def test_bad_input_says_one_sentence(app, qtbot):
    pane = ComparePane()
    qtbot.addWidget(pane)
    try:
        pane.set_backends([BackendInfo("numpy", True, "reference", None),
                           BackendInfo("cuda", False, "no NVIDIA driver", None)])
        assert pane.combo_a.currentData() == "numpy"
        pane.run()
        assert pane.message.text() == "Load a chat model first (Models tab): Compare runs " \
                                      "its file."
        pane.set_model("http://host/v1#m", "m", remote=True)
        pane.run()
        assert "runs on a server" in pane.message.text()
        pane.set_model(str(TINY), "qwen3_q4_0")
        pane.prompt.setPlainText("  \n ")
        pane.run()
        assert pane.message.text() == "Write a prompt to compare the backends on."
        pane.prompt.setPlainText("hi")
        pane.combo_b.setCurrentIndex(pane.combo_b.findData("cuda"))
        pane.run()
        assert pane.message.text() == "Backend 'cuda' is unavailable here: no NVIDIA driver."
        assert not pane.running and pane.table.rowCount() == 0
    finally:
        assert pane.shutdown(5000)


def test_stop_ends_the_run_and_the_pane_stays_usable(app, qtbot):
    pane = ComparePane()
    qtbot.addWidget(pane)
    try:
        pane.set_backends([BackendInfo("numpy", True, "reference", None)])
        pane.set_model(str(TINY), "qwen3_q4_0")
        pane.tokens.setValue(400)
        pane.run()
        pane.stop()  # before the load ends: the load stops between tensors
        wait_until(lambda: not pane.running, 30_000, "the run to stop")
        assert pane.message.text().startswith("Stopped"), pane.message.text()
        assert pane.summary is None and pane.run_button.isEnabled()
        pane.tokens.setValue(3)
        pane.run()
        wait_until(lambda: not pane.running, 30_000, "the second run")
        assert pane.summary is not None and pane.summary.max_abs_diff == 0.0
    finally:
        assert pane.shutdown(5000)


def test_shutdown_during_a_run_and_the_plot_follows_the_theme(app, qtbot):
    from gui import theme

    pane = ComparePane()
    qtbot.addWidget(pane)
    pane.set_backends([BackendInfo("numpy", True, "reference", None)])
    pane.set_model(str(TINY), "qwen3_q4_0")
    pane.tokens.setValue(MAX_TOKENS)
    pane.run()
    wait_until(lambda: pane.generated > 0, 30_000, "A's first step")
    assert pane.shutdown(5000) and not pane.jobs.alive()  # the close path

    before = theme.choice()
    try:
        for name in ("dark", "light"):
            theme.set_choice(app, name)
            assert pane.plot.backgroundBrush().color().name() == \
                pg.mkColor(theme.PLOT[name]["background"]).name()
    finally:
        theme.set_choice(app, before)
