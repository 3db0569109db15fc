"""Performance: live graphs (sampled at >= 4 Hz) of tok/s, CPU, memory; TTFT and prefill
per message; backend and per-op times.

On a remote engine, tokens/s and time to first token are measured here from the stream
(network included); what only the server could report (its memory and CPU, prefill speed,
per-op times) is not drawn as an empty series: one line says what is missing.

Ten minutes of samples are kept; the graphs show a span of them (1–10 min) that can be
scrolled back and paused (sampling goes on while paused). Drawing follows the samples
within a share of the GUI thread's time (gui.pacing): a slow or busy machine sees the
graphs redrawn less often (at least once a second), not the model slowed by them.
Prefill is one point per message, drawn when it ends (at the first token), at the rate of
the tokens actually prefilled: tokens reused from the prompt cache are counted apart, not
as speed. Decode is a line while tokens stream.

In a small window the plots keep a readable size and the area scrolls; the per-op table
goes under the plots when the window is narrow.
"""

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
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QScrollBar,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui import theme
from gui.jobs import JobRunner, on_progress, on_result
from gui.pacing import RenderPacer
from gui.registry import MemoryReading
from gui.theme import plot_colors, style_plot
from gui.worker import LoadedInfo, Prefill, prefill_of

SAMPLE_MS = 200  # 5 Hz: live graphs need at least 4 samples a second
HISTORY_S = 600  # seconds of samples kept (ten minutes)
SPANS_S = (60, 120, 300, 600)  # what the time axes can show at once
TTFT_KEEP = 1000  # messages whose time to first token is kept
MB = 1024 * 1024
COLORS = {"decode": "#2563eb", "prefill": "#7c3aed", "ttft": "#f59e0b",
          "device_used": "#059669", "device_peak": "#b91c1c", "host_rss": "#6b7280",
          "cpu": "#0891b2"}
PLOT_MIN = (260, 150)  # px a plot keeps (width, height); below that the area scrolls
NARROW = 900  # px: narrower than this, the per-op table goes under the plots
OPS_HINT = ("Tick “Profile ops” and send a message: this table then shows where that "
            "message's time went, op by op.")


def _mb(n: int | None) -> float:
    return math.nan if n is None else n / MB


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _threads_note(threads: tuple[int, int] | None) -> str:
    """The last message's compute threads, where the backend chose them; why, when fewer."""
    if threads is None:
        return ""
    used, most = threads
    if used < most:
        return f"; {used} of {most} threads (other processes keep cores busy)"
    return f"; {used} thread{'s' if used > 1 else ''}"


def nice_ceiling(x: float) -> float:
    """Smallest 1, 2 or 5 x 10^k at or above ``x``: y ranges change in visible steps only,
    so the axes (the costliest thing pyqtgraph paints) are redrawn rarely."""
    if not math.isfinite(x) or x <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(x))
    return next(m * exp for m in (1, 2, 5, 10) if m * exp >= x)


