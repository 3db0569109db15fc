"""Embeddings: paste sentences, embed with progress and Cancel, then explore the vectors.

Heavy numbers (similarities, projection, nearest neighbours, export) are computed by the
worker; this pane only draws: a heatmap of at most 400x400 pixels and one scatter.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gui import theme, worker
from gui.jobs import JobRunner
from gui.theme import icon, plot_colors, style_plot
from gui.worker import EmbedResult

SNIPPET = 60


NEIGHBOURS_K = 10  # neighbours shown by default (fewer when fewer were embedded)


def split_sentences(text: str) -> list[str]:
    """One sentence per line, each kept exactly, blank ones included, so row i of every
    result and export is line i (the rule of ``inferdesk embed``: a newline ending the
    text starts no new line; a CR before it is dropped)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def blank_rows(sentences: list[str]) -> list[int]:
    """Indices of the blank lines (embedded as the empty text they are)."""
    return [i for i, s in enumerate(sentences) if not s.strip()]


def _lines(rows: list[int]) -> str:
    """'line 5', 'lines 5 and 12', 'lines 5, 9 and 12 (and 3 more)': 1-based."""
    shown = [str(i + 1) for i in rows[:6]]
    more = f" (and {len(rows) - 6} more)" if len(rows) > 6 else ""
    if len(shown) == 1:
        return f"line {shown[0]}"
    return f"lines {', '.join(shown[:-1])} and {shown[-1]}{more}"


def _label(s: str, i: int) -> str:
    return s if s.strip() else f"(blank line {i + 1})"


def _snip(s: str, n: int = SNIPPET) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


