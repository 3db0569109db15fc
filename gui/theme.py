"""Icons and the style sheet from resources/."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

import resources

RESOURCES = Path(resources.__file__).resolve().parent


@cache
def icon(name: str) -> QIcon:
    """``icon("send")`` -> resources/icons/send.svg (an empty icon if missing)."""
    path = RESOURCES / "icons" / f"{name}.svg"
    return QIcon(str(path)) if path.exists() else QIcon()


def apply(app: QApplication) -> None:
    """Style sheet, window icon and names (which QStandardPaths and QSettings use)."""
    app.setOrganizationName("Inferdesk")
    app.setApplicationName("Inferdesk")
    app.setWindowIcon(icon("inferdesk"))
    import pyqtgraph as pg

    # Plots follow the light theme (pyqtgraph defaults to black).
    pg.setConfigOptions(background="w", foreground="#374151", antialias=False)
    qss = RESOURCES / "styles" / "inferdesk.qss"
    if qss.exists():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
