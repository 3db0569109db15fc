"""Human-readable sizes for the CLI's tables and the app's labels."""

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
