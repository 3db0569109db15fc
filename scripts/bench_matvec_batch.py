"""Per-row cost of the decode mat-vec at batch sizes 1-8 on SmolLM2-shaped weights, and the
dequant+sgemm path beside it (where MATVEC_ROWS should cut over).

    python scripts/bench_matvec_batch.py [--threads 1 2] [--rounds 5] [--out docs/bench-results]

For each weight (random codes, SmolLM2-135M's shapes: the fused qkv 960x576, gate+up
3072x576 and down 576x1536 in Q4_1, the 49152x576 head in Q8_0) and each batch size B,
``backend.linear`` of B rows (int16 activations, the default) is timed: CPU time per call
(process time / calls, all threads; numba and BLAS capped at --threads) and wall time
per call, the best of ``--rounds`` rounds, the batch sizes taking turns round by round.
``gemm`` rows time the dequant+sgemm path (``_products``, the prefill's) at B = 4, 8, 16.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.backends.cpu import CpuBackend  # noqa: E402
from inference.bench import write_record  # noqa: E402
from inference.threads import set_threads  # noqa: E402
from tests.bundled import random_tensor  # noqa: E402

WEIGHTS = {"qkv": ("Q4_1", 960, 576), "gate_up": ("Q4_1", 3072, 576),
           "down": ("Q4_1", 576, 1536), "head": ("Q8_0", 49152, 576)}
BATCHES = (1, 2, 4, 8)
GEMM_BATCHES = (4, 8, 16)


def _time(fn, seconds: float) -> tuple[float, float]:
    calls, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        calls += 1
    return (time.process_time() - c0) / calls, (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.1, help="per case, per round")
    ap.add_argument("--mode", default="int16", help="activations: float, int16, int8")
    ap.add_argument("--label", default="", help="added to the file name")
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    b = CpuBackend(args.mode)
    rows = []
    for threads in args.threads:
        set_threads(threads, b)  # numba and BLAS
        for name, (qtype, n, k) in WEIGHTS.items():
            w = b.weight(random_tensor(qtype, n, k, seed=1))
            x = np.random.default_rng(0).standard_normal((16, k)).astype(np.float32)
            cases = {("matvec", bb): partial(b.linear, x[:bb], w) for bb in BATCHES}
            gemms = {("gemm", bb): partial(b._products, x[:bb], [w]) for bb in GEMM_BATCHES}
            best = {}
            # The mat-vec rounds first, the gemm ones after: BLAS threads spin a while
            # after a call and would bill their CPU time to a mat-vec timed next.
            for group in (cases, gemms):
                for fn in group.values():
                    fn()  # compile, page in
                for _ in range(args.rounds):
                    for c, fn in group.items():
                        cpu, wall = _time(fn, args.seconds)
                        old = best.get(c, (float("inf"), float("inf")))
                        best[c] = (min(old[0], cpu), min(old[1], wall))
            one = best[("matvec", 1)][0]
            for (path, bb), (cpu, wall) in best.items():
                row = {"weight": name, "qtype": qtype, "shape": [n, k], "threads": threads,
                       "path": path, "batch": bb, "cpu_us_per_call": round(cpu * 1e6, 2),
                       "wall_us_per_call": round(wall * 1e6, 2),
                       "cpu_us_per_row": round(cpu * 1e6 / bb, 2),
                       "row_cost_vs_b1": round(cpu / bb / one, 3)}
                rows.append(row)
                print(f"{threads}t {name:8s} {path:6s} B={bb:2d} cpu {row['cpu_us_per_call']:9.1f}"
                      f" us/call {row['cpu_us_per_row']:8.1f} us/row ({row['row_cost_vs_b1']:.2f}"
                      f" x B=1)  wall {row['wall_us_per_call']:9.1f} us")
    label = f"-{args.label}" if args.label else ""
    write_record(args.out, f"matvec-batch{label}", "scripts/bench_matvec_batch.py",
                 {"mode": args.mode, "rows": rows})


if __name__ == "__main__":
    main()
