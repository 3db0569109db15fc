"""Byte sizes: read from settings (``parse_bytes``) and written for the CLI's tables and the
app's labels (``human_bytes``), in binary units."""

from __future__ import annotations


def human_bytes(n: int | float | None) -> str:
    """1536 -> '1.5 KiB' (binary units, labelled as such); None -> '—' (unknown)."""
    if n is None:
        return "—"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1000' -> 1000, '4K' / '4KiB' / '4kb' -> 4096, '2.5M' -> 2621440 (binary units;
    negative sizes read as 0). ValueError for text that is not a size."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return max(0, int(float(t[: len(t) - len(unit)]) * _UNITS[unit]))
