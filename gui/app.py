"""The Qt application: ``gui.app.main()`` builds the window and runs the event loop (the
`inferdesk` command and ``python -m gui`` reach it through gui.launcher's start-up check)."""

from __future__ import annotations

import logging
import sys

from PySide6.QtWidgets import QApplication

from gui import theme


def main(argv: list[str] | None = None) -> int:
    """Build the QApplication and the main window, run the event loop, return its code."""
    from gui.main_window import MainWindow

    argv = list(sys.argv if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication.instance() or QApplication(argv)
    theme.apply(app)
    window = MainWindow()
    window.show()
    return int(app.exec())


if __name__ == "__main__":
    raise SystemExit(main())
