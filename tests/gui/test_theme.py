"""Light and dark themes follow the system's colour scheme."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette

from gui import theme
from tests.gui.conftest import spin


def test_dark_system_scheme_gives_the_dark_theme_and_back(app, monkeypatch) -> None:
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
        # Plots made now take this background; a window's own graphs are checked on the
        # dark-profile window of the next test (one window fewer to build and close).
        assert QColor(theme.plot_colors()["background"]).lightness() < 80
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


def test_the_users_choice_wins_over_the_system_and_is_remembered(app, make_window, tmp_path,
                                                                 monkeypatch) -> None:
    from tests.gui.conftest import make_settings

    monkeypatch.delenv("INFERDESK_THEME", raising=False)
    hints = app.styleHints()
    system = {"scheme": Qt.ColorScheme.Dark}
    monkeypatch.setattr(theme, "system_scheme", lambda _app: system["scheme"])
    w = make_window(tmp_path / "first")
    try:
        assert w.theme_actions["system"].isChecked()  # a fresh profile follows the system
        w.theme_actions["light"].trigger()  # View > Theme > Light
        assert w.settings.get("appearance/theme") == "light"
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # the desktop goes dark ...
        spin(50)
        assert theme.scheme(app) == "light" and "light theme" in app.styleSheet()  # ... no
        w.theme_actions["system"].trigger()  # follow the system again: dark at once
        assert "dark theme" in app.styleSheet()
        system["scheme"] = Qt.ColorScheme.Light
        hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
        spin(50)
        assert "light theme" in app.styleSheet()
        w.theme_actions["dark"].trigger()  # dark whatever the desktop says
        assert "dark theme" in app.styleSheet() and w.theme_actions["dark"].isChecked()
        # The choice is per profile and applied when a window opens on it.
        second = tmp_path / "second"
        second.mkdir()
        s = make_settings(second / "settings.ini")
        s.set("appearance/theme", "dark")
        s.sync()
        theme.set_choice(app, "system")
        assert "light theme" in app.styleSheet()
        w2 = make_window(second)
        assert theme.choice() == "dark" and w2.theme_actions["dark"].isChecked()
        assert "dark theme" in app.styleSheet()
        assert w2.perf.graphs.backgroundBrush().color().lightness() < 80
        assert w2.embed.heat_plot.backgroundBrush().color().lightness() < 80
    finally:
        system["scheme"] = Qt.ColorScheme.Unknown
        theme.set_choice(app, "system")


def test_an_icon_is_drawn_once_per_size_and_scheme(app, monkeypatch) -> None:
    """Buttons ask for their icon's pixmap at every repaint: the SVG is rendered once."""
    monkeypatch.setenv("INFERDESK_THEME", "light")
    theme.apply(app)
    icon = theme.icon("send")
    first = icon.pixmap(24, 24)
    assert icon.pixmap(24, 24).cacheKey() == first.cacheKey()
    assert icon.pixmap(32, 32).cacheKey() != first.cacheKey()
    monkeypatch.setenv("INFERDESK_THEME", "dark")
    theme.apply(app)
    try:
        dark = icon.pixmap(24, 24)
        assert dark.cacheKey() != first.cacheKey()
        ink = [dark.toImage().pixelColor(x, y) for x in range(24) for y in range(24)]
        assert max(c.lightness() for c in ink if c.alpha() > 200) > 150  # the dark ink
    finally:
        monkeypatch.setenv("INFERDESK_THEME", "light")
        theme.apply(app)
