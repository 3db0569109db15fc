"""The cpu backend's thread count under another process's load: generations (a fresh
prompt each, so no prefix is reused) with the count chosen by ``adapt_threads`` against
pinned counts, in turns, first on a quiet machine, then with one busy-loop process (a
child that spins for at most ``--busy-seconds`` and is stopped after the phase). Per mode:
time to first token (the prefill) and decode tok/s, medians, and the counts chosen.
A benchmark, not a test: nothing is asserted. Writes JSON to docs/bench-results/.

    python scripts/bench_busy_threads.py [--model PATH] [--rounds 3] [--tokens 48]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import inference  # noqa: E402,F401  (before numpy: no BLAS pool of its own)

# isort: split
import numpy as np  # noqa: E402

from inference.api import load_model  # noqa: E402
from inference.bench import workloads, write_record  # noqa: E402
from inference.events import TokenEvent  # noqa: E402

BUSY = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--busy-seconds", type=float, default=300.0)
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    llm = load_model(args.model, backend="cpu")
    B = llm.backend
    limit = B._threads
    text = workloads()[0]
    count = [0]

    def generation() -> tuple[float, float, int]:
        count[0] += 1
        t0, first, n = time.perf_counter(), 0.0, 0
        for ev in llm.generate(prompt=f"Note {count[0]}. {text}", max_tokens=args.tokens):
            if isinstance(ev, TokenEvent):
                n += 1
                first = first or time.perf_counter()
        return first - t0, (n - 1) / (time.perf_counter() - first), B._threads

    modes = {"auto": None, f"pinned {limit}": limit, "pinned 1": 1}
    phases = {}
    for phase in ("quiet", "one busy process"):
        busy = None
        if phase != "quiet":
            busy = subprocess.Popen([sys.executable, "-c", BUSY.format(s=args.busy_seconds)])
            time.sleep(0.5)
        try:
            got: dict[str, list[tuple[float, float, int]]] = {m: [] for m in modes}
            for _ in range(args.rounds):
                for mode, n in modes.items():
                    if n is None:
                        B._auto = limit  # back to choosing (a pinned count stops it)
                    else:
                        B.set_threads(n)
                    for _ in range(2):  # auto: the first look starts the window
                        generation()
                    got[mode].append(generation())
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        phases[phase] = {m: {"ttft_ms": round(float(np.median([r[0] for r in rs])) * 1e3, 1),
                             "decode_tok_s": round(float(np.median([r[1] for r in rs])), 1),
                             "threads": [r[2] for r in rs]} for m, rs in got.items()}
        print(phase, phases[phase], flush=True)
    write_record(args.out, "busy-threads", "scripts/bench_busy_threads.py",
                 {"model": args.model, "max_threads": limit, "tokens": args.tokens,
                  "phases": phases})


if __name__ == "__main__":
    main()
