"""Typed access to QSettings: last models, backend, sampling, extra model paths."""

from __future__ import annotations

from PySide6.QtCore import QSettings

SAMPLING_DEFAULTS: dict[str, float | int] = {
    "temperature": 0.7,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "max_tokens": 256,
    "seed": -1,  # -1 = a new random seed each time
}
# Valid range of each sampling value; the sampling panel's boxes use the same bounds.
SAMPLING_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_k": (0, 1000),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (1.0, 2.0),
    "max_tokens": (1, 32768),
    "seed": (-1, 2**31 - 1),
}
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
DEFAULT_CONTEXT = 4096  # tokens a chat may use until the user sets it in Models
CONTEXT_RANGE = (256, 1 << 20)
INT_RANGE = (-(1 << 31), (1 << 31) - 1)  # what a Qt int (a spin box, an index) can hold


class Settings:
    """Thin wrapper so widgets never spell keys or parse QSettings' strings themselves."""

    def __init__(self, qsettings: QSettings | None = None):
        self.q = qsettings if qsettings is not None else QSettings()

    def get(self, key: str, default=None, type_=None):  # noqa: ANN001 - mirrors QSettings
        if type_ is None:
            return self.q.value(key, default)
        value = self.q.value(key, default)
        if value is None:
            return default
        if type_ is bool and isinstance(value, str):  # IniFormat stores "true"/"false"
            return value.lower() == "true"
        if type_ is int:  # clamped to what Qt's int takes: no widget ever overflows
            return int(self.number(key, default if default is not None else 0, *INT_RANGE))
        try:
            return type_(value)
        except (TypeError, ValueError):
            return default

    def set(self, key: str, value) -> None:  # noqa: ANN001
        self.q.setValue(key, value)

    def remove(self, key: str) -> None:
        self.q.remove(key)

    def context(self) -> int:
        """Tokens a chat may use (the KV cache is sized for it), as set in Models."""
        return int(self.number("models/context", DEFAULT_CONTEXT, *CONTEXT_RANGE))

    def number(self, key: str, default: float | int, lo: float, hi: float) -> float | int:
        """A number clamped to [lo, hi]; unreadable or NaN values give ``default`` (a
        hand-edited settings file must never stop the app from starting)."""
        try:
            value = float(self.q.value(key, default))
        except (TypeError, ValueError, OverflowError):
            return default
        if value != value:  # NaN
            return default
        value = min(max(value, lo), hi)
        return int(value) if isinstance(default, int) else value

    def sampling(self) -> dict[str, float | int]:
        return {k: self.number(f"sampling/{k}", v, *SAMPLING_RANGES[k])
                for k, v in SAMPLING_DEFAULTS.items()}

    def set_sampling(self, values: dict[str, float | int]) -> None:
        for k, v in values.items():
            self.set(f"sampling/{k}", v)

    def extra_paths(self) -> list[str]:
        value = self.q.value("models/extra_paths", [])
        if isinstance(value, str):  # a one-element list comes back as a string
            value = [value]
        return [str(p) for p in value or []]

    def add_extra_path(self, path: str) -> None:
        paths = self.extra_paths()
        if path not in paths:
            self.set("models/extra_paths", paths + [path])

    def remove_extra_path(self, path: str) -> None:
        self.set("models/extra_paths", [p for p in self.extra_paths() if p != path])

    def sync(self) -> None:
        self.q.sync()