class EmbedPane(QWidget):
    def __init__(self, jobs: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.jobs = jobs
        self.result: EmbedResult | None = None
        self.embedding = False
        self._build()
        jobs.failed.connect(self._on_failed)
        jobs.cancelled.connect(self._on_cancelled)
        self._restyle_due = False  # made in the current scheme's colours
        theme.on_change(self.restyle)

    def showEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._restyle_due:
            self.restyle()

    def restyle(self) -> None:
        """The current scheme's colours on both plots and their hover labels (a hidden
        pane restyles when it is next shown)."""
        if not self.isVisible():
            self._restyle_due = True
            return
        self._restyle_due = False
        colors = plot_colors()
        for plot in (self.heat_plot, self.scatter_plot):
            plot.setBackground(colors["background"])
            style_plot(plot.getPlotItem())
        bar_axis = self.colorbar.axis
        bar_axis.setPen(pg.mkPen(colors["foreground"]))
        bar_axis.setTextPen(pg.mkPen(colors["foreground"]))
        for label in (self.heat_label, self.scatter_label):
            label.setColor(colors["label"])
            label.fill = pg.mkBrush(colors["label_fill"])
            label.update()

    # --- layout ----------------------------------------------------------------------
    def _build(self) -> None:
        outer = QHBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        split = QSplitter(Qt.Orientation.Horizontal)
        outer.addWidget(split)

        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Paste sentences here, one per line.")
        self.count_label = QLabel("0 sentences")
        self.count_label.setObjectName("Hint")
        self._count_timer = QTimer(self, singleShot=True, interval=200)  # debounce big pastes
        self._count_timer.timeout.connect(self._count)
        self.input.textChanged.connect(self._count_timer.start)
        self.embed_button = QPushButton(icon("embeddings"), "Embed")
        self.embed_button.setObjectName("Primary")
        self.embed_button.clicked.connect(lambda: self.embed())
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m")
        self.status = QLabel("")
        self.status.setObjectName("Hint")
        self.status.setWordWrap(True)
        self.npy_button = QPushButton(icon("export"), "Export .npy…")
        self.npy_button.clicked.connect(lambda: self._export_dialog("npy"))
        self.csv_button = QPushButton(icon("export"), "Export .csv…")
        self.csv_button.clicked.connect(lambda: self._export_dialog("csv"))
        row = QHBoxLayout()
        row.addWidget(self.embed_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.count_label, 1)
        export_row = QHBoxLayout()
        export_row.addWidget(self.npy_button)
        export_row.addWidget(self.csv_button)
        lv.addWidget(self.input, 1)
        lv.addLayout(row)
        lv.addWidget(self.progress)
        lv.addWidget(self.status)
        lv.addLayout(export_row)

        right = QSplitter(Qt.Orientation.Vertical)
        colors = plot_colors()
        plots = QSplitter(Qt.Orientation.Horizontal)
        self.heat_plot = pg.PlotWidget(title="Cosine similarity", background=colors["background"])
        self.heat_plot.setAspectLocked(True)
        self.heat_plot.invertY(True)
        self.heat_plot.setLabel("bottom", "sentence")
        self.heat_plot.setLabel("left", "sentence")
        for side in ("bottom", "left"):  # sentence numbers, never "(x0.001)"
            self.heat_plot.getAxis(side).enableAutoSIPrefix(False)
        self.heat_plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0)
        self.heat_item = pg.ImageItem(axisOrder="row-major")
        self.heat_plot.addItem(self.heat_item)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=pg.colormap.get("viridis"),
                                        interactive=False, width=12)
        self.colorbar.setImageItem(self.heat_item, insert_in=self.heat_plot.getPlotItem())
        self.heat_label = pg.TextItem("", anchor=(0, 1), color=colors["label"],
                                     fill=colors["label_fill"])
        self.heat_label.setZValue(10)
        self.heat_label.setVisible(False)
        self.heat_plot.addItem(self.heat_label)
        self.heat_plot.scene().sigMouseMoved.connect(self._hover_heatmap)
        self.heat_plot.installEventFilter(self)  # hide the hover label when the mouse leaves

        self.scatter_plot = pg.PlotWidget(title="2-D projection (PCA)",
                                         background=colors["background"])
        self.scatter = pg.ScatterPlotItem(size=7, pen=pg.mkPen("#1e3a8a", width=0.5),
                                          brush=pg.mkBrush("#3b82f680"), hoverable=True,
                                          hoverSize=11, hoverBrush=pg.mkBrush("#f59e0b"),
                                          tip=None)
        self.scatter.sigHovered.connect(self._hover_scatter)
        self.hits = pg.ScatterPlotItem(size=11, pen=pg.mkPen("#b91c1c", width=2),
                                       brush=pg.mkBrush(None))
        self.scatter_label = pg.TextItem("", anchor=(0, 1), color=colors["label"],
                                        fill=colors["label_fill"])
        self.scatter_label.setZValue(10)
        self.scatter_label.setVisible(False)
        for item in (self.scatter, self.hits, self.scatter_label):
            self.scatter_plot.addItem(item)
        plots.addWidget(self.heat_plot)
        plots.addWidget(self.scatter_plot)

        search = QGroupBox("Nearest neighbours")
        sv = QVBoxLayout(search)
        qrow = QHBoxLayout()
        self.query_box = QLineEdit()
        self.query_box.setPlaceholderText("Type a query and press Enter")
        self.query_box.returnPressed.connect(lambda: self.query())
        self.k_box = QSpinBox()
        self.k_box.setRange(1, 1)
        self.k_box.setPrefix("k = ")
        self.k_box.setToolTip("How many neighbours to show (at most one fewer than the "
                              "sentences embedded)")
        self.query_button = QPushButton("Search")
        self.query_button.clicked.connect(lambda: self.query())
        qrow.addWidget(self.query_box, 1)
        qrow.addWidget(self.k_box)
        qrow.addWidget(self.query_button)
        self.results = QListWidget()
        # Room for several neighbours at once, whatever the window's height.
        self.results.setMinimumHeight(self.results.fontMetrics().height() * 6 + 8)
        sv.addLayout(qrow)
        sv.addWidget(self.results)
        right.addWidget(plots)
        right.addWidget(search)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 2)

        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 1)
        split.setSizes([320, 900])
        self._set_embedding(False)

    # --- actions ---------------------------------------------------------------------
    def sentences(self) -> list[str]:
        return split_sentences(self.input.toPlainText())

    def set_sentences(self, sentences: list[str]) -> None:
        self.input.setPlainText("\n".join(sentences))
        self._count()

    def embed(self, batch_size: int = 32) -> bool:
        sentences = self.sentences()
        if not any(s.strip() for s in sentences) or self.embedding:
            if not self.embedding and sentences:
                self.status.setText("Every line is blank: nothing to embed.")
            return False
        self._set_embedding(True)
        self.progress.setRange(0, len(sentences))
        self.progress.setValue(0)
        self.status.setText(f"Embedding {len(sentences)} lines…")
        job = self.jobs.submit("embed", worker.embed, list(sentences), batch_size)
        job.progress.connect(self._on_progress)
        job.result.connect(self._on_embedded)
        return True

    def cancel(self) -> None:
        if self.embedding:
            self.jobs.cancel("embed")

    def query(self, text: str | None = None, k: int | None = None) -> bool:
        """Search the embedded sentences; ``k`` defaults to the box (at most n - 1)."""
        text = (self.query_box.text() if text is None else text).strip()
        if not text or self.result is None:
            return False
        n = len(self.result.sentences)
        self.jobs.submit("query", worker.query, text,
                         max(1, min(k or self.k_box.value(), n - 1))
                         ).result.connect(self._on_neighbours)
        return True

    def export(self, path: str) -> None:
        """Save the last vectors: ``.csv`` with sentences, anything else as ``.npy``."""
        self.jobs.submit("export", worker.export, path).result.connect(
            lambda p: self.status.setText(f"Saved {p}"))

    def _export_dialog(self, fmt: str) -> None:
        filt = "NumPy array (*.npy)" if fmt == "npy" else "CSV (*.csv)"
        path, _ = QFileDialog.getSaveFileName(self, "Export embeddings", f"embeddings.{fmt}",
                                              filt)
        if path:
            self.export(path)

    def _set_embedding(self, on: bool) -> None:
        self.embedding = on
        self.embed_button.setEnabled(not on)
        self.cancel_button.setEnabled(on)
        have = self.result is not None and not on
        for w in (self.npy_button, self.csv_button, self.query_button):
            w.setEnabled(have)

    def _count(self) -> None:
        sentences = self.sentences()
        n, blank = len(sentences), len(blank_rows(sentences))
        self.count_label.setText(f"{n} sentence" + ("" if n == 1 else "s")
                                 + (f" ({blank} blank)" if blank else ""))

    # --- results ---------------------------------------------------------------------
    def _on_progress(self, p: object) -> None:
        if isinstance(p, worker.Progress):
            self.progress.setRange(0, max(p.total, 1))
            self.progress.setValue(p.done)

    def _on_embedded(self, result: EmbedResult) -> None:
        self.result = result
        n = len(result.sentences)
        self.k_box.setRange(1, max(1, n - 1))
        self.k_box.setValue(min(NEIGHBOURS_K, max(1, n - 1)))
        lo = float(np.min(result.heatmap))
        if lo > 0.999:  # one sentence (or identical ones): not the darkest colour
            lo = 0.0
        self.heat_item.setImage(result.heatmap, levels=(lo, 1.0))
        self.heat_item.setRect(0, 0, n, n)  # axes in sentences even when pixels are blocks
        self.colorbar.setLevels((lo, 1.0))
        self.heat_plot.setRange(xRange=(0, n), yRange=(0, n), padding=0.02)
        # Smaller points as they multiply, so a thousand stay apart.
        self.scatter.setSize(7 if n <= 200 else 5 if n <= 2000 else 3)
        self.scatter.setData(pos=result.projection, data=np.arange(n))
        self.hits.setData([], [])
        self.scatter_plot.autoRange()
        self.results.clear()
        self.progress.setValue(self.progress.maximum())
        rate = n / result.elapsed_s if result.elapsed_s > 0 else 0.0
        block = (f"; the heatmap is sampled: each pixel is the mean similarity of "
                 f"{result.block}×{result.block} sentences") if result.block > 1 else ""
        self.heat_plot.setTitle("Cosine similarity" + (
            f" (blocks of {result.block})" if result.block > 1 else ""))
        notes = []
        if blank := blank_rows(result.sentences):
            notes.append(f"{_lines(blank).capitalize()} {'is' if len(blank) == 1 else 'are'} "
                         "blank: embedded as empty text, so each row matches its line.")
        if result.cut:
            notes.append(f"{_lines(result.cut).capitalize()} "
                         f"{'was' if len(result.cut) == 1 else 'were'} longer than the "
                         f"model's window of {result.window:,} tokens: only the start "
                         "was embedded.")
        self.status.setText(f"{n} sentences × {result.vectors.shape[1]} dims in "
                            f"{result.elapsed_s:.2f} s ({rate:.0f}/s){block}"
                            + "".join(f"\n{note}" for note in notes))
        self._set_embedding(False)

    def _on_neighbours(self, found: worker.Neighbours) -> None:
        hits = found.hits
        self.results.clear()
        for sentence, score, i in hits:
            self.results.addItem(f"{score:.3f}   {_label(sentence, i)}")
        if self.result is not None:
            pts = [self.result.projection[i] for _s, _score, i in hits]
            self.hits.setData(pos=np.array(pts).reshape(-1, 2))

    def _on_failed(self, kind: str, message: str) -> None:
        if kind in ("embed", "query", "export"):
            self.status.setText(message)
            if kind == "embed":
                self._set_embedding(False)

    def _on_cancelled(self, kind: str) -> None:
        if kind == "embed":
            self.status.setText("Embedding cancelled.")
            self._set_embedding(False)

    def _hover_scatter(self, _item: object, points: list, _ev: object = None) -> None:
        if self.result is None or len(points) == 0:
            self.scatter_label.setVisible(False)
            return
        p = points[0]
        self.scatter_label.setText(_snip(self.result.sentences[int(p.data())]))
        # Open the label towards the middle of the view, so it is never cut at an edge.
        (x0, x1), (y0, y1) = self.scatter_plot.getPlotItem().vb.viewRange()
        pos = p.pos()
        self.scatter_label.setAnchor((1 if pos.x() > (x0 + x1) / 2 else 0,
                                      0 if pos.y() > (y0 + y1) / 2 else 1))
        self.scatter_label.setPos(pos)
        self.scatter_label.setVisible(True)

    def eventFilter(self, obj: object, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if obj is self.heat_plot and event.type() == QEvent.Type.Leave:
            self.heat_label.setVisible(False)
        return super().eventFilter(obj, event)

    def _hover_heatmap(self, scene_pos: object) -> None:
        r = self.result
        vb = self.heat_plot.getPlotItem().vb
        if r is None or not self.heat_plot.sceneBoundingRect().contains(scene_pos):
            self.heat_label.setVisible(False)
            return
        pt = vb.mapSceneToView(scene_pos)
        n = len(r.sentences)
        i, j = int(pt.y()), int(pt.x())
        if not (0 <= i < n and 0 <= j < n):
            self.heat_label.setVisible(False)
            return
        value = r.heatmap[min(i // r.block, len(r.heatmap) - 1),
                          min(j // r.block, len(r.heatmap) - 1)]
        self.heat_label.setText(f"{value:.2f}\n#{i} {_snip(r.sentences[i], 40)}\n"
                                f"#{j} {_snip(r.sentences[j], 40)}")
        self.heat_label.setPos(pt)
        self.heat_label.setVisible(True)
