"""Sampling settings: temperature, top-k, top-p, min-p, repetition penalty, max tokens, seed."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QSpinBox, QWidget

from gui.settings import SAMPLING_DEFAULTS, SAMPLING_RANGES

# key: (label, step, decimals or None for an int box, tooltip); ranges: SAMPLING_RANGES
FIELDS = {
    "temperature": ("Temperature", 0.05, 2, "0 = greedy (always the likeliest token)"),
    "top_k": ("Top-k", 1, None, "Keep the k likeliest tokens; 0 = off"),
    "top_p": ("Top-p", 0.01, 2, "Keep the smallest set with this total probability"),
    "min_p": ("Min-p", 0.01, 2, "Drop tokens below this fraction of the top one"),
    "repetition_penalty": ("Repetition penalty", 0.01, 2, "1 = off"),
    "max_tokens": ("Max tokens", 16, None, "Longest reply"),
    "seed": ("Seed", 1, None, "-1 = random each time"),
}
NOT_IN_OPENAI = ("top_k", "min_p", "repetition_penalty")  # off for a remote engine
OFF = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


class SamplingPanel(QWidget):
    changed = Signal(dict)

    def __init__(self, values: dict | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        self.boxes: dict[str, QSpinBox | QDoubleSpinBox] = {}
        self.remote = False
        for key, (label, step, decimals, tip) in FIELDS.items():
            lo, hi = SAMPLING_RANGES[key]
            box = QSpinBox() if decimals is None else QDoubleSpinBox()
            if decimals is not None:
                box.setDecimals(decimals)
            box.setRange(lo, hi)
            box.setSingleStep(step)
            box.setToolTip(tip)
            box.setObjectName(key)
            if key == "seed":
                box.setSpecialValueText("random")
            box.valueChanged.connect(self._emit)
            form.addRow(label, box)
            self.boxes[key] = box
        self.set_values({**SAMPLING_DEFAULTS, **(values or {})})

    def values(self) -> dict[str, float | int]:
        return {k: box.value() for k, box in self.boxes.items()}

    def set_values(self, values: dict) -> None:
        for k, v in values.items():
            if k in self.boxes:
                self.boxes[k].blockSignals(True)
                self.boxes[k].setValue(v)
                self.boxes[k].blockSignals(False)
        self._emit()

    def set_remote(self, on: bool) -> None:
        """A remote engine takes the OpenAI API's fields only: the others are greyed and
        sent as off (their values stay for the next local model)."""
        self.remote = on
        for key in NOT_IN_OPENAI:
            self.boxes[key].setEnabled(not on)
            self.boxes[key].setToolTip(
                "Not in the OpenAI API: the remote engine samples without it" if on
                else FIELDS[key][3])

    def sampling_params(self) -> tuple[dict, int]:
        """(SamplingParams fields, max_tokens) for a generate request."""
        v = self.values()
        if self.remote:
            v.update(OFF)
        seed = int(v["seed"])
        return {
            "temperature": float(v["temperature"]),
            "top_k": int(v["top_k"]),
            "top_p": float(v["top_p"]),
            "min_p": float(v["min_p"]),
            "repetition_penalty": float(v["repetition_penalty"]),
            "seed": None if seed < 0 else seed,
        }, int(v["max_tokens"])

    def _emit(self, *_: object) -> None:
        self.changed.emit(self.values())
