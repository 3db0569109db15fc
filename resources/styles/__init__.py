"""Qt style sheets used by the desktop app; see gui/theme.py."""
