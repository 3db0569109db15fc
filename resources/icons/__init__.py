"""Icons (SVG) used by the desktop app; see gui/theme.py."""
