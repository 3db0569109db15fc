"""Process memory (RSS) across the app worker's load, one reply and one embedding, unload
of both bundled models, and a reload; ``off`` replaces the worker's release_memory (cycle
collection and malloc_trim after an unload) by nothing, for an A/B in separate processes.

    python tests/gui/measure_unload_memory.py on|off     # one JSON line
"""

from __future__ import annotations

import json
import sys
import threading

import psutil
from PySide6.QtCore import QCoreApplication


def main(mode: str) -> dict:
    app = QCoreApplication([])  # noqa: F841 - the worker's signals need an application
    from gui import worker as W

    if mode == "off":
        W.release_memory = lambda: None

    def rss() -> int:
        return psutil.Process().memory_info().rss

    w, ev = W.Worker(), threading.Event()
    out = {"mode": mode, "start": rss()}
    w.load("smollm2", "cpu", "", ev)
    w.load("minilm", "cpu", "", ev)
    out["loaded"] = rss()
    w.generate(W.GenerateRequest([{"role": "user", "content": "Name three fruits."}], 16,
                                 {"temperature": 0.0, "seed": 1}, policy="rolling"))
    w.embed(["a cat", "a dog"] * 50, 32, threading.Event())
    out["after_use"] = rss()
    w.unload("causal")
    w.unload("encoder")
    out["unloaded"] = rss()
    w.load("smollm2", "cpu", "", ev)
    out["reloaded"] = rss()
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
