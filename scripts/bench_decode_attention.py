"""Decode attention on the `cpu` backend (``cpu_attend.attend_rows``), float32 against float16
KV caches, from memory: SmolLM2's shapes (9 query heads, 3 kv heads of 64), one call per
layer over 30 separate layer buffers (so the step reads its caches from memory, as a
model's does), best of ``--rounds``. With ``--shared N`` every sequence reads its first N
keys from sequence 0's buffers (a prompt prefix they all copied, as the server's batched
step reads it); the bytes read are counted as if each read its own. A benchmark, not a
test: nothing is asserted.

    python scripts/bench_decode_attention.py [--threads 2] [--rounds 7] [--shared 0]
        [--out docs/bench-results]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.backends import cpu_attend as A  # noqa: E402
from inference.bench import write_record  # noqa: E402

HQ, HK, D, LAYERS, CAP = 9, 3, 64, 30, 1100
CASES = ((1, 230), (1, 1000), (4, 415), (8, 415))  # (sequences, cached keys)


def step_inputs(b: int, n: int, dtype: type, rng: np.random.Generator, cap: int = CAP,
                shared: int = 0) -> dict:
    """``attend_rows``'s arguments for one decode step of ``b`` sequences with ``n`` cached
    keys each (``cap`` rows of buffer) and 30 layers of separate K/V buffers (``layers``: per
    layer the K and V arrays and their addresses); with ``shared`` the first keys of every
    sequence are read from sequence 0's buffers."""
    layers = []
    for _ in range(LAYERS):
        kc = [rng.standard_normal((HK, cap, D), dtype=np.float32).astype(dtype) for _ in range(b)]
        vc = [x.copy() for x in kc]
        layers.append((kc, vc, *(np.array([a.ctypes.data for a in c], dtype=np.int64)
                                 for c in (kc, vc))))
    return {"q": rng.standard_normal((b, HQ, D), dtype=np.float32),
            "k": rng.standard_normal((b, HK, D), dtype=np.float32),
            "cos": np.ones((cap, D // 2), np.float32), "sin": np.zeros((cap, D // 2), np.float32),
            "offsets": np.full(b, n - 1, dtype=np.int64), "caps": np.full(b, cap, dtype=np.int64),
            "src": np.zeros(b, dtype=np.int64) if shared else np.arange(b, dtype=np.int64),
            "shared": np.full(b, min(shared, n - 1) // 4 * 4, dtype=np.int64),
            "like": np.zeros(1, np.uint16 if dtype == np.float16 else np.float32),
            "layers": layers}


def _step(b: int, n: int, dtype: type, rng: np.random.Generator, shared: int):  # noqa: ANN202
    s = step_inputs(b, n, dtype, rng, shared=shared)
    out = np.empty((b, HQ, D), np.float32)

    def run() -> None:
        for _kc, _vc, ka, va in s["layers"]:
            A.attend_rows(s["q"], s["k"], s["k"], s["cos"], s["sin"], s["offsets"], ka, va,
                          s["caps"], s["src"], s["shared"], 0.125, out, s["like"])

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shared", type=int, default=0, help="leading keys read from sequence 0")
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    for b, n in CASES:
        runs = {dt: _step(b, n, dt, rng, args.shared) for dt in (np.float32, np.float16)}
        best = {dt: float("inf") for dt in runs}
        for run in runs.values():
            run()  # compile, first touch
        for _ in range(args.rounds):  # the types take turns
            for dt, run in runs.items():
                t0 = time.perf_counter()
                run()
                best[dt] = min(best[dt], time.perf_counter() - t0)
        for dt, s in best.items():
            read = b * LAYERS * 2 * HK * n * D * np.dtype(dt).itemsize
            rows.append({"sequences": b, "keys": n, "shared": args.shared,
                         "kv_dtype": np.dtype(dt).name,
                         "ms_per_step": round(s * 1e3, 3), "cache_mb_read": round(read / 1e6, 1),
                         "gb_s": round(read / s / 1e9, 2)})
            print(rows[-1], flush=True)
    write_record(args.out, "decode-attention", "scripts/bench_decode_attention.py",
                 {"threads": args.threads, "layers": LAYERS, "heads": [HQ, HK, D], "rows": rows})


if __name__ == "__main__":
    main()
