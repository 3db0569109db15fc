"""What a window shows cut off: shared by the offscreen and the real-window (Xvfb) tests.
Imports Qt only, so a driver process on another platform can use it."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractButton, QLabel, QWidget


def cut_off(root: QWidget) -> list[str]:
    """Visible buttons and one-line labels under ``root`` narrower than their text needs."""
    out = []
    for wdg in root.findChildren(QAbstractButton) + root.findChildren(QLabel):
        if not wdg.isVisible() or (isinstance(wdg, QLabel) and wdg.wordWrap()) \
                or not wdg.text():
            continue
        if wdg.width() + 1 < wdg.sizeHint().width():
            out.append(f"{type(wdg).__name__} {wdg.text()[:30]!r}: {wdg.width()} < "
                       f"{wdg.sizeHint().width()} px")
    return out


def plots_cut_off(perf: QWidget) -> list[str]:
    """Performance plots smaller than readable, or reaching past the graphs' area."""
    view = perf.graphs
    out = []
    for plot in (perf.decode_plot, perf.prefill_plot, perf.ttft_plot, perf.mem_plot,
                 perf.cpu_plot):
        rect = plot.sceneBoundingRect()
        if rect.width() < 200 or rect.height() < 120 or rect.right() > view.width() + 1 \
                or rect.bottom() > view.height() + 1:
            out.append(f"{plot.titleLabel.text}: {rect.width():.0f}x{rect.height():.0f} at "
                       f"{rect.right():.0f},{rect.bottom():.0f} in {view.width()}x{view.height()}")
    return out
