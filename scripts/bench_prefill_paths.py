"""Prefill on the `cpu` backend by three routes, in one process, rounds alternating:

- ``dequant+sgemm``: every quantized product as a chunk of W dequantized, then a
  one-thread BLAS sgemm, the threads sharing W's tiles (the dequantize's share is timed
  separately);
- ``integer 4/5-bit``: what the backend does: products of 4- and 5-bit weights by the
  decode kernels (``cpu_idot``, the rows' activations quantized once, 8 rows sharing
  each unpacking of the codes), one thread a range of token rows; 8-bit weights as above;
- ``integer all``: 8-bit weights (Q8_0, Q6_K) by the integer kernels too.

    python scripts/bench_prefill_paths.py --model FILE [--threads 2] [--rounds 4]

Prints tok/s per route and writes the raw figures (docs/bench-results/). A benchmark, not a
test: nothing is asserted. Which route the backend takes for which type, and why:
docs/cpu-backend.md ("Prefill").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import inference.backends.cpu as C  # noqa: E402
from inference.api import load_model  # noqa: E402
from inference.bench import workloads, write_record  # noqa: E402
from inference.store import resolve  # noqa: E402
from inference.threads import set_threads  # noqa: E402

ROUTES = {"dequant+sgemm": frozenset(), "integer 4/5-bit": C.INTEGER_BITS,
          "integer all": frozenset({4, 5, 8})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    m = load_model(resolve(args.model), backend="cpu")
    set_threads(args.threads, m.backend)
    ids = np.asarray([m.tokenize(workloads()[0])])
    dequant = [0.0]
    kernel = C.K.dequant_t

    def timed_dequant(*a: object) -> None:
        t0 = time.perf_counter()
        kernel(*a)
        dequant[0] += time.perf_counter() - t0

    C.K.dequant_t = timed_dequant

    def prefill(route: str) -> tuple[float, float]:
        C.INTEGER_BITS = ROUTES[route]
        dequant[0] = 0.0
        t0 = time.perf_counter()
        m.model(ids, m.model.make_cache(), last_only=True)
        return time.perf_counter() - t0, dequant[0]

    for route in ROUTES:  # compile, page in
        prefill(route)
    runs: dict[str, list[tuple[float, float]]] = {r: [] for r in ROUTES}
    for _ in range(args.rounds):
        for route in ROUTES:
            runs[route].append(prefill(route))
    rows = {}
    for route, xs in runs.items():
        best, dq = min(xs)
        rows[route] = {"tok_s": round(ids.shape[1] / best, 1), "best_s": round(best, 4),
                       "dequant_s": round(dq, 4), "all_s": [round(s, 4) for s, _ in xs]}
        print(f"{route:24s} {rows[route]['tok_s']:7.1f} tok/s  (dequantize {dq * 1e3:.0f} ms "
              f"of {best * 1e3:.0f})")
    qtype = m.name.rsplit(".", 1)[-1]
    write_record(args.out, f"prefill-paths-{qtype}-{args.threads}t",
                 "scripts/bench_prefill_paths.py",
                 {"model": m.name, "threads": args.threads,
                  "prompt_tokens": int(ids.shape[1]), "routes": rows})


if __name__ == "__main__":
    main()
