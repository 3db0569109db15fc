"""Where a batched decode step's time goes on the `cpu` backend, per batch size.

    python scripts/profile_batched_step.py [--batches 1 4 8] [--threads 1 2] [--steps 30]
        [--prompt 40] [--kv-dtype float32|float16]

SmolLM2-135M (the bundled Q4_1 GGUF) decodes ``--steps`` steps of B sequences at once,
each sequence prefilled with its own 40-token prompt, as the server's scheduler runs them
(``model(ids, BatchedCaches)``, one row per sequence; B=1 passes the one cache). Per step:
CPU time (process time) and wall time, and the wall time inside the backend's ``linear``
(the decode mat-vecs; the lm_head apart), inside ``backend.attend_rows`` (RoPE, cache writes
and attention for every sequence of the step, once per layer), and the rest (norms,
activations, reshapes, Python). The parts are timed with
perf_counter wrappers around those calls, so each figure includes a wrapper's ~0.1 us.
Then the same steps captured and replayed (``backend.decode_steps()``, what the server
runs): wall time per step only, as a replay has no Python calls to wrap.
Writes JSON to docs/bench-results/. A profile, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference import load_model  # noqa: E402
from inference.bench import write_record  # noqa: E402
from inference.kv_cache import BatchedCaches  # noqa: E402
from inference.threads import set_threads  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=40, help="tokens prefilled per sequence")
    ap.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    llm = load_model("smollm2", backend="cpu", kv_dtype=args.kv_dtype)
    M, B = llm.model, llm.backend
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    linear = B.linear

    def timed_linear(x, w, bias=None):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        y = linear(x, w, bias)
        part = "lm_head" if w is M.lm_head else "linear"
        spent[part] += time.perf_counter() - t0
        calls[part] += 1
        return y

    attend = B.attend_rows

    def timed_attend(*a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        y = attend(*a, **kw)
        spent["attend"] += time.perf_counter() - t0
        calls["attend"] += 1
        return y

    B.linear = timed_linear
    B.attend_rows = timed_attend
    rows = []
    rng = np.random.default_rng(0)
    for threads in args.threads:
        set_threads(threads, B)
        for nb in args.batches:
            caches = []
            for _ in range(nb):
                c = M.make_cache(args.prompt + 2 * args.steps + 16)
                ids = rng.integers(100, 20000, size=(1, args.prompt))
                M(B.array(ids), c, last_only=True)
                caches.append(c)
            cache = caches[0] if nb == 1 else BatchedCaches(caches)
            ids = B.array(rng.integers(100, 20000, size=(nb, 1)))
            for _ in range(3):  # warm: compile any new shape, page in
                M(ids, cache, last_only=True)
            spent.clear()
            calls.clear()
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                M(ids, cache, last_only=True)
            cpu = (time.process_time() - c0) / args.steps
            wall = (time.perf_counter() - t0) / args.steps
            parts = {k: v / args.steps for k, v in spent.items()}
            # The same steps as the server runs them: captured once, then replayed
            # (cpu_step). A wrapped op turns replay off, so the wrappers come off first.
            del B.linear
            del B.attend_rows
            replay = B.decode_steps()
            for _ in range(3):
                replay(M, ids, cache)
            r0 = time.perf_counter()
            for _ in range(args.steps):
                replay(M, ids, cache)
            replayed = (time.perf_counter() - r0) / args.steps
            B.linear = timed_linear
            B.attend_rows = timed_attend
            parts["rest"] = wall - sum(parts.values())
            row = {"threads": threads, "batch": nb, "cpu_ms_per_step": round(cpu * 1e3, 3),
                   "wall_ms_per_step": round(wall * 1e3, 3),
                   "tok_s": round(nb / wall, 1),
                   "replayed_wall_ms_per_step": round(replayed * 1e3, 3),
                   "replayed_tok_s": round(nb / replayed, 1),
                   "replay_off_because": replay.eager_reason,
                   "wall_ms": {k: round(v * 1e3, 3) for k, v in parts.items()},
                   "calls_per_step": {k: v // args.steps for k, v in calls.items()}}
            rows.append(row)
            print(f"{threads}t B={nb}: cpu {row['cpu_ms_per_step']:.2f} ms/step, wall "
                  f"{row['wall_ms_per_step']:.2f} ms ({row['tok_s']} tok/s), replayed "
                  f"{row['replayed_wall_ms_per_step']:.2f} ms; " + ", ".join(
                      f"{k} {v:.2f}" for k, v in row["wall_ms"].items()))
    write_record(args.out, "batched-step-profile", "scripts/profile_batched_step.py",
                 {"model": "smollm2 (Q4_1)", "activations": B.activations,
                  "kv_dtype": args.kv_dtype, "prompt_tokens": args.prompt, "rows": rows})


if __name__ == "__main__":
    main()
