"""Performance: live graphs (>= 4 Hz) of tok/s, TTFT, memory; backend and per-op times."""

from __future__ import annotations

import math
import time
from collections import deque

import numpy as np
import psutil
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui.worker import LoadedInfo, WorkerHandle

SAMPLE_MS = 200  # 5 Hz: live graphs need at least 4 samples a second
WINDOW_S = 60  # seconds of history on the time axes
TTFT_KEEP = 50  # messages shown in the TTFT chart
MB = 1024 * 1024
COLORS = {"decode": "#2563eb", "prefill": "#7c3aed", "ttft": "#f59e0b",
          "device_used": "#059669", "device_peak": "#b91c1c", "host_rss": "#6b7280"}


def _mb(n: int | None) -> float:
    return math.nan if n is None else n / MB


def nice_ceiling(x: float) -> float:
    """Smallest 1, 2 or 5 x 10^k at or above ``x``: y ranges change in visible steps only,
    so the axes (the costliest thing pyqtgraph paints) are redrawn rarely."""
    if not math.isfinite(x) or x <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(x))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= x)


class PerfPane(QWidget):
    profile_changed = Signal(bool)

    def __init__(self, handle: WorkerHandle, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.t0 = time.monotonic()
        self.generating = False
        self.decode = math.nan  # latest rates of the running generation
        self.prefill = math.nan
        self.device: tuple[int | None, int | None] = (None, None)  # used, peak
        self._proc = psutil.Process()
        self.series: dict[str, deque] = {
            k: deque(maxlen=WINDOW_S * 1000 // SAMPLE_MS)
            for k in ("t", "decode", "prefill", "device_used", "device_peak", "host_rss")}
        self.ttfts: deque = deque(maxlen=TTFT_KEEP)
        self.n_messages = 0
        self.n_samples = 0
        self.loaded: dict[str, LoadedInfo] = {}
        self._build()
        handle.busy.connect(self._on_busy)
        handle.token.connect(self._on_token)
        handle.generated.connect(self._on_done)
        handle.memory.connect(self._on_memory)
        handle.loaded.connect(self._on_loaded)
        handle.unloaded.connect(self._on_unloaded)
        self.timer = QTimer(self, interval=SAMPLE_MS)
        self.timer.timeout.connect(self.sample)
        self.timer.start()

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.backend_label = QLabel("Backend: none loaded")
        self.backend_label.setWordWrap(True)
        self.backend_label.setTextFormat(Qt.TextFormat.RichText)
        self.last_label = QLabel("")
        self.last_label.setObjectName("Hint")
        layout.addWidget(self.backend_label)
        layout.addWidget(self.last_label)

        split = QSplitter(Qt.Orientation.Horizontal)
        self.graphs = pg.GraphicsLayoutWidget()
        self.graphs.setBackground("w")
        self.curves: dict[str, pg.PlotDataItem] = {}

        self.time_plots: dict[str, tuple[pg.PlotItem, tuple[str, ...]]] = {}
        self._ymax: dict[str, float] = {}
        self._empty: set[str] = set()

        def plot(row: int, col: int, title: str, unit: str) -> pg.PlotItem:
            p = self.graphs.addPlot(row=row, col=col, title=title)
            p.showGrid(x=True, y=True, alpha=0.2)
            p.setLabel("left", unit)
            p.setMouseEnabled(x=False, y=False)
            p.hideButtons()
            return p

        def time_plot(row: int, col: int, title: str, unit: str, keys: tuple[str, ...]
                      ) -> pg.PlotItem:
            # x is "seconds ago" on a fixed range: only the curves move from frame to frame.
            p = plot(row, col, title, unit)
            p.disableAutoRange()
            p.setXRange(-WINDOW_S, 0, padding=0)
            p.setYRange(0, 1, padding=0)
            p.setLabel("bottom", "seconds ago")
            self.time_plots[title] = (p, keys)
            return p

        def curve(p: pg.PlotItem, key: str, name: str) -> None:
            self.curves[key] = p.plot([], [], pen=pg.mkPen(COLORS[key], width=2), name=name,
                                      connect="finite")

        decode = time_plot(0, 0, "Decode", "tok/s", ("decode",))
        curve(decode, "decode", "decode tok/s")
        prefill = time_plot(0, 1, "Prefill", "tok/s", ("prefill",))
        curve(prefill, "prefill", "prefill tok/s")
        self.ttft_plot = plot(1, 0, "Time to first token per message", "s")
        self.ttft_plot.setLabel("bottom", "message")
        self.ttft_plot.getAxis("bottom").setTickSpacing(major=5, minor=1)
        self.ttft_bars = pg.BarGraphItem(x=[], height=[], width=0.6,
                                         brush=COLORS["ttft"], pen=None)
        self.ttft_plot.addItem(self.ttft_bars)
        mem = time_plot(1, 1, "Memory", "MiB", ("device_used", "device_peak", "host_rss"))
        self.mem_legend = mem.addLegend(offset=(-5, 5))
        curve(mem, "device_used", "device used")
        curve(mem, "device_peak", "device peak")
        curve(mem, "host_rss", "host RSS")
        self.mem_plot = mem
        self.has_device = True
        self._show_device(False)  # until a backend reports device memory
        split.addWidget(self.graphs)

        ops = QGroupBox("Per-op timing (last message)")
        ov = QVBoxLayout(ops)
        self.profile_box = QCheckBox("Profile ops (synchronises every op: slower)")
        self.profile_box.toggled.connect(self.profile_changed)
        self.op_table = QTableWidget(0, 3)
        self.op_table.setHorizontalHeaderLabels(("Op", "Time (ms)", "Share"))
        self.op_table.verticalHeader().setVisible(False)
        self.op_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.op_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        ov.addWidget(self.profile_box)
        ov.addWidget(self.op_table)
        split.addWidget(ops)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        split.setSizes([900, 300])
        row = QHBoxLayout()
        row.addWidget(split)
        layout.addLayout(row, 1)

    # --- sampling --------------------------------------------------------------------
    def sample(self) -> None:
        """One point on every time series (runs on the GUI timer, so it costs ~0.1 ms)."""
        s = self.series
        self.n_samples += 1
        s["t"].append(time.monotonic() - self.t0)
        s["decode"].append(self.decode if self.generating else math.nan)
        s["prefill"].append(self.prefill if self.generating else math.nan)
        self._show_device(self.device[0] is not None)
        s["device_used"].append(_mb(self.device[0]))
        s["device_peak"].append(_mb(self.device[1]))
        s["host_rss"].append(self._proc.memory_info().rss / MB)
        if not self.isVisible():
            return  # keep collecting, skip drawing while hidden
        self.redraw()

    def _show_device(self, on: bool) -> None:
        """Device series appear only with data; without, the title says what is shown."""
        if on == self.has_device:
            return
        self.has_device = on
        for key, name in (("device_used", "device used"), ("device_peak", "device peak")):
            self.curves[key].setVisible(on)
            if on:
                self.mem_legend.addItem(self.curves[key], name)
            else:
                self.mem_legend.removeItem(self.curves[key])
        self.mem_plot.setTitle("Memory" if on else "Memory (no GPU device: showing process RAM)")

    def redraw(self) -> None:
        t = np.fromiter(self.series["t"], float)
        t = t - (t[-1] if len(t) else 0.0)
        keep = t >= -WINDOW_S
        t = t[keep]
        for title, (plot, keys) in self.time_plots.items():
            top = 0.0
            for key in keys:
                y = np.fromiter(self.series[key], float)[keep]
                finite = np.isfinite(y)
                if finite.any():
                    self.curves[key].setData(t, y, connect="finite", skipFiniteCheck=True)
                    top = max(top, float(y[finite].max()))
                    self._empty.discard(key)
                elif key not in self._empty:  # clear once; an empty curve needs no repaint
                    self.curves[key].setData([], [])
                    self._empty.add(key)
            ymax = nice_ceiling(top * 1.1)
            if self._ymax.get(title) != ymax:
                self._ymax[title] = ymax
                plot.setYRange(0, ymax, padding=0)

    def points(self) -> dict[str, int]:
        """Finite points per series (for tests and the status line)."""
        out = {k: int(np.isfinite(np.fromiter(v, float)).sum())
               for k, v in self.series.items() if k != "t"}
        out["ttft"] = len(self.ttfts)
        return out

    # --- events ----------------------------------------------------------------------
    def _on_busy(self, kind: str) -> None:
        if kind == "generate":
            self.generating, self.decode, self.prefill = True, math.nan, math.nan
        elif kind == "":
            self.generating = False

    def _on_token(self, ev: object) -> None:
        self.prefill = ev.prefill_tok_s
        if ev.index > 0 and ev.decode_tok_s > 0:
            self.decode = ev.decode_tok_s

    def _on_done(self, done: object) -> None:
        self.n_messages += 1
        if done.n_generated:
            self.ttfts.append((self.n_messages, done.ttft_s))
            x, h = zip(*self.ttfts, strict=True)
            self.ttft_bars.setOpts(x=list(x), height=list(h))
            self.ttft_plot.setXRange(x[0] - 0.5, x[-1] + 0.5, padding=0)
            self.ttft_plot.setYRange(0, nice_ceiling(max(h) * 1.1), padding=0)
        self.last_label.setText(
            f"Last message: {done.n_prompt} prompt tokens at {done.prefill_tok_s:.0f} tok/s, "
            f"{done.n_generated} generated at {done.decode_tok_s:.1f} tok/s, "
            f"TTFT {done.ttft_s * 1000:.0f} ms, total {done.total_s:.2f} s "
            f"({done.finish_reason})")
        if done.op_times_s:
            self._show_ops(done.op_times_s)

    def _show_ops(self, times: dict[str, float]) -> None:
        total = sum(times.values()) or 1.0
        rows = sorted(times.items(), key=lambda kv: -kv[1])
        self.op_table.setRowCount(len(rows))
        for r, (op, secs) in enumerate(rows):
            for c, text in enumerate((op, f"{secs * 1000:.1f}", f"{100 * secs / total:.1f} %")):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight
                                          | Qt.AlignmentFlag.AlignVCenter)
                self.op_table.setItem(r, c, item)

    def _on_memory(self, _backend: str, sample: object) -> None:
        self.device = (sample.device_used, sample.device_peak)

    def _on_loaded(self, info: LoadedInfo) -> None:
        self.loaded[info.kind] = info
        lines = []
        for kind, what in (("causal", "Chat"), ("encoder", "Embeddings")):
            i = self.loaded.get(kind)
            if i is not None:
                lines.append(f"<b>{what}:</b> {i.name} on <b>{i.backend}</b> &nbsp; "
                             f"<b>Why this backend:</b> {i.reason}")
        self.backend_label.setText("<br>".join(lines))

    def _on_unloaded(self, kind: str) -> None:
        self.loaded.pop(kind, None)
        if not self.loaded:
            self.backend_label.setText("Backend: none loaded")
