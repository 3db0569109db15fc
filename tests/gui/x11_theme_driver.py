"""Run by tests/gui/test_theme_x11.py in its own process, on a real X server (Xvfb) with
Qt's GTK 3 platform theme and an XSETTINGS daemon (xsettingsd) standing in for the
desktop: the real main window, on a temporary profile, follows the desktop's theme as
the desktop changes it, and the user's choice in View > Theme wins over it.

    python tests/gui/x11_theme_driver.py CONF XSETTINGSD_PID DATA_DIR SHOTS_DIR

CONF is xsettingsd's configuration file; writing ``Net/ThemeName`` there and sending the
daemon SIGHUP is what a desktop's appearance switch does over XSETTINGS. Prints one JSON
line per step: the platform's scheme, the app's scheme, the style sheet and palette in
use, and a screenshot path.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from PySide6.QtCore import QEventLoop, QSettings, QTimer
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from gui import theme
from gui.conversations import ConversationStore
from gui.main_window import MainWindow
from gui.settings import Settings


def spin(ms: int) -> None:
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_for(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        spin(50)
    return True


def main() -> None:
    conf, daemon, data, shots = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    app = QApplication(sys.argv[:1])
    theme.apply(app)
    window = MainWindow(Settings(QSettings(str(data / "settings.ini"), QSettings.Format.IniFormat)),
                        ConversationStore(data / "conversations.sqlite3"), autoload=False)
    window.resize(1000, 700)
    window.show()
    spin(300)

    def step(name: str) -> None:
        shot = shots / f"theme-{name}.png"
        window.grab().save(str(shot))
        window_color = app.palette().color(QPalette.ColorRole.Window)
        print(json.dumps({"step": name, "platform": app.platformName(),
                          "system": app.styleHints().colorScheme().name,
                          "app": theme.scheme(app), "choice": theme.choice(),
                          "dark_sheet": "#1f2125" in app.styleSheet(),
                          "window_lightness": window_color.lightness(), "shot": str(shot)}),
              flush=True)

    def desktop(name: str) -> None:
        Path(conf).write_text(f'Net/ThemeName "{name}"\n')
        os.kill(daemon, signal.SIGHUP)

    step("start")
    desktop("Adwaita-dark")
    wait_for(lambda: theme.scheme(app) == "dark")
    step("desktop-dark")
    window.set_theme("light")
    spin(200)
    step("choice-light")
    window.set_theme("system")
    spin(200)
    step("choice-system")
    desktop("Adwaita")
    wait_for(lambda: theme.scheme(app) == "light")
    step("desktop-light")
    window.close()


if __name__ == "__main__":
    main()
