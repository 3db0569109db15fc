"""Run by tests/gui/test_window_x11.py in its own process on a real X server (Xvfb): the
real main window, on a temporary profile, resized to 800x600 and switched to the dark
theme. Prints one JSON line per step: the window's size, what is cut off on each
tab, and pixels read back from the X server (not from a widget grab).

    python tests/gui/x11_window_driver.py DATA_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEventLoop, QSettings, QTimer
from PySide6.QtWidgets import QApplication

from gui import theme
from gui.conversations import ConversationStore
from gui.main_window import MainWindow
from gui.settings import Settings
from tests.gui.layout_probe import cut_off, plots_cut_off


def spin(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def screen_lightness(w: MainWindow, widget: object, y_from: int = 0) -> float:
    """Mean lightness of ``widget`` as the X server shows it (grabbed from the screen)."""
    pos = widget.mapToGlobal(widget.rect().topLeft())
    shot = QApplication.primaryScreen().grabWindow(0, pos.x(), pos.y() + y_from,
                                                   widget.width(), widget.height() - y_from)
    img = shot.toImage()
    pts = [img.pixelColor(x, y).lightness() for x in range(0, img.width(), 9)
           for y in range(0, img.height(), 9)]
    return sum(pts) / max(1, len(pts))


def main(data: Path) -> int:
    app = QApplication(sys.argv[:1])
    theme.apply(app)
    w = MainWindow(Settings(QSettings(str(data / "settings.ini"), QSettings.Format.IniFormat)),
                   ConversationStore(data / "conversations.sqlite3"), autoload=False)
    w.show()
    deadline = time.monotonic() + 20
    while not w.isVisible() and time.monotonic() < deadline:
        spin(50)
    w.resize(800, 600)
    spin(400)
    w.chat.set_model("SmolLM2-135M-Instruct")
    w.chat.continue_button.setVisible(True)
    for scheme in ("light", "dark"):
        w.set_theme(scheme)
        problems = []
        for i in range(w.tabs.count()):
            w.tabs.setCurrentIndex(i)
            spin(60)
            problems += [f"{w.tabs.tabText(i)}: {p}" for p in cut_off(w.tabs.currentWidget())]
        w.tabs.setCurrentWidget(w.perf)
        spin(150)
        problems += plots_cut_off(w.perf)
        bar = w.menuBar().geometry()
        line = QApplication.primaryScreen().grabWindow(
            0, w.mapToGlobal(bar.bottomLeft()).x(), w.mapToGlobal(bar.bottomLeft()).y() + 1,
            w.width(), 3).toImage()
        print(json.dumps({
            "step": scheme, "platform": app.platformName(),
            "size": [w.width(), w.height()], "problems": problems,
            "plots": screen_lightness(w, w.perf.graphs),
            "under_menu": max(line.pixelColor(x, y).lightness()
                              for x in range(0, line.width(), 5) for y in range(line.height())),
        }), flush=True)
    w.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
