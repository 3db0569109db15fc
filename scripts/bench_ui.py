"""Benchmarks of the real window (offscreen), printed as JSON.

- How long the GUI thread's event loop can stall while the worker generates and embeds
  (the bundled models); the target is a max gap under 50 ms on a quiet machine. The suite
  only holds a 1 s sanity bound.
- ``--first-reply N``: the app started afresh, its chat model loaded as the app loads it
  (the bundled one, or ``--model``), then N messages sent in turn, each in a new
  conversation (a ~190-token passage after a different first word, so no reply reuses an
  earlier prompt), 32 tokens, greedy. Each reply's time to first token as the window sees
  it (Send to the first token on the GUI thread) and as the engine reports it; the target
  is the first reply within 1.5x the tenth. One fresh process per run.

    .venv/bin/python scripts/bench_ui.py [--runs 3] [--out docs/bench-results/ui.json]
    .venv/bin/python scripts/bench_ui.py --first-reply 10 [--model FILE] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/gui/test_responsiveness.py"
QT_PLATFORM = os.environ.get("QT_QPA_PLATFORM", "offscreen")  # the children's Qt platform


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


PASSAGE = (
    "the river that runs past the old mill has changed its course three times in the last "
    "century. Each time, the village moved a few streets with it: the bakery, the school "
    "and the small library that lends out tools as well as books. Older residents still "
    "give directions by the river's former banks, which confuses visitors but delights the "
    "children, who treat the town as a map of lost water. Last spring a student measured "
    "the silt in the abandoned channels and found layers from floods nobody remembered. "
    "She wrote that the town is not built beside the river so much as inside its memory. "
    "Summarise this passage in two sentences, then suggest a title for it.")
FIRST_WORDS = ("Look:", "Listen:", "Consider:", "Imagine:", "Note:", "Remember:", "Picture:",
               "Observe:", "Think:", "Read:", "See:", "Here:")


def _spin_until(cond, timeout_s: float) -> None:  # noqa: ANN001
    """Run the event loop (releasing the GIL while idle) until ``cond()`` holds."""
    from PySide6.QtCore import QEventLoop, QTimer

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s")
        loop = QEventLoop()
        QTimer.singleShot(5, loop.quit)
        loop.exec()


def first_reply_child(n: int, model: str | None, out: Path) -> None:
    """In this fresh process: the window, the chat model loaded, ``n`` replies timed."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from gui.conversations import ConversationStore
    from gui.jobs import on_progress
    from gui.main_window import MainWindow
    from gui.settings import Settings
    from inference.events import TokenEvent

    app = QApplication.instance() or QApplication([])  # noqa: F841 (kept alive)
    started = time.perf_counter()
    settings = Settings(QSettings(str(out.parent / "settings.ini"), QSettings.Format.IniFormat))
    w = MainWindow(settings, ConversationStore(out.parent / "conv.sqlite3"),
                   autoload=model is None)
    w.resize(1280, 800)
    w.show()
    if model is not None:
        w.picker.load(model)
    _spin_until(lambda: "causal" in w.picker.loaded or w.banner.isVisible(), 600)
    if w.banner.isVisible():
        raise RuntimeError(w.banner.text())
    _spin_until(lambda: w.jobs.job == "", 600)
    loaded_s = time.perf_counter() - started
    first: list[float] = []
    on_progress(w.jobs, TokenEvent, lambda ev: first.append(time.perf_counter())
                if ev.index == 0 else None, "generate")
    w.chat.sampling.set_values({"max_tokens": 32, "temperature": 0.0})
    replies = []
    for i in range(n):
        w.chat.new_conversation()
        first.clear()
        sent = time.perf_counter()
        if not w.chat.send(f"{FIRST_WORDS[i % len(FIRST_WORDS)]} {PASSAGE}"):
            raise RuntimeError("the chat pane did not send the message")
        _spin_until(lambda: bool(first), 600)
        _spin_until(lambda: w.jobs.job == "" and not w.chat.generating, 600)
        replies.append({"window_ttft_s": round(first[0] - sent, 4),
                        "engine_ttft_s": round(w.perf.ttfts[-1][1], 4)})
    out.write_text(json.dumps({"start_to_loaded_s": round(loaded_s, 3), "replies": replies}))
    w.close()


def first_reply(args: argparse.Namespace) -> dict:
    """Fresh processes of :func:`first_reply_child`; the first reply against the tenth."""
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "first-reply.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--first-reply-child",
                   str(args.first_reply), "--out", str(path)]
            if args.model:
                cmd += ["--model", args.model]
            env = {**os.environ, "QT_QPA_PLATFORM": QT_PLATFORM}
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if proc.returncode or not path.exists():
                raise SystemExit(f"the app run failed:\n{proc.stderr[-3000:]}")
            run = json.loads(path.read_text())
        for key in ("window_ttft_s", "engine_ttft_s"):
            ttfts = [r[key] for r in run["replies"]]
            run[f"{key}_first_over_last"] = round(ttfts[0] / ttfts[-1], 3)
        runs.append(run)
    return {"bench": "app first reply", "replies_per_run": args.first_reply,
            "model": args.model or "bundled", "target_first_over_tenth": 1.5, "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--first-reply", type=int, metavar="N",
                    help="instead: the app's first N replies after a start (see above)")
    ap.add_argument("--model", help="with --first-reply: a model file (default: bundled)")
    ap.add_argument("--first-reply-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.first_reply_child:
        first_reply_child(args.first_reply_child, args.model, args.out)
        return 0
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(),
               "load_avg_start": os.getloadavg()[0]}
    if args.first_reply:
        _report({**first_reply(args), "date": time.strftime("%Y-%m-%d %H:%M"), **machine},
                args.out)
        return 0
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ui.json"
            env = {**os.environ, "INFERDESK_UI_BENCH_JSON": str(path),
                   "QT_QPA_PLATFORM": QT_PLATFORM}
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                   "no:cacheprovider", TEST], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            if not path.exists():
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return 1
            runs.append(json.loads(path.read_text()))
    _report({"bench": "ui", "date": time.strftime("%Y-%m-%d"), **machine,
             "target_max_gap_ms": 50, "runs": runs}, args.out)
    return 0


def _report(result: dict, out: Path | None) -> None:
    """Print ``result`` as JSON, and write it to ``out`` if given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
