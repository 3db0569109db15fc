"""Light and dark themes following the system, in a real X11 window (Xvfb), with Qt's GTK 3
platform theme reading the desktop's theme over XSETTINGS (xsettingsd) and following it
live. The offscreen tests (tests/gui/test_theme.py) cannot see this: the offscreen
platform reports no scheme and emits no change.

Runs where Xvfb, xsettingsd and GTK 3 are installed (Debian: ``apt-get install xvfb
xsettingsd libgtk-3-0``); skipped elsewhere, naming what is missing. The window runs in
its own process (tests/gui/x11_theme_driver.py): this one's QApplication is offscreen.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _missing() -> list[str]:
    need = [tool for tool in ("Xvfb", "xsettingsd") if shutil.which(tool) is None]
    if ctypes.util.find_library("gtk-3") is None:
        need.append("libgtk-3-0")
    return need


@pytest.fixture
def x_desktop(tmp_path):
    """An X server and an XSETTINGS daemon announcing the light Adwaita theme."""
    if missing := _missing():
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb xsettingsd libgtk-3-0)")
    display = f":{90 + os.getpid() % 900}"
    conf = tmp_path / "xsettingsd.conf"
    conf.write_text('Net/ThemeName "Adwaita"\n')
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "DISPLAY": display}
    daemon = None
    try:
        for _ in range(100):  # the socket appears when the server is ready
            if Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
                break
            time.sleep(0.05)
        probe = subprocess.run(  # Qt's xcb plugin needs its own X libraries
            [sys.executable, "-c", "from PySide6.QtWidgets import QApplication; "
             "QApplication(['probe'])"], env={**env, "QT_QPA_PLATFORM": "xcb"},
            capture_output=True, text=True, timeout=60)
        if probe.returncode:
            pytest.skip("Qt's xcb platform does not start here (apt-get install "
                        f"libxcb-cursor0 libxkbcommon-x11-0): {probe.stderr.strip()[-300:]}")
        daemon = subprocess.Popen(["xsettingsd", "-c", str(conf)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        yield env, conf, daemon.pid
    finally:
        for p in (daemon, xvfb):
            if p is not None:
                p.terminate()
                p.wait(10)


def test_the_real_window_follows_the_desktops_theme_and_the_users_choice(x_desktop, tmp_path):
    env, conf, daemon = x_desktop
    env = {k: v for k, v in env.items() if k not in ("QT_QPA_PLATFORM", "INFERDESK_THEME")}
    env.update(QT_QPA_PLATFORM="xcb", QT_QPA_PLATFORMTHEME="gtk3",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    (tmp_path / "data").mkdir()
    run = subprocess.run([sys.executable, str(ROOT / "tests/gui/x11_theme_driver.py"), str(conf),
                          str(daemon), str(tmp_path / "data"), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=120)
    steps = {s["step"]: s for s in map(json.loads, (line for line in run.stdout.splitlines()
                                                    if line.startswith("{")))}
    assert run.returncode == 0 and len(steps) == 5, run.stderr[-2000:]
    assert {s["platform"] for s in steps.values()} == {"xcb"}
    light, dark = (False, "light"), (True, "dark")
    for name, system, (sheet, app) in (("start", "Light", light),
                                        ("desktop-dark", "Dark", dark),  # followed live
                                        ("choice-light", "Light", light),  # the choice wins
                                        ("choice-system", "Dark", dark),  # and gives way
                                        ("desktop-light", "Light", light)):
        s = steps[name]
        assert (s["system"], s["app"], s["dark_sheet"]) == (system, app, sheet), s
        assert (s["window_lightness"] < 128) == sheet, s  # the palette, not only the sheet
        assert Path(s["shot"]).stat().st_size > 0
