"""One prefill product per weight type by both routes of ``CpuBackend._products``: the
integer decode kernels (``cpu_idot``, rows quantized once, each thread a range of token rows)
and dequant+sgemm (each thread an L2 chunk at a time, one-thread sgemm).

    python scripts/bench_prefill_products.py [--threads 1 2] [--rows 138] [--rounds 5]

Random weights in SmolLM2-135M's shapes (1536x576 as gate/up, 576x1536 as down; K-quants
need rows of 256, so the down shape only), ``--rows`` token rows (138: the bench prompt).
Wall time per product, the best of ``--rounds`` rounds of 5 calls, the routes taking turns.
``ratio`` is integer / sgemm (below 1: the integer kernels win). Which types the backend
routes where follows from it (``INTEGER_BITS``, docs/cpu-backend.md "Prefill"). A
benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import inference.backends.cpu as C  # noqa: E402
from inference.bench import write_record  # noqa: E402
from inference.threads import set_threads  # noqa: E402
from tests.bundled import random_tensor  # noqa: E402

TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q8_0", "Q6_K")
SHAPES = ((1536, 576), (576, 1536))
ROUTES = {"integer": frozenset({4, 5, 8}), "sgemm": frozenset()}


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        best = min(best, (time.perf_counter() - t0) / 5)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, default=138)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    b = C.CpuBackend()  # int16 activations, the default
    if not C.cpu_idot.vnni_groups():
        print("note: no AVX-512 VNNI here: the backend keeps dequant+sgemm for every type")
    results = []
    for threads in args.threads:
        set_threads(threads, b)
        for qtype in TYPES:
            for n, k in SHAPES:
                if qtype.endswith("_K") and k % 256:
                    continue
                w = b.weight(random_tensor(qtype, n, k, seed=1))
                x = np.random.default_rng(0).standard_normal((args.rows, k)).astype(np.float32)
                times: dict[str, float] = {}
                for _ in range(2):  # the routes alternate; the best of each is kept
                    for route, bits in ROUTES.items():
                        C.INTEGER_BITS = bits
                        b._products(x, [w])  # compile, page in
                        t = _best(partial(b._products, x, [w]), args.rounds)
                        times[route] = min(times.get(route, t), t)
                row = {"threads": threads, "qtype": qtype, "shape": [n, k], "rows": args.rows,
                       "integer_ms": round(times["integer"] * 1e3, 3),
                       "sgemm_ms": round(times["sgemm"] * 1e3, 3),
                       "ratio": round(times["integer"] / times["sgemm"], 3)}
                results.append(row)
                print(f"{threads}t {qtype:5s} {n}x{k}: integer {row['integer_ms']:6.2f} ms  "
                      f"sgemm {row['sgemm_ms']:6.2f} ms  ratio {row['ratio']:.2f}", flush=True)
    write_record(args.out, "prefill-products", "scripts/bench_prefill_products.py",
                 {"results": results})


if __name__ == "__main__":
    main()
