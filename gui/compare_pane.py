"""Compare: the loaded chat model's file on two backends, side by side.

Backend A generates greedily; B is fed A's tokens, so every step compares the logits
after the same ids (:mod:`inference.compare`). The table fills as A generates and B
catches up; the plot shows the largest logit difference per step; the summary line gives
each side's decode tok/s and memory as measured, the largest difference and how often
the top-1 tokens agree.

The work is a job on the app's job runner (:mod:`gui.jobs`), queued behind a chat reply
rather than beside it: its function reports the engine's events and never touches a
widget.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gui.format import human_bytes
from gui.jobs import Job, JobContext, JobRunner, on_result
from gui.theme import plot_colors
from gui.worker import BackendInfo, LoadedInfo

log = logging.getLogger(__name__)
MAX_TOKENS = 512  # A's logits rows are held until B reaches them: tokens x vocab floats
DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."
COLUMNS = ("#", "Token", "max |Δ logit|", "Top-1", "A ms", "B ms")
DIFF_COLOR = "#b91c1c"


@dataclass
class CompareJob:
    path: str
    backend_a: str
    backend_b: str
    prompt: str
    max_tokens: int


def run_compare(ctx: JobContext, job: CompareJob) -> None:
    """The comparison's events as progress (on the runner's thread)."""
    from inference.compare import compare

    for ev in compare(job.path, job.backend_a, job.backend_b, job.prompt, job.max_tokens,
                      cancel=ctx.cancel):
        ctx.progress(ev)


def _ms(s: float) -> str:
    return f"{s * 1000:.1f}"


def _token_text(text: str, token_id: int, eos: bool = False) -> str:
    if eos:
        return "(end of text)"
    shown = text.replace("\n", "\\n").replace("\t", "\\t")
    return f"“{shown}”" if shown else f"(id {token_id})"


def side_line(label: str, s: Any) -> str:
    """One side's figures: decode rate, median step, prefill, load, memory as measured."""
    decode = s.step_s[1:]
    rate = f"{s.decode_tok_s:.1f} tok/s" if decode else "one step only"
    median = f" (median step {_ms(statistics.median(decode))} ms)" if decode else ""
    mem = f"+{human_bytes(s.load_bytes)} at load, +{human_bytes(s.peak_bytes)} peak RSS"
    if s.memory.device_used is not None:
        mem += f", device {human_bytes(s.memory.device_used)}"
        if s.memory.device_peak is not None:
            mem += f" (peak {human_bytes(s.memory.device_peak)})"
    return (f"{label} {s.backend}: {rate}{median} · prefill {_ms(s.prefill_s)} ms · "
            f"load {s.load_s:.1f} s, warm-up {s.warmup_s:.1f} s · {mem}")


def diff_line(summary: Any) -> str:
    n = summary.steps
    agree = round(summary.agreement * n)
    first = summary.first_disagreement
    where = "" if first is None else f", first differs at step {first}"
    end = "A's end-of-text token" if summary.finish == "eos" else "the token limit"
    return (f"Largest |Δ logit| {summary.max_abs_diff:.3g} at step {summary.worst_step} "
            f"({summary.max_rel_diff:.2g} of the logits' scale) · top-1 agrees at {agree} "
            f"of {n} step{'s' if n != 1 else ''}{where} · {summary.n_prompt} prompt tokens "
            f"({summary.prompt_kind}); ended at {end}.")


