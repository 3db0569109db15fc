"""The real window on a real X server (Xvfb): at 800x600 nothing is cut off on any tab, and
switching to the dark theme reaches the plots live and leaves no light line under
the menu bar, as read back from the X server's framebuffer. Skipped where Xvfb is absent
(Debian: ``apt-get install xvfb``). The window runs in its own process
(tests/gui/x11_window_driver.py): this one's QApplication is offscreen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def x_server():
    if shutil.which("Xvfb") is None:
        pytest.skip("needs Xvfb (apt-get install xvfb)")
    display = f":{100 + os.getpid() % 800}"
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # the socket appears when the server is ready
            if Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
                break
            time.sleep(0.05)
        yield display
    finally:
        xvfb.terminate()
        xvfb.wait(10)


def test_real_window_at_800x600_and_a_live_theme_switch(x_server, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "INFERDESK_THEME")}
    env.update(DISPLAY=x_server, QT_QPA_PLATFORM="xcb",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, str(ROOT / "tests/gui/x11_window_driver.py"),
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=180,
                         cwd=ROOT)
    if run.returncode and "xcb" in run.stderr and "could not" in run.stderr.lower():
        pytest.skip(f"Qt's xcb platform does not start here: {run.stderr.strip()[-300:]}")
    steps = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert run.returncode == 0 and len(steps) == 2, run.stderr[-2000:]
    for s in steps:
        assert s["platform"] == "xcb" and s["size"] == [800, 600], s
        assert not s["problems"], s
    light, dark = steps
    assert light["plots"] > 180  # white plots in the light theme
    assert dark["plots"] < 90  # and dark ones as soon as the theme is dark, no restart
    assert dark["under_menu"] < 150, dark  # no white line under the menu bar
