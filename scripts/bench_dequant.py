"""Prefill's dequantize step on the cpu backend against the sgemm it feeds, per type.

    python scripts/bench_dequant.py [--rows 138] [--out docs/bench-results]

For each packed type (random 1536 x 576 weights, 1536 x 768 for K-quants), the time of
dequantizing the whole matrix into the float32 scratch prefill multiplies (the same
call ``CpuBackend._gemm`` makes) and of the ``rows`` x K @ K x 1536 sgemm after it, on one
thread (numba and BLAS), CPU time per call, best of ``--rounds``. Prints Gweights/s and
the dequantize step's share; writes the raw figures as JSON. A benchmark: nothing is
asserted. It also runs on trees from before the ``high`` argument (for A/B figures).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.backends import cpu_kernels as K  # noqa: E402
from inference.backends.cpu import CpuBackend  # noqa: E402
from inference.bench import write_record  # noqa: E402
from tests.bundled import random_tensor  # noqa: E402


def _best(f: Callable[[], object], rounds: int, calls: int) -> float:
    """Least CPU seconds per call of ``f`` over ``rounds`` rounds of ``calls`` calls."""
    f()
    times = []
    for _ in range(rounds):
        c = time.process_time()
        for _ in range(calls):
            f()
        times.append((time.process_time() - c) / calls)
    return min(times)


TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q8_0", "Q6_K")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=138)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    b = CpuBackend()
    b.set_threads(1)
    takes_high = "high" in inspect.signature(K.dequant_t).parameters
    rows = []
    with threadpool_limits(1):
        for qtype in TYPES:
            w = b.weight(random_tensor(qtype, 1536, 768 if qtype.endswith("K") else 576, seed=1))
            if not hasattr(w, "blocks"):
                print(f"{qtype}: kept as file bytes in this tree, skipped")
                continue
            k, tiles = w.shape[1], len(w.blocks) // w.groups
            wt = np.empty((k, tiles * K.LANES), np.float32)
            x = np.random.default_rng(0).standard_normal((args.rows, k)).astype(np.float32)
            extra = (w.high,) if takes_high else ()
            dq = _best(partial(K.dequant_t, w.codes, w.blocks, w.halves, *extra, w.kind, w.bits,
                               w.zero, w.groups, 0, tiles, wt), args.rounds, args.calls)
            mm = _best(partial(np.matmul, x, wt), args.rounds, args.calls)
            row = {"qtype": qtype, "shape": list(w.shape), "dequant_ms": round(dq * 1e3, 3),
                   "sgemm_ms": round(mm * 1e3, 3),
                   "dequant_gweights_s": round(w.shape[0] * k / dq / 1e9, 2),
                   "dequant_share": round(dq / (dq + mm), 3)}
            rows.append(row)
            print(f"{qtype:5s} dequant {row['dequant_ms']:.2f} ms ({row['dequant_gweights_s']:.2f}"
                  f" Gw/s), sgemm {args.rows} rows {row['sgemm_ms']:.2f} ms, dequant share "
                  f"{row['dequant_share']:.0%}")
    write_record(args.out, "dequant-1t", "scripts/bench_dequant.py",
                 {"tree": str(Path(__file__).resolve().parents[1]), "rows": rows})


if __name__ == "__main__":
    main()
