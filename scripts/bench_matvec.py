"""Mat-vec speed of the cpu backend per weight type and activation mode (one row, or
``--rows`` rows per call as a batched decode step).

    python scripts/bench_matvec.py [--threads 1] [--rounds 7] [--out docs/bench-results]
                                   [--types Q2_K,Q3_K] [--shapes llama] [--name NAME]
                                   [--rows 4]

For each weight type (random weights; a 1536x1536 matrix that stays in cache, and a
32768x1024 one, like an output head, that streams from memory, and a 4096x4096 one;
K-quants need rows of 256)
and each activation mode (float, int16, int8; the integer
ones where the CPU has AVX2), ``backend.linear`` of the rows is timed, the modes taking
turns round by round so a load change hits all alike. CPU time per call (process time /
calls), so other processes on the machine inflate every mode alike instead of adding
their share to one; with 2+ threads that is per CPU-second (the threads' time adds up), so
the best wall time per call is recorded too ("wall_gweights_s"). Prints Gweights/s and the
ratio to float; writes the raw figures as JSON. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.backends import cpu_idot  # noqa: E402
from inference.backends.cpu import CpuBackend  # noqa: E402
from inference.bench import write_record  # noqa: E402
from tests.bundled import random_tensor  # noqa: E402

# "llama": a Llama-3-8B attention weight, the row length where Q2_K/Q3_K files keep Q2_K/Q3_K.
SHAPES = {"cached": (1536, 1536), "streamed": (32768, 1024), "llama": (4096, 4096)}
TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K", "Q2_K", "Q3_K")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.1, help="per mode, per round")
    ap.add_argument("--out", default="docs/bench-results")
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated")
    ap.add_argument("--shapes", default="cached,streamed", help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--name", default="matvec-modes", help="the JSON's name, before -<n>t")
    ap.add_argument("--rows", type=int, default=1,
                    help="activation rows per call (a batched decode); Gweights/s count each")
    args = ap.parse_args()
    modes = ["float", *cpu_idot.LEVELS]
    backends = {m: CpuBackend(m) for m in modes}
    for b in backends.values():
        b.set_threads(args.threads)
        rows = []
    for qtype in args.types.split(","):
        for where in args.shapes.split(","):
            n, k = SHAPES[where]
            t = random_tensor(qtype, n, k, seed=1)
            x = np.random.default_rng(0).standard_normal((args.rows, k)).astype(np.float32)
            ws = {m: b.weight(t) for m, b in backends.items()}
            best = dict.fromkeys(modes, float("inf"))
            wall = dict.fromkeys(modes, float("inf"))
            for m, b in backends.items():
                b.linear(x, ws[m])  # compile, page in
            for _ in range(args.rounds):
                for m, b in backends.items():
                    calls, c0, t0 = 0, time.process_time(), time.perf_counter()
                    while time.perf_counter() - t0 < args.seconds:
                        b.linear(x, ws[m])
                        calls += 1
                    best[m] = min(best[m], (time.process_time() - c0) / calls)
                    wall[m] = min(wall[m], (time.perf_counter() - t0) / calls)
            row = {"qtype": qtype, "tensor": where, "shape": [n, k],
                   "cpu_us_per_call": {m: round(v * 1e6, 2) for m, v in best.items()},
                   "rows": args.rows,
                   "gweights_s": {m: round(n * k * args.rows / v / 1e9, 2)
                                  for m, v in best.items()},
                   "x_float": {m: round(best["float"] / v, 2) for m, v in best.items()},
                   "wall_gweights_s": {m: round(n * k * args.rows / v / 1e9, 2)
                                       for m, v in wall.items()}}
            rows.append(row)
            print(f"{qtype:5s} {where:8s} " + "  ".join(
                f"{m} {row['gweights_s'][m]:6.2f} Gw/s ({row['x_float'][m]:.2f}x, wall "
                f"{row['wall_gweights_s'][m]:.2f})" for m in modes))
    write_record(args.out, f"{args.name}-{args.threads}t", "scripts/bench_matvec.py",
                 {"threads": args.threads, "rows": rows})


if __name__ == "__main__":
    main()
