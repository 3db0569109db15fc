"""Run Python's cyclic garbage collector on the GUI thread only, and not mid-generation.

CPython collects in whichever thread happens to allocate. If that is a worker thread and
the garbage holds Qt widgets, they are destroyed off the GUI thread and Qt crashes (the
approach of pyqtgraph's GarbageCollector). A full collection also holds the GIL for tens
of milliseconds, which would stall the event loop while tokens stream. So automatic
collection is switched off and a timer collects on the GUI thread instead, deferring the
oldest generation while the worker is generating or embedding.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QObject, QTimer

CHECK_MS = 250


class GuiThreadGC(QObject):
    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.threshold = gc.get_threshold()
        self.busy: Callable[[], bool] = lambda: False
        self.timer = QTimer(self, interval=CHECK_MS)
        self.timer.timeout.connect(self.check)

    def start(self) -> None:
        gc.disable()
        self.timer.start()

    def stop(self) -> None:
        """Collect once more here, on the GUI thread, and hand back to automatic GC."""
        self.timer.stop()
        gc.collect()
        gc.enable()

    def check(self) -> None:
        c0, c1, c2 = gc.get_count()
        t0, t1, t2 = self.threshold
        if c0 <= t0:
            return
        if c1 <= t1:
            gc.collect(0)
        elif c2 <= t2 or self.busy():
            gc.collect(1)
        else:
            gc.collect(2)


def freeze_heap() -> None:
    """Collect, then move every object alive (UI, modules, a just-loaded model) out of the
    collector's reach, so later full collections scan only new objects (a full pass over
    everything takes ~100 ms with the GIL held). Call on the GUI thread, when idle."""
    gc.collect()
    gc.freeze()


_guard: GuiThreadGC | None = None


def install(busy: Callable[[], bool] | None = None) -> GuiThreadGC:
    """Start the process-wide guard (once; it lives as long as the QApplication)."""
    global _guard
    if _guard is None:
        _guard = GuiThreadGC(QCoreApplication.instance())
        _guard.start()
    if busy is not None:
        _guard.busy = busy
    return _guard


def uninstall() -> None:
    global _guard
    if _guard is not None:
        _guard.stop()
        _guard.deleteLater()
        _guard = None
