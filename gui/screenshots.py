"""Render screenshots of every tab from the real window with the bundled models, at the
smallest supported window (800x600), in the light and the dark theme.

    python -m gui.screenshots [OUT_DIR]     # default resources/screenshots

Files: ``<tab>-800x600-<theme>.png`` (e.g. ``chat-800x600-dark.png``). Runs offscreen (or
on the display QT_QPA_PLATFORM names) on temporary settings and a temporary conversation
store, so the user's own data is never touched.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SIZE = (800, 600)  # the smallest window every tab must work in
THEMES = ("light", "dark")
SENTENCES = [
    "The cat sleeps on the warm windowsill.", "A kitten naps in the afternoon sun.",
    "My dog loves chasing tennis balls.", "The puppy fetched the stick from the lake.",
    "Stock markets fell sharply on Monday.", "Investors worry about rising interest rates.",
    "The central bank kept rates unchanged.", "Bond yields climbed to a ten-year high.",
    "Add the flour slowly while stirring.", "Simmer the sauce for twenty minutes.",
    "Bake the bread until the crust is golden.", "Season the soup with salt and pepper.",
    "The team won the championship final.", "She scored twice in the second half.",
    "The coach praised the young goalkeeper.", "Fans celebrated in the streets all night.",
    "Quantum computers use qubits instead of bits.", "The GPU renders frames in parallel.",
    "This laptop has sixteen gigabytes of memory.", "Compilers turn source code into machine code.",
    "It rained all weekend in the mountains.", "A storm is expected to reach the coast.",
    "The forecast says sunny skies tomorrow.", "Snow covered the village overnight.",
]


def _wait(cond: Callable[[], bool], timeout_s: float = 300) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out while preparing screenshots")
        loop = QEventLoop()
        QTimer.singleShot(20, loop.quit)
        loop.exec()  # releases the GIL, unlike QTest.qWait


def render(out_dir: Path) -> list[Path]:
    """Drive the window through chat, embeddings and profiling, then grab each tab."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from gui import theme
    from gui.conversations import ConversationStore
    from gui.main_window import MainWindow
    from gui.settings import Settings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    theme.apply(app)
    tmp = Path(tempfile.mkdtemp(prefix="inferdesk-shots-"))
    w = MainWindow(Settings(QSettings(str(tmp / "settings.ini"), QSettings.Format.IniFormat)),
                   ConversationStore(tmp / "conversations.sqlite3"), autoload=True)
    try:
        return _drive(w, out_dir)
    finally:
        w.close()  # stops the workers and closes the store, whatever happened


def _drive(w, out_dir: Path) -> list[Path]:  # noqa: ANN001 - a MainWindow
    w.resize(*SIZE)
    w.show()
    _wait(lambda: {"causal", "encoder"} <= set(w.picker.loaded) or w.banner.isVisible())
    if w.banner.isVisible():
        raise RuntimeError(w.banner.text())

    done: list[object] = []
    w.chat.generation_finished.connect(done.append)

    def ask(text: str, max_tokens: int) -> None:
        n = len(done)
        w.chat.sampling.set_values({"max_tokens": max_tokens, "temperature": 0.2, "seed": 7})
        w.chat.send(text)
        _wait(lambda: len(done) > n)

    w.perf.profile_box.setChecked(True)
    w.tabs.setCurrentWidget(w.perf)
    w.chat.new_conversation()
    for q in ("What is a large language model?", "Name three uses of embeddings."):
        ask(q, 24)
    w.perf.profile_box.setChecked(False)
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    ask("Give me three tips for writing clear code, as a Markdown list with **bold** "
        "keywords.", 120)

    w.tabs.setCurrentWidget(w.embed)
    w.embed.set_sentences(SENTENCES)
    w.embed.embed()
    _wait(lambda: w.embed.result is not None and not w.embed.embedding)
    w.embed.query_box.setText("a sleepy cat")
    w.embed.query()
    _wait(lambda: w.embed.results.count() > 0)

    # The Compare tab after a short run: the bundled chat model on the reference backend
    # against the cpu backend.
    pane = w.compare
    _wait(lambda: pane.model_path is not None and bool(pane.backend_infos))
    for combo, name in zip((pane.combo_a, pane.combo_b), ("numpy", "cpu"), strict=True):
        combo.setCurrentIndex(combo.findData(name))
    pane.tokens.setValue(24)
    pane.run()
    _wait(lambda: not pane.running)
    if pane.summary is None:
        raise RuntimeError(pane.message.text())

    out_dir.mkdir(parents=True, exist_ok=True)
    w.resize(*SIZE)
    saved = []
    try:
        for scheme in THEMES:
            w.set_theme(scheme)
            for i in range(w.tabs.count()):
                w.tabs.setCurrentIndex(i)
                _settle()
                name = w.tabs.tabText(i).lower().replace(" ", "-")
                path = out_dir / f"{name}-{SIZE[0]}x{SIZE[1]}-{scheme}.png"
                w.grab().save(str(path), "PNG", 0)  # 0 = smallest file
                saved.append(path)
    finally:
        w.set_theme("system")
    return saved


def _settle(ms: int = 600) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "resources" \
        / "screenshots"
    for path in render(out):
        print(f"{path} ({path.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
