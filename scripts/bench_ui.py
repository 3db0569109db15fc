"""Benchmark: how long the GUI thread's event loop can stall while the worker generates
and embeds (the real window offscreen, the bundled models). Prints JSON; the target is a
max gap under 50 ms on a quiet machine. The suite only holds a 1 s sanity bound.

    .venv/bin/python scripts/bench_ui.py [--runs 3] [--out docs/bench-results/ui.json]
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


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "ui.json"
            env = {**os.environ, "INFERDESK_UI_BENCH_JSON": str(path),
                   "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                   "no:cacheprovider", TEST], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            if not path.exists():
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return 1
            runs.append(json.loads(path.read_text()))
    result = {"bench": "ui", "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(),
              "cores": os.cpu_count(), "load_avg_start": os.getloadavg()[0],
              "target_max_gap_ms": 50, "runs": runs}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
