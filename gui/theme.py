"""Icons, and the light or dark style sheet from resources/ following the system.

The scheme, first match wins: ``INFERDESK_THEME=light|dark``; the user's choice in
View > Theme (:func:`set_choice`: "light" or "dark"); else, for "system", the desktop's
(Qt's ``QStyleHints.colorScheme()``, followed live through ``colorSchemeChanged``, which
Qt emits when the platform reports a change). A choice is also passed to Qt
(``QStyleHints.setColorScheme``, Qt >= 6.8) so native parts follow it where the platform
honours the request. Plots made after a change use its colours.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPalette
from PySide6.QtWidgets import QApplication

import resources

RESOURCES = Path(resources.__file__).resolve().parent


@cache
def icon(name: str) -> QIcon:
    """``icon("send")`` -> resources/icons/send.svg (an empty icon if missing)."""
    path = RESOURCES / "icons" / f"{name}.svg"
    return QIcon(str(path)) if path.exists() else QIcon()


PLOT = {"light": {"background": "w", "foreground": "#374151", "label": "#111827",
                  "label_fill": "#ffffffd0"},
        "dark": {"background": "#1f2125", "foreground": "#d1d5db", "label": "#f3f4f6",
                 "label_fill": "#2a2d33d0"}}
_DARK_PALETTE = {
    QPalette.ColorRole.Window: "#1f2125", QPalette.ColorRole.WindowText: "#e5e7eb",
    QPalette.ColorRole.Base: "#2a2d33", QPalette.ColorRole.AlternateBase: "#26282d",
    QPalette.ColorRole.Text: "#e5e7eb", QPalette.ColorRole.Button: "#2a2d33",
    QPalette.ColorRole.ButtonText: "#e5e7eb", QPalette.ColorRole.ToolTipBase: "#2a2d33",
    QPalette.ColorRole.ToolTipText: "#e5e7eb", QPalette.ColorRole.Highlight: "#1e40af",
    QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.Link: "#93c5fd",
    QPalette.ColorRole.PlaceholderText: "#9ca3af",
}
CHOICES = ("system", "light", "dark")  # View > Theme; settings key "appearance/theme"
_current = {"scheme": "light", "choice": "system"}


def scheme(app: QApplication | None = None) -> str:
    """"light" or "dark": INFERDESK_THEME if set, else the user's choice, else (choice
    "system") the system's colour scheme."""
    forced = os.environ.get("INFERDESK_THEME", "").lower()
    if forced in PLOT:
        return forced
    if _current["choice"] in PLOT:
        return _current["choice"]
    return "dark" if system_scheme(app or QApplication.instance()) == Qt.ColorScheme.Dark \
        else "light"


def choice() -> str:
    """The user's choice: "system", "light" or "dark"."""
    return _current["choice"]


def set_choice(app: QApplication, value: str) -> str:
    """Make ``value`` ("system", "light" or "dark"; anything else counts as "system") the
    user's choice and restyle; returns the choice kept."""
    value = value if value in CHOICES else "system"
    _current["choice"] = value
    hints = app.styleHints()
    if hasattr(hints, "setColorScheme"):  # Qt >= 6.8: ask the platform too
        if value == "system":
            hints.unsetColorScheme()
        else:
            hints.setColorScheme(Qt.ColorScheme.Dark if value == "dark"
                                 else Qt.ColorScheme.Light)
    _apply_scheme(app)
    return value


def system_scheme(app: QApplication | None) -> Qt.ColorScheme:
    """The desktop's colour scheme as Qt reports it (Unknown where the platform does not
    say, e.g. offscreen)."""
    hints = app.styleHints() if app is not None else None
    return hints.colorScheme() if hints is not None else Qt.ColorScheme.Unknown


def plot_colors() -> dict[str, str]:
    """Colours for plots made now (the scheme last applied)."""
    return PLOT[_current["scheme"]]


def apply(app: QApplication) -> None:
    """Style sheet, palette, window icon and names (which QStandardPaths and QSettings use);
    the style follows the system's scheme from then on."""
    app.setOrganizationName("Inferdesk")
    app.setApplicationName("Inferdesk")
    app.setWindowIcon(icon("inferdesk"))
    _apply_scheme(app)
    hints = app.styleHints()
    if hasattr(hints, "colorSchemeChanged") and not getattr(app, "_inferdesk_follow", False):
        hints.colorSchemeChanged.connect(lambda _s: _apply_scheme(app))
        app._inferdesk_follow = True


def _apply_scheme(app: QApplication) -> None:
    import pyqtgraph as pg

    name = scheme(app)
    _current["scheme"] = name
    colors = PLOT[name]
    pg.setConfigOptions(background=colors["background"], foreground=colors["foreground"],
                        antialias=False)
    palette = QPalette()
    if name == "dark":
        for role, color in _DARK_PALETTE.items():
            palette.setColor(role, QColor(color))
    app.setPalette(palette if name == "dark" else app.style().standardPalette())
    qss = RESOURCES / "styles" / ("inferdesk-dark.qss" if name == "dark" else "inferdesk.qss")
    if qss.exists():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
