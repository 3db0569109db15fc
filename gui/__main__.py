"""``python -m gui`` opens the desktop app (after the same start-up check as `inferdesk`)."""

from gui.launcher import open_app

raise SystemExit(open_app())
