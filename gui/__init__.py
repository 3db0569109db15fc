"""Inferdesk's desktop app (PySide6). Widgets only: all model work goes through gui.worker.

Dependencies point one way: gui -> inference. Nothing in inference/ imports Qt.
"""

import inference  # noqa: F401 - first: its process settings must precede numpy's loading
from gui import _compat  # noqa: F401 - must run before any Qt call (see its docstring)
