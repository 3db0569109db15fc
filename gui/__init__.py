"""Inferdesk's desktop app (PySide6). Widgets only: all model work is a job on gui.jobs'
runner (the functions in gui.worker), on the models gui.registry owns.

Dependencies point one way: gui -> inference. Nothing in inference/ imports Qt.
"""

import inference  # noqa: F401 - first: its process settings must precede numpy's loading
from gui import _compat  # noqa: F401 - must run before any Qt call (see its docstring)
