"""GUI test fixtures. Offscreen Qt, temporary settings and conversation store, real models.

QT_QPA_PLATFORM must be set before the QApplication exists; this module is imported by
pytest before any test (and before pytest-qt creates the app), so set it here first.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

# A 1920x1080 offscreen screen (the default is 800x600, smaller than the window), so
# geometry restores and screenshots behave as on a desktop.
_SCREEN = os.path.join(tempfile.mkdtemp(prefix="inferdesk-qpa-"), "screen.json")
with open(_SCREEN, "w") as f:
    json.dump({"screens": [{"name": "offscreen", "x": 0, "y": 0, "width": 1920,
                            "height": 1080, "logicalDpi": 96, "logicalBaseDpi": 96,
                            "dpr": 1}]}, f)
os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={_SCREEN}"

from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from PySide6.QtCore import QEventLoop, QSettings, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from gui import gc_guard, theme  # noqa: E402
from gui.conversations import ConversationStore  # noqa: E402
from gui.main_window import MainWindow  # noqa: E402
from gui.settings import Settings  # noqa: E402

LOAD_TIMEOUT_MS = 120_000


@pytest.fixture(scope="session")
def app(qapp: QApplication) -> QApplication:
    theme.apply(qapp)
    return qapp


def make_settings(path: Path) -> Settings:
    return Settings(QSettings(str(path), QSettings.Format.IniFormat))


def spin(ms: int) -> None:
    """Run the event loop for ``ms``. Unlike QTest.qWait (and so qtbot.wait/waitUntil),
    QEventLoop.exec releases the GIL while idle, so the worker thread runs at full speed."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(cond: Callable[[], bool], timeout_ms: int = 30_000, what: str = "") -> None:
    """Spin the event loop until ``cond()`` holds (use instead of qtbot.waitUntil)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or cond}")
        spin(10)


@contextmanager
def job_result(qtbot, runner, kind: str, timeout: int = 30_000,  # noqa: ANN001
               check: Callable[[Any], bool] | None = None) -> Iterator[SimpleNamespace]:
    """Wait (on leaving the block) for the next job of ``kind`` on ``runner`` to finish;
    ``got.args[0]``: its result (or its error's sentence), ``got.job``: the job.
    ``check(value)``: skip results it refuses (an answer to an earlier request)."""
    got = SimpleNamespace(args=None, job=None)

    def mine(job) -> bool:  # noqa: ANN001
        return job.kind == kind and (check is None or (job.ok and check(job.value)))

    with qtbot.waitSignal(runner.done, timeout=timeout, check_params_cb=mine) as blocker:
        yield got
    got.job = blocker.args[0]
    got.args = [got.job.value if got.job.ok else got.job.message]


def on_tokens(w, fn: Callable[[Any], None]) -> Callable:  # noqa: ANN001
    """Call ``fn(TokenEvent)`` for every token a reply job streams; returns what to
    ``w.jobs.progress.disconnect``."""
    from gui.jobs import on_progress
    from inference.events import TokenEvent

    return on_progress(w.jobs, TokenEvent, fn, "generate")


def drain(w) -> None:  # noqa: ANN001
    """Wait until the window's runner has no job left, including those the results of
    earlier ones queued (quiet jobs report no busy state, so ``jobs.job`` cannot tell)."""
    wait_until(lambda: not w.jobs.active(), 60_000, "the runner's queued jobs")


def report(w, kind: str, value: Any) -> None:  # noqa: ANN001
    """As if a job of ``kind`` on the window's runner had returned ``value``: it runs
    through the runner, so every pane hears of it as of a real one."""
    job = w.jobs.submit(kind, lambda _ctx: value)
    wait_until(lambda: job.done, 10_000, f"the reported {kind}")


@pytest.fixture
def make_window(app: QApplication, qtbot, tmp_path: Path) -> Callable[..., MainWindow]:
    """``make_window(data_dir=tmp_path)``: a fresh window on its own settings and store."""

    def make(data_dir: Path = tmp_path, autoload: bool = False) -> MainWindow:
        data_dir.mkdir(parents=True, exist_ok=True)
        w = MainWindow(make_settings(data_dir / "settings.ini"),
                       ConversationStore(data_dir / "conversations.sqlite3"), autoload=autoload)
        qtbot.addWidget(w)  # closed (worker stopped, store closed) at teardown
        w.show()
        return w

    return make


def spec_of(window: MainWindow, kind: str) -> object:
    return next(s for s in window.picker.specs if s.kind == kind and s.source == "bundled")


@pytest.fixture(autouse=True)
def no_modal_dialogs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A modal dialog offscreen waits forever for a click no test makes: fail at once,
    naming it, so a test patches the question it means to answer."""
    from PySide6.QtWidgets import QMessageBox

    def refuse(*args: object, **kwargs: object) -> None:
        text = " / ".join(str(a) for a in args[1:3])
        pytest.fail(f"a modal QMessageBox opened in a test ({text}); patch what asks it")

    for name in ("question", "warning", "information", "critical"):
        monkeypatch.setattr(QMessageBox, name, refuse)


@pytest.fixture(scope="package", autouse=True)
def gc_back_to_automatic(app: QApplication) -> Iterator[None]:
    """The window moves cyclic GC onto the GUI thread (gui.gc_guard); after the GUI tests,
    collect what they left on this thread and give the rest of the suite automatic GC."""
    yield
    spin(50)  # run pending deleteLater()s
    gc_guard.uninstall()


@pytest.fixture(scope="package")
def loaded_window(app: QApplication, tmp_path_factory) -> Iterator[MainWindow]:
    """One window with the bundled SmolLM2 and MiniLM loaded, shared to keep the suite fast."""
    d = tmp_path_factory.mktemp("session-window")
    s = make_settings(d / "settings.ini")
    if os.environ.get("INFERDESK_TEST_BACKEND"):
        s.set("models/backend", os.environ["INFERDESK_TEST_BACKEND"])
    w = MainWindow(s, ConversationStore(d / "conv.sqlite3"),
                   autoload=True)
    w.resize(1280, 800)
    w.show()
    def ready() -> bool:
        if w.banner.isVisible():
            raise RuntimeError(f"loading the bundled models failed: {w.banner.text()}")
        return {"causal", "encoder"} <= set(w.picker.loaded)

    wait_until(ready, LOAD_TIMEOUT_MS, "the bundled models to load")
    wait_until(lambda: w.jobs.job == "", 10_000, "the runner to go idle")
    yield w
    w.close()
    w.deleteLater()
