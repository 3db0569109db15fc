"""Icons, and the light or dark style sheet from resources/ following the system.

The scheme, first match wins: ``INFERDESK_THEME=light|dark``; the user's choice in
View > Theme (:func:`set_choice`: "light" or "dark"); else, for "system", the desktop's
(Qt's ``QStyleHints.colorScheme()``, followed live through ``colorSchemeChanged``, which
Qt emits when the platform reports a change). A choice is also passed to Qt
(``QStyleHints.setColorScheme``, Qt >= 6.8) so native parts follow it where the platform
honours the request. Everything follows a change live: the palette and style sheet, the
icons (drawn in the scheme's colour each time they are painted) and the plots (panes
register a restyle with :func:`on_change`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from functools import cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QPoint, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QIconEngine, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

import resources

RESOURCES = Path(resources.__file__).resolve().parent


ICON_INK = "#374151"  # the icons' line colour as drawn; the dark scheme draws it light
ICON_INK_DARK = "#d1d5db"
_ENGINES: list[QIconEngine] = []  # Qt owns each engine; Python keeps its wrapper alive


class _SchemeSvg(QIconEngine):
    """An SVG icon drawn in the current scheme's ink, so icons stay readable when the theme
    changes, without any widget setting its icon again. Each size, mode and scheme is
    rendered once: buttons ask for their pixmap at every repaint, and a streamed reply
    repaints the conversation's buttons many times a second."""

    def __init__(self, svg: str):
        super().__init__()
        self.svg = svg
        self._renderers: dict[str, QSvgRenderer] = {}
        self._pixmaps: dict[tuple, QPixmap] = {}

    def _renderer(self) -> QSvgRenderer:
        name = _current["scheme"]
        if name not in self._renderers:
            text = self.svg.replace(ICON_INK, ICON_INK_DARK) if name == "dark" else self.svg
            self._renderers[name] = QSvgRenderer(QByteArray(text.encode()))
        return self._renderers[name]

    def paint(self, painter: QPainter, rect: QRect, mode: QIcon.Mode,
              state: QIcon.State) -> None:
        if mode == QIcon.Mode.Disabled:
            painter.setOpacity(0.4)
        self._renderer().render(painter, QRectF(rect))

    def pixmap(self, size: QSize, mode: QIcon.Mode, state: QIcon.State) -> QPixmap:
        key = (size.width(), size.height(), mode, state, _current["scheme"])
        pm = self._pixmaps.get(key)
        if pm is None:
            pm = QPixmap(size)
            pm.fill(Qt.GlobalColor.transparent)
            p = QPainter(pm)
            self.paint(p, QRect(QPoint(0, 0), size), mode, state)
            p.end()
            self._pixmaps[key] = pm
        return pm

    def actualSize(self, size: QSize, mode: QIcon.Mode, state: QIcon.State) -> QSize:  # noqa: N802
        return size

    def clone(self) -> QIconEngine:
        twin = _SchemeSvg(self.svg)
        _ENGINES.append(twin)
        return twin


@cache
def icon(name: str) -> QIcon:
    """``icon("send")`` -> resources/icons/send.svg in the scheme's ink (an empty icon if
    missing)."""
    path = RESOURCES / "icons" / f"{name}.svg"
    if not path.exists():
        return QIcon()
    engine = _SchemeSvg(path.read_text(encoding="utf-8"))
    _ENGINES.append(engine)
    return QIcon(engine)


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
    # The bevel roles: left unset they stay white, and the style draws a white line
    # under the menu bar and around frames.
    QPalette.ColorRole.Light: "#3a3d44", QPalette.ColorRole.Midlight: "#33363c",
    QPalette.ColorRole.Mid: "#2a2d33", QPalette.ColorRole.Dark: "#18191c",
    QPalette.ColorRole.Shadow: "#111214",
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


_listeners: list[weakref.WeakMethod | Callable[[], None]] = []


def on_change(method: Callable[[], None]) -> None:
    """Call ``method`` (a bound method: held weakly, so a closed pane is not kept alive)
    after every change of scheme, once the new colours are in place."""
    _listeners.append(weakref.WeakMethod(method) if hasattr(method, "__self__") else method)


def _notify() -> None:
    alive = []
    for ref in _listeners:
        fn = ref() if isinstance(ref, weakref.WeakMethod) else ref
        if fn is None:
            continue
        try:
            fn()
        except RuntimeError:  # its widgets were deleted by Qt: forget it
            continue
        alive.append(ref)
    _listeners[:] = alive


def style_plot(plot: object, title: str | None = None) -> None:
    """Axes, grid labels, title and legend of a pyqtgraph PlotItem in the scheme's colours."""
    import pyqtgraph as pg

    fg = plot_colors()["foreground"]
    for side in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(side)
        axis.setPen(pg.mkPen(fg))
        axis.setTextPen(pg.mkPen(fg))
        if axis.label is not None and axis.labelText:
            axis.setLabel(axis.labelText, units=axis.labelUnits or None, color=fg)
    text = plot.titleLabel.text if title is None else title
    if text:
        plot.setTitle(text, color=fg)
    legend = getattr(plot, "legend", None)
    if legend is not None:
        legend.setLabelTextColor(fg)
        for _sample, label in legend.items:  # the labels already drawn keep theirs else
            label.setText(label.text, color=fg)


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
    _notify()