class ComparePane(QWidget):
    def __init__(self, jobs: JobRunner | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("Pane")
        self.model_path: str | None = None
        self.model_name = ""
        self.model_remote = False
        self.backend_infos: dict[str, BackendInfo] = {}
        self.job: Job | None = None
        self.summary: Any = None
        self.generated = 0  # A's steps so far in the running job
        self.compared = 0
        self.diffs: list[float] = []
        self._build()
        self.jobs = jobs if jobs is not None else JobRunner("inferdesk-compare", parent=self)
        self._own_runner = jobs is None
        if jobs is not None:
            on_result(jobs, "probe", self.set_backends)
            on_result(jobs, "load", self._on_loaded)
            on_result(jobs, "unload", self._on_unloaded)


    # --- layout ----------------------------------------------------------------------
    def _build(self) -> None:
        layout = QVBoxLayout(self)
        self.model_label = QLabel("Model: none loaded. Load a chat model in the Models tab; "
                                  "Compare runs its file on two backends.")
        self.model_label.setWordWrap(True)
        self.model_label.setMinimumWidth(20)
        layout.addWidget(self.model_label)

        row = QHBoxLayout()
        self.combo_a, self.combo_b = QComboBox(), QComboBox()
        self.combo_a.setToolTip("Backend A generates greedily")
        self.combo_b.setToolTip("Backend B is fed A's tokens and compared step by step")
        self.tokens = QSpinBox()
        self.tokens.setRange(1, MAX_TOKENS)
        self.tokens.setValue(32)
        self.tokens.setToolTip("Tokens A generates (fewer if it ends first)")
        self.run_button = QPushButton("Run")
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        for text, w in (("A", self.combo_a), ("B", self.combo_b), ("Tokens", self.tokens)):
            row.addWidget(QLabel(text))
            row.addWidget(w, 1 if isinstance(w, QComboBox) else 0)
        row.addWidget(self.run_button)
        row.addWidget(self.stop_button)
        layout.addLayout(row)

        self.prompt = QPlainTextEdit(DEFAULT_PROMPT)
        self.prompt.setPlaceholderText("A prompt, sent as one chat message")
        self.prompt.setFixedHeight(self.prompt.fontMetrics().lineSpacing() * 2 + 16)
        layout.addWidget(self.prompt)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setMinimumWidth(20)
        layout.addWidget(self.message)

        split = QSplitter(Qt.Orientation.Vertical)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        split.addWidget(self.table)
        self.plot = pg.PlotWidget()
        self.plot.setMinimumHeight(100)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setLabel("bottom", "step")
        self.plot.setLabel("left", "max |Δ logit|")
        self.plot.getAxis("left").enableAutoSIPrefix(False)  # plain 0.002, no "(x0.001)"
        self.curve = self.plot.plot([], [], pen=pg.mkPen(DIFF_COLOR, width=2), symbol="o",
                                    symbolSize=5, symbolBrush=DIFF_COLOR, symbolPen=None)
        split.addWidget(self.plot)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([220, 180])  # six table rows and a readable plot at 800x600
        layout.addWidget(split, 1)
        self.summary_labels = [QLabel(""), QLabel(""), QLabel("")]
        for lab in self.summary_labels:
            lab.setWordWrap(True)
            lab.setMinimumWidth(20)
            lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            layout.addWidget(lab)
        self._restyle_plot()

    def _restyle_plot(self) -> None:
        colors = plot_colors()
        self.plot.setBackground(colors["background"])
        for name in ("left", "bottom"):
            axis = self.plot.getAxis(name)
            axis.setPen(colors["foreground"])
            axis.setTextPen(colors["foreground"])

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        # The theme changes the application palette: the plot follows it live.
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.StyleChange):
            self._restyle_plot()
        super().changeEvent(event)

    # --- inputs ----------------------------------------------------------------------
    def set_backends(self, infos: list) -> None:
        """The backends the worker probed: all listed, unavailable ones marked (choosing
        one says why it cannot run). A defaults to numpy, the reference; B to another."""
        self.backend_infos = {i.name: i for i in infos}
        keep = (self.combo_a.currentData(), self.combo_b.currentData())
        for combo in (self.combo_a, self.combo_b):
            combo.clear()
            for i in infos:
                combo.addItem(i.name if i.available else f"{i.name} (unavailable)", i.name)
                combo.setItemData(combo.count() - 1, i.reason, Qt.ItemDataRole.ToolTipRole)
        ok = [i.name for i in infos if i.available]
        a = keep[0] if keep[0] in self.backend_infos else (
            "numpy" if "numpy" in ok else (ok[0] if ok else None))
        b = keep[1] if keep[1] in self.backend_infos else next(
            (n for n in ok if n != a), a)
        for combo, name in ((self.combo_a, a), (self.combo_b, b)):
            if name is not None:
                combo.setCurrentIndex(combo.findData(name))

    def set_model(self, path: str | None, name: str = "", remote: bool = False) -> None:
        self.model_path, self.model_name, self.model_remote = path, name, remote
        if path is None:
            self.model_label.setText("Model: none loaded. Load a chat model in the Models "
                                     "tab; Compare runs its file on two backends.")
        elif remote:
            self.model_label.setText(f"Model: {name} runs on a server; Compare needs a "
                                     f"local model file.")
        else:
            self.model_label.setText(f"Model: {name} (the chat model's file, loaded again "
                                     f"on each backend, one after the other)")

    def _on_loaded(self, info: LoadedInfo) -> None:
        if info.kind == "causal":
            self.set_model(info.path, info.name, info.remote)

    def _on_unloaded(self, kind: str) -> None:
        if kind == "causal":
            self.set_model(None)

    def _problem(self) -> str | None:
        """What stops a run, in one sentence, or None."""
        if self.model_path is None:
            return "Load a chat model first (Models tab): Compare runs its file."
        if self.model_remote:
            return "The chat model runs on a server: Compare needs a local model file."
        if not self.prompt.toPlainText().strip():
            return "Write a prompt to compare the backends on."
        if not self.backend_infos:
            return "The backends are still being checked; try again in a moment."
        for combo in (self.combo_a, self.combo_b):
            info = self.backend_infos.get(combo.currentData())
            if info is not None and not info.available:
                return f"Backend '{info.name}' is unavailable here: {info.reason}."
        return None

    # --- running ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.job is not None

    def run(self) -> None:
        if self.running:
            return
        problem = self._problem()
        if problem is not None:
            self.message.setText(problem)
            return
        spec = CompareJob(self.model_path or "", self.combo_a.currentData(),
                          self.combo_b.currentData(), self.prompt.toPlainText(),
                          self.tokens.value())
        self.summary = None
        self.generated = self.compared = 0
        self.diffs = []
        self.table.setRowCount(0)
        self.curve.setData([], [])
        for lab in self.summary_labels:
            lab.setText("")
        self.message.setText(f"Loading on {spec.backend_a}…")
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.job = job = self.jobs.submit("compare", run_compare, spec)
        job.progress.connect(self._on_event)
        job.error.connect(self._on_failed)
        job.cancelled.connect(self._on_cancelled)
        job.finished.connect(self._on_finished)

    def stop(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.message.setText("Stopping…")

    def _set(self, row: int, col: int, text: str, tip: str = "") -> None:
        item = QTableWidgetItem(text)
        if col != 1:
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if tip:
            item.setToolTip(tip)
        self.table.setItem(row, col, item)

    def _on_event(self, ev: Any) -> None:
        from inference.compare import (
            CompareSummary,
            Generated,
            SideLoaded,
            SideStarted,
            StepRecord,
        )

        job = self.job
        if job is None:
            return
        if isinstance(ev, SideStarted):
            self.message.setText(f"Loading on {ev.backend}…")
        elif isinstance(ev, SideLoaded):
            verb = "generating" if ev.side == "a" else "following A's tokens"
            self.message.setText(f"{ev.backend}: loaded in {ev.load_s:.1f} s; warming up, "
                                 f"then {verb}…")
        elif isinstance(ev, Generated):
            self.generated = ev.index + 1
            row = self.table.rowCount()
            self.table.insertRow(row)
            self._set(row, 0, str(ev.index))
            self._set(row, 1, _token_text(ev.text, ev.token_id, ev.eos),
                      f"token id {ev.token_id}")
            self._set(row, 4, _ms(ev.seconds))
            self.table.scrollToBottom()
        elif isinstance(ev, StepRecord):
            self.compared = ev.index + 1
            i = ev.index
            self._set(i, 2, f"{ev.max_abs_diff:.3g}",
                      f"{ev.max_abs_diff / ev.scale:.2g} of this step's largest |logit|"
                      if ev.scale > 0 else "")
            self._set(i, 3, "same" if ev.agree else f"B: {_token_text(ev.b_text, ev.b_token_id)}",
                      "" if ev.agree else f"B's most likely token, id {ev.b_token_id}")
            if not ev.agree:
                self.table.item(i, 3).setForeground(pg.mkColor(DIFF_COLOR))
            self._set(i, 5, _ms(ev.b_seconds))
            self.diffs.append(ev.max_abs_diff)
            self.curve.setData(list(range(len(self.diffs))), self.diffs)
            if self.compared % 8 == 0:
                self.table.scrollToItem(self.table.item(i, 0))
            self.message.setText(f"Compared {self.compared} of {self.generated} steps…")
        elif isinstance(ev, CompareSummary):
            self.summary = ev
            self.summary_labels[0].setText(side_line("A", ev.a))
            self.summary_labels[1].setText(side_line("B", ev.b))
            self.summary_labels[2].setText(diff_line(ev))
            self.message.setText(f"Done: {ev.steps} steps on {ev.model}; timings include "
                                 f"reading each step's logits back.")

    def _on_failed(self, message: str) -> None:
        self.message.setText(message)

    def _on_cancelled(self) -> None:
        if self.compared:
            self.message.setText(f"Stopped after comparing {self.compared} of "
                                 f"{self.generated} steps.")
        else:
            self.message.setText(f"Stopped after A generated {self.generated} "
                                 f"token{'s' if self.generated != 1 else ''}; nothing "
                                 f"compared yet.")

    def _on_finished(self) -> None:
        self.job = None
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def shutdown(self, timeout_ms: int = 20000) -> bool:
        """Stop the running comparison (and the pane's own runner, if it has one); False
        if that runner's job did not stop within ``timeout_ms``."""
        if self.job is not None:
            self.job.cancel()
        return self.jobs.shutdown(timeout_ms) if self._own_runner else True
