"""Human-readable numbers for labels and tables."""

from __future__ import annotations

from inference.units import human_bytes  # noqa: F401 - the app's labels use it from here


def human_count(n: int | None) -> str:
    """135_000_000 -> '135M' (parameter counts)."""
    if not n:
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            value = n / div
            return f"{value:.0f}{suffix}" if value >= 10 else f"{value:.1f}{suffix}"
    return str(n)


def message_stats(stats: dict) -> str:
    """One line under an assistant message: tokens, TTFT, tok/s (decode and overall)."""
    if not stats:
        return ""
    n = stats.get("n_generated", 0)
    parts = [f"{n} tokens"]
    if stats.get("n_prompt"):
        cached = stats.get("n_cached") or 0
        parts.append(f"prompt {stats['n_prompt']}" + (f" ({cached} cached)" if cached else ""))
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s'] * 1000:.0f} ms")
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.1f} tok/s")
    total = stats.get("total_s")
    if total and n:
        # Honest rate: includes the wait before the first token.
        parts.append(f"{n / total:.1f} tok/s overall")
    if stats.get("finish_reason") and stats["finish_reason"] not in ("eos", "stop"):
        parts.append(stats["finish_reason"])
    if stats.get("model"):
        parts.append(stats["model"])
    return " · ".join(parts)
