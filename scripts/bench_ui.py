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
- ``--streaming N``: what showing a streamed reply costs the engine. The chat model
  loaded as in ``--first-reply``, then N pairs of replies to a prompt asking for a long
  Markdown answer (256 tokens at most, temperature 0.7, a fixed seed), one with the chat
  shown and one with the window hidden, in turns: the engine's decode rate and the GUI
  thread's CPU time for each. One fresh process per run.

    .venv/bin/python scripts/bench_ui.py [--runs 3] [--out docs/bench-results/ui.json]
    .venv/bin/python scripts/bench_ui.py --first-reply 10 [--model FILE] [--runs 3]
    .venv/bin/python scripts/bench_ui.py --streaming 3 [--model FILE] [--runs 3]
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


def _window_with_chat_model(model: str | None, folder: Path):  # noqa: ANN202
    """The app's window, shown, with the chat model loaded as the app loads it."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from gui.conversations import ConversationStore
    from gui.main_window import MainWindow
    from gui.settings import Settings

    _window_with_chat_model.app = QApplication.instance() or QApplication([])  # kept alive
    settings = Settings(QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat))
    w = MainWindow(settings, ConversationStore(folder / "conv.sqlite3"),
                   autoload=model is None)
    w.resize(1280, 800)
    w.show()
    if model is not None:
        w.picker.load(model)
    _spin_until(lambda: "causal" in w.picker.loaded or w.banner.isVisible(), 600)
    if w.banner.isVisible():
        raise RuntimeError(w.banner.text())
    _spin_until(lambda: w.jobs.job == "", 600)
    return w


def first_reply_child(n: int, model: str | None, out: Path) -> None:
    """In this fresh process: the window, the chat model loaded, ``n`` replies timed."""
    from gui.jobs import on_progress
    from inference.events import TokenEvent

    started = time.perf_counter()
    w = _window_with_chat_model(model, out.parent)
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


LONG_ANSWER = ("Write a long Markdown guide to baking bread at home, with headings, bullet "
               "lists, a table of times and temperatures and a short code block.")


def streaming_child(n: int, model: str | None, out: Path) -> None:
    """In this fresh process: ``n`` replies with the chat shown and ``n`` with the window
    hidden, in turns; each reply's engine decode rate and the GUI thread's CPU time."""
    from gui.jobs import on_result

    w = _window_with_chat_model(model, out.parent)
    dones: list = []
    on_result(w.jobs, "generate", dones.append)
    w.chat.sampling.set_values({"max_tokens": 256, "temperature": 0.7, "seed": 5})
    replies = []
    for _ in range(n):
        for shown in (True, False):
            if shown:
                w.show()
                w.tabs.setCurrentWidget(w.chat)
            else:
                w.hide()
            w.chat.new_conversation()
            _spin_until(lambda: w.jobs.job == "", 600)
            cpu, wall = time.thread_time(), time.perf_counter()
            if not w.chat.send(LONG_ANSWER):
                raise RuntimeError("the chat pane did not send the message")
            _spin_until(lambda: w.jobs.job == "" and not w.chat.generating, 600)
            done = dones[-1]
            wall = time.perf_counter() - wall
            replies.append({"window": "shown" if shown else "hidden",
                            "tokens": done.n_generated,
                            "decode_tok_s": round(done.decode_tok_s, 2),
                            "gui_thread_cpu_s": round(time.thread_time() - cpu, 3),
                            "wall_s": round(wall, 3)})
    out.write_text(json.dumps({"replies": replies}))
    w.close()


def streaming(args: argparse.Namespace) -> dict:
    """Fresh processes of :func:`streaming_child`; decode shown over hidden, per pair."""
    runs = [_child_run(args, "--streaming-child", args.streaming, "streaming.json")
            for _ in range(args.runs)]
    for run in runs:
        r = run["replies"]
        run["decode_shown_over_hidden"] = [round(a["decode_tok_s"] / b["decode_tok_s"], 3)
                                           for a, b in zip(r[::2], r[1::2], strict=True)]
        run["gui_cpu_share_shown"] = [round(a["gui_thread_cpu_s"] / a["wall_s"], 3)
                                      for a in r[::2]]
    return {"bench": "app streaming shown vs hidden", "pairs_per_run": args.streaming,
            "model": args.model or "bundled", "runs": runs}


def _child_run(args: argparse.Namespace, flag: str, n: int, name: str) -> dict:
    """One fresh process of this script's ``flag`` child; what it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        cmd = [sys.executable, str(Path(__file__).resolve()), flag, str(n), "--out", str(path)]
        if args.model:
            cmd += ["--model", args.model]
        env = {**os.environ, "QT_QPA_PLATFORM": QT_PLATFORM}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode or not path.exists():
            raise SystemExit(f"the app run failed:\n{proc.stderr[-3000:]}")
        return json.loads(path.read_text())


def first_reply(args: argparse.Namespace) -> dict:
    """Fresh processes of :func:`first_reply_child`; the first reply against the tenth."""
    runs = []
    for _ in range(args.runs):
        run = _child_run(args, "--first-reply-child", args.first_reply, "first-reply.json")
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
    ap.add_argument("--streaming", type=int, metavar="N",
                    help="instead: N replies shown and N hidden, in turns (see above)")
    ap.add_argument("--model", help="with --first-reply or --streaming: a model file "
                    "(default: bundled)")
    ap.add_argument("--first-reply-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--streaming-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.first_reply_child:
        first_reply_child(args.first_reply_child, args.model, args.out)
        return 0
    if args.streaming_child:
        streaming_child(args.streaming_child, args.model, args.out)
        return 0
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(),
               "load_avg_start": os.getloadavg()[0]}
    for wanted, bench in ((args.first_reply, first_reply), (args.streaming, streaming)):
        if wanted:
            _report({**bench(args), "date": time.strftime("%Y-%m-%d %H:%M"), **machine},
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
