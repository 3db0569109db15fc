"""A/B of the decode attention kernel (``cpu_attend.attend_rows``): another version of
``inference/backends/cpu_attend.py`` (``--old``, e.g. ``git show REV:inference/backends/
cpu_attend.py > /tmp/old_attend.py``) loaded beside the working tree's, both called in
turns in one process on the same caches (SmolLM2's shapes: 9 query heads, 3 kv heads of
64, 30 separate layer buffers, so the step reads its caches from memory); best and median
of ``--rounds``, and the results compared (float32 rounding: the kernels may sum in
another order). A benchmark, not a test: nothing is asserted beyond the comparison.

    python scripts/ab_decode_attention.py --old /tmp/old_attend.py [--threads 2]
        [--cases 1x290 4x415 8x415 1x2048] [--kv-dtype float32|float16] [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_decode_attention import HK, HQ, LAYERS, D, step_inputs  # noqa: E402

from inference.backends import cpu_attend as NEW  # noqa: E402
from inference.bench import write_record  # noqa: E402


def _load(path: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("old_cpu_attend", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_cpu_attend"] = mod  # numba's cache finds the module by name
    spec.loader.exec_module(mod)
    return mod


def _call(mod, *args, qr, out, like):  # type: ignore[no-untyped-def]
    """attend_rows with or without the rotated-query buffer (versions before 2026-11-27
    took one)."""
    if "qr" in inspect.signature(mod.attend_rows.py_func).parameters:
        return lambda: mod.attend_rows(*args, qr, out, like)
    return lambda: mod.attend_rows(*args, out, like)


def main() -> None:
    import numba

    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", nargs="+", default=["1x290", "4x415", "8x415", "1x2048"])
    ap.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    old = _load(args.old)
    half = args.kv_dtype == "float16"
    rows = []
    for case in args.cases:
        b, n = map(int, case.split("x"))
        s = step_inputs(b, n, np.float16 if half else np.float32, np.random.default_rng(0),
                        cap=n + 64)
        outs = {"old": np.empty((b, HQ, D), np.float32), "new": np.empty((b, HQ, D), np.float32)}
        runs = {}
        for name, mod in (("old", old), ("new", NEW)):
            calls = [_call(mod, s["q"], s["k"], s["k"], s["cos"], s["sin"], s["offsets"], ka, va,
                           s["caps"], s["src"], s["shared"], 0.125,
                           qr=np.empty((b * HQ, D), np.float32), out=outs[name], like=s["like"])
                     for _, _, ka, va in s["layers"]]
            runs[name] = calls
            for c in calls:
                c()  # compile, first touch
        diff = float(np.abs(outs["old"] - outs["new"]).max() / np.abs(outs["old"]).max())
        times: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.rounds):  # in turns
            for name, calls in runs.items():
                t0 = time.perf_counter()
                for c in calls:
                    c()
                times[name].append(time.perf_counter() - t0)
        mb = b * LAYERS * 2 * HK * n * D * s["like"].itemsize / 1e6
        row = {"case": case, "kv_dtype": args.kv_dtype, "cache_mb_read": round(mb, 1),
               "max_rel_diff": diff}
        for name, t in times.items():
            row[name] = {"best_ms": round(min(t) * 1e3, 3),
                         "median_ms": round(float(np.median(t)) * 1e3, 3),
                         "gb_s_best": round(mb / min(t) / 1e3, 2)}
        row["new_over_old_best"] = round(min(times["new"]) / min(times["old"]), 3)
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, f"decode-attention-ab-{args.kv_dtype}",
                 "scripts/ab_decode_attention.py",
                 {"threads": args.threads, "old": args.old, "rows": rows})


if __name__ == "__main__":
    main()
