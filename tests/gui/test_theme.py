"""Light and dark themes follow the system's colour scheme."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette

from gui import theme
from tests.gui.conftest import spin


def test_dark_system_scheme_gives_the_dark_theme_and_back(app, make_window, monkeypatch
                                                          ) -> None:
    monkeypatch.delenv("INFERDESK_THEME", raising=False)
    hints = app.styleHints()
    system = {"scheme": Qt.ColorScheme.Dark}
    # The offscreen platform reports no scheme: stand in for the desktop's answer, and
    # send Qt's own change signal as a desktop switching to dark would.
    monkeypatch.setattr(theme, "system_scheme", lambda _app: system["scheme"])
    try:
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
        spin(50)
        assert theme.scheme(app) == "dark"
        assert "dark theme" in app.styleSheet()
        assert app.palette().color(QPalette.ColorRole.Window).lightness() < 80
        w = make_window()
        assert w.perf.graphs.backgroundBrush().color().lightness() < 80
        assert w.embed.heat_plot.backgroundBrush().color().lightness() < 80
        system["scheme"] = Qt.ColorScheme.Light  # the system switches back: so do we
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        spin(50)
        assert theme.scheme(app) == "light" and "light theme" in app.styleSheet()
        assert app.palette().color(QPalette.ColorRole.Window).lightness() > 170
    finally:
        system["scheme"] = Qt.ColorScheme.Unknown
        theme.apply(app)
    monkeypatch.setenv("INFERDESK_THEME", "dark")  # a forced choice wins
    assert theme.scheme(app) == "dark"
