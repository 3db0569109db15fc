"""``python -m gui`` opens the desktop app."""

from gui.app import main

raise SystemExit(main())
