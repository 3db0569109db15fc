"""Process memory (RSS) across the app's load jobs, one reply and one embedding, unload
of both bundled models, and a reload; ``off`` replaces the registry's release_memory (cycle
collection and malloc_trim after an unload) by nothing, for an A/B in separate processes.

    python tests/gui/measure_unload_memory.py on|off     # one JSON line
"""

from __future__ import annotations

import json
import sys
import threading
from types import SimpleNamespace

import psutil


def main(mode: str) -> dict:
    """The jobs run in this thread, on a context of their own (no runner, no Qt)."""
    from gui import registry
    from gui import worker as W

    if mode == "off":
        registry.release_memory = lambda: None

    def rss() -> int:
        return psutil.Process().memory_info().rss

    ctx = SimpleNamespace(models=registry.ModelRegistry(), cancel=threading.Event(),
                          progress=lambda _p: None)
    out = {"mode": mode, "start": rss()}
    W.load(ctx, "smollm2", "cpu", "")
    W.load(ctx, "minilm", "cpu", "")
    out["loaded"] = rss()
    W.generate(ctx, W.GenerateRequest([{"role": "user", "content": "Name three fruits."}], 16,
                                      {"temperature": 0.0, "seed": 1}, policy="rolling"))
    W.embed(ctx, ["a cat", "a dog"] * 50, 32)
    out["after_use"] = rss()
    W.unload(ctx, "causal")
    W.unload(ctx, "encoder")
    out["unloaded"] = rss()
    W.load(ctx, "smollm2", "cpu", "")
    out["reloaded"] = rss()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