class PerfPane(QWidget):
    profile_changed = Signal(bool)

    def __init__(self, jobs: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.t0 = time.monotonic()
        self.generating = False
        self.decode = math.nan  # latest decode rate of the running generation
        self.device: tuple[int | None, int | None] = (None, None)  # used, peak
        self._proc = psutil.Process()
        self._proc.cpu_percent()  # the first call starts the measurement
        self._ncpu = psutil.cpu_count() or 1
        self.series: dict[str, deque] = {
            k: deque(maxlen=HISTORY_S * 1000 // SAMPLE_MS)
            for k in ("t", "decode", "device_used", "device_peak", "host_rss", "cpu")}
        self.prefills: deque = deque(maxlen=TTFT_KEEP)  # (time, tok/s): one per message
        self.ttfts: deque = deque(maxlen=TTFT_KEEP)
        self.paused_at: float | None = None  # the graphs stand still at this time
        self.n_messages = 0
        self.n_samples = 0
        self.loaded: dict[str, LoadedInfo] = {}
        self.local = True  # a model runs in this process: its memory and CPU are ours to show
        self._build()
        from inference.events import TokenEvent

        jobs.busy.connect(self._on_busy)
        on_progress(jobs, TokenEvent, self._on_token, "generate")
        on_progress(jobs, Prefill, self._on_prefilled, "generate")
        on_progress(jobs, MemoryReading, self._on_memory)
        on_result(jobs, "generate", self._on_done)
        on_result(jobs, "load", self._on_loaded)
        on_result(jobs, "unload", self._on_unloaded)
        self._pacer = RenderPacer()
        self.timer = QTimer(self, interval=SAMPLE_MS)
        self.timer.timeout.connect(self.sample)
        self.timer.start()
        theme.on_change(self.restyle)

    def restyle(self) -> None:
        """The current scheme's colours on every plot (called when the theme changes; a
        hidden pane restyles when it is next shown, so a switch costs only what is seen)."""
        if not self.isVisible():
            self._restyle_due = True
            return
        self._restyle_due = False
        self.graphs.setBackground(plot_colors()["background"])
        for item in (self.decode_plot, self.prefill_plot, self.ttft_plot, self.mem_plot,
                     self.cpu_plot):
            style_plot(item)

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.backend_label = QLabel("Backend: none loaded")
        self.backend_label.setWordWrap(True)
        self.backend_label.setTextFormat(Qt.TextFormat.RichText)
        self.last_label = QLabel("")
        self.last_label.setObjectName("Hint")
        self.last_label.setWordWrap(True)  # a long line must not widen the window
        self.remote_label = QLabel("")
        self.remote_label.setObjectName("Hint")
        self.remote_label.setWordWrap(True)
        self.remote_label.setVisible(False)
        layout.addWidget(self.backend_label)
        layout.addWidget(self.remote_label)
        layout.addWidget(self.last_label)
        controls = QHBoxLayout()
        self.pause_button = QPushButton("Pause")
        self.pause_button.setCheckable(True)
        self.pause_button.setToolTip("Hold the graphs still (sampling goes on)")
        self.pause_button.toggled.connect(self.set_paused)
        self.span_combo = QComboBox()
        for span in SPANS_S:
            self.span_combo.addItem(f"last {span // 60} min", span)
        self.span_combo.setToolTip("How much history the graphs show (ten minutes are kept)")
        self.span_combo.currentIndexChanged.connect(self._on_span)
        self.scroll = QScrollBar(Qt.Orientation.Horizontal)
        self.scroll.setRange(0, 0)  # at its right end: the graphs follow the newest sample
        self.scroll.setToolTip("Scroll back through the last ten minutes")
        self.scroll.valueChanged.connect(lambda _v: self.redraw())
        controls.addWidget(self.pause_button)
        controls.addWidget(self.span_combo)
        controls.addWidget(self.scroll, 1)
        layout.addLayout(controls)

        self.split = split = QSplitter(Qt.Orientation.Horizontal)
        self.graphs = pg.GraphicsLayoutWidget()
        self.graphs.setBackground(plot_colors()["background"])
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
            p.setXRange(-SPANS_S[0], 0, padding=0)
            p.setYRange(0, 1, padding=0)
            p.setLabel("bottom", "seconds ago")
            self.time_plots[title] = (p, keys)
            return p

        def curve(p: pg.PlotItem, key: str, name: str) -> None:
            self.curves[key] = p.plot([], [], pen=pg.mkPen(COLORS[key], width=2), name=name,
                                      connect="finite")

        self.decode_plot = decode = time_plot(0, 0, "Decode", "tok/s", ("decode",))
        curve(decode, "decode", "decode tok/s")
        prefill = time_plot(0, 1, "Prefill (one point per message)", "tok/s", ())
        self.prefill_points = pg.ScatterPlotItem(size=8, pen=None,
                                                 brush=pg.mkBrush(COLORS["prefill"]))
        prefill.addItem(self.prefill_points)
        self.prefill_plot = prefill
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
        cpu = time_plot(2, 0, "CPU (this process, % of all cores)", "%", ("cpu",))
        curve(cpu, "cpu", "CPU %")
        self.cpu_plot = cpu
        self.has_device = True
        self._show_device(False)  # until a backend reports device memory
        self.graphs.setMinimumSize(2 * PLOT_MIN[0], 3 * PLOT_MIN[1])
        self.graph_area = QScrollArea()
        self.graph_area.setWidgetResizable(True)
        self.graph_area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.graph_area.setWidget(self.graphs)
        split.addWidget(self.graph_area)

        # Where each plot sits, so a remote engine can take out what it cannot fill.
        self.cells = {"prefill": (self.prefill_plot, 0, 1), "memory": (mem, 1, 1),
                      "cpu": (cpu, 2, 0)}
        ops = QGroupBox("Per-op timing (last message)")
        self.ops_box = ops
        ov = QVBoxLayout(ops)
        self.profile_box = QCheckBox("Profile ops (synchronises every op: slower)")
        self.profile_box.toggled.connect(self.profile_changed)
        self.ops_hint = QLabel(OPS_HINT)
        self.ops_hint.setObjectName("Hint")
        self.ops_hint.setWordWrap(True)
        ov.addWidget(self.ops_hint)
        self.op_table = QTableWidget(0, 3)
        self.op_table.setHorizontalHeaderLabels(("Op", "Time (ms)", "Share"))
        self.op_table.verticalHeader().setVisible(False)
        self.op_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.op_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.op_table.setMinimumHeight(48)  # under the plots in a small window: they come first
        ov.addWidget(self.profile_box)
        ov.addWidget(self.op_table)
        split.addWidget(ops)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        split.setSizes([900, 300])
        split.setChildrenCollapsible(False)
        layout.addWidget(split, 1)
        self._restyle_due = True  # styled when first shown

    def showEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._restyle_due:
            self.restyle()

    def resizeEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        """Side by side when wide; the per-op table under the plots when narrow."""
        want = Qt.Orientation.Vertical if self.width() < NARROW else Qt.Orientation.Horizontal
        if self.split.orientation() != want:
            self.split.setOrientation(want)
            self.split.setSizes([800, 200] if want == Qt.Orientation.Vertical else [900, 300])
        super().resizeEvent(event)

    # --- sampling --------------------------------------------------------------------
    def sample(self) -> None:
        """One point on every time series (runs on the GUI timer, so it costs ~0.1 ms)."""
        s = self.series
        self.n_samples += 1
        s["t"].append(time.monotonic() - self.t0)
        s["decode"].append(self.decode if self.generating else math.nan)
        # cpu_percent measures since its previous call: called on every sample, kept only
        # while a model runs in this process.
        cpu = self._proc.cpu_percent() / self._ncpu
        s["cpu"].append(cpu if self.local else math.nan)
        self._show_device(self.device[0] is not None)
        s["device_used"].append(_mb(self.device[0]))
        s["device_peak"].append(_mb(self.device[1]))
        s["host_rss"].append(self._proc.memory_info().rss / MB if self.local else math.nan)
        if not self.isVisible() or self.paused_at is not None or not self._pacer.due():
            return  # keep collecting; draw when shown, running, and within the GUI's share
        self.redraw()

    def span(self) -> int:
        return int(self.span_combo.currentData() or SPANS_S[0])

    def set_paused(self, on: bool) -> None:
        self.paused_at = (time.monotonic() - self.t0) if on else None
        self.pause_button.setText("Resume" if on else "Pause")
        if not on:
            self.scroll.setValue(self.scroll.maximum())
        self.redraw()

    def _on_span(self, *_: object) -> None:
        for plot, _keys in self.time_plots.values():
            plot.setXRange(-self.span(), 0, padding=0)
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
        """Draw the chosen span ending at the scroll position (the newest sample, or the
        pause time, when the bar is at its right end)."""
        t_all = np.fromiter(self.series["t"], float)
        now = self.paused_at if self.paused_at is not None else (
            t_all[-1] if len(t_all) else 0.0)
        oldest = t_all[0] if len(t_all) else now
        back_max = max(0, int(now - oldest - self.span()))
        self.scroll.blockSignals(True)
        at_end = self.scroll.value() >= self.scroll.maximum()
        self.scroll.setRange(0, back_max)
        self.scroll.setPageStep(self.span())
        if at_end:
            self.scroll.setValue(back_max)
        self.scroll.blockSignals(False)
        end = now - (back_max - self.scroll.value())
        t = t_all - end
        keep = (t >= -self.span()) & (t <= 0)
        t = t[keep]
        if self.prefills:
            px, py = (np.asarray(a, float) for a in zip(*self.prefills, strict=True))
            show = (px - end >= -self.span()) & (px <= end)
            self.prefill_points.setData(px[show] - end, py[show])
            top = float(py[show].max()) if show.any() else 0.0
            ymax = nice_ceiling(top * 1.1)
            if self._ymax.get("prefill") != ymax:
                self._ymax["prefill"] = ymax
                self.prefill_plot.setYRange(0, ymax, padding=0)
        for title, (plot, keys) in self.time_plots.items():
            if not keys or plot.scene() is None:
                continue  # drawn above (points, not a series), or taken out (remote)
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
        out["prefill"] = len(self.prefills)
        return out

    # --- events ----------------------------------------------------------------------
    def _on_busy(self, kind: str) -> None:
        if kind == "generate":
            self.generating, self.decode = True, math.nan
        elif kind == "":
            self.generating = False

    def _on_token(self, ev: object) -> None:
        if ev.index > 0 and ev.decode_tok_s > 0:
            self.decode = ev.decode_tok_s

    def _on_prefilled(self, p: Prefill) -> None:
        """The prompt is in: its point now, at the rate of the tokens prefilled."""
        if p.n_prefilled and p.tok_s > 0:
            self.prefills.append((time.monotonic() - self.t0, p.tok_s))
            if self.isVisible() and self.paused_at is None:
                self.redraw()

    def _on_done(self, done: object) -> None:
        if done is None:  # the engine ended without a summary
            return
        self.n_messages += 1
        p = prefill_of(done)
        cached = f", {p.n_cached} of them cached" if p.n_cached else ""
        if done.n_generated:
            self.ttfts.append((self.n_messages, done.ttft_s))
            x, h = zip(*self.ttfts, strict=True)
            self.ttft_bars.setOpts(x=list(x), height=list(h))
            self.ttft_plot.setXRange(x[0] - 0.5, x[-1] + 0.5, padding=0)
            self.ttft_plot.setYRange(0, nice_ceiling(max(h) * 1.1), padding=0)
        self.last_label.setText(
            f"Last message: {p.n_prompt} prompt tokens{cached}, {p.n_prefilled} prefilled at "
            f"{p.tok_s:.0f} tok/s, "
            f"{done.n_generated} generated at {done.decode_tok_s:.1f} tok/s, "
            f"TTFT {done.ttft_s * 1000:.0f} ms, total {done.total_s:.2f} s "
            f"({done.finish_reason}){_threads_note(done.threads)}")
        if done.op_times_s:
            self._show_ops(done.op_times_s)
            self.ops_hint.setText(f"Message {self.n_messages} (profiled). {OPS_HINT}")

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

    def _on_memory(self, reading: MemoryReading) -> None:
        self.device = (reading.sample.device_used, reading.sample.device_peak)

    def _on_loaded(self, info: LoadedInfo) -> None:
        self.loaded[info.kind] = info
        self._show_backends()

    def _show_backends(self) -> None:
        self._show_remote()
        if not self.loaded:
            self.backend_label.setText("Backend: none loaded")
            return
        lines = []
        for kind, what in (("causal", "Chat"), ("encoder", "Embeddings")):
            i = self.loaded.get(kind)
            if i is not None:
                lines.append(f"<b>{what}:</b> {i.name} on <b>{i.backend}</b> &nbsp; "
                             f"<b>Why this backend:</b> {i.reason}")
        self.backend_label.setText("<br>".join(lines))

    def _on_unloaded(self, kind: str) -> None:
        self.loaded.pop(kind, None)
        self._show_backends()

    def _show_remote(self) -> None:
        """Take out the plots a remote engine cannot fill, and say in one line which."""
        remote = [i for i in self.loaded.values() if i.remote]
        chat_remote = "causal" in self.loaded and self.loaded["causal"].remote
        self.local = not remote or len(remote) < len(self.loaded)
        hide = {"prefill"} if chat_remote else set()
        if not self.local:
            hide |= {"memory", "cpu"}
        for key, (plot, row, col) in self.cells.items():
            shown = plot.scene() is not None
            if key in hide and shown:
                self.graphs.removeItem(plot)
            elif key not in hide and not shown:
                self.graphs.addItem(plot, row=row, col=col)
        self.ops_box.setVisible(not chat_remote)
        missing = (["memory", "CPU"] if not self.local else []) + (
            ["prefill speed", "per-op times"] if chat_remote else [])
        self.remote_label.setVisible(bool(remote))
        if remote:
            urls = ", ".join(sorted({i.path for i in remote}))
            not_reported = (f"the server's {_and(missing)} are not reported; " if missing
                            else "the server's memory and CPU are not in the graphs, which "
                                 "show this process; ")
            measured = ("tokens/s and time to first token are measured here from the "
                        "stream (network included)." if chat_remote else "")
            self.remote_label.setText(f"Remote engine at {urls}: {not_reported}{measured}")
