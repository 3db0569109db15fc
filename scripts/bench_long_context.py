"""Decode speed at long contexts: ``cpu`` against llama.cpp (llama-cpp-python), each side
in a process of its own at the same thread count, on the same GGUF file.

    python scripts/bench_long_context.py [--model smollm2] [--threads 2]
        [--contexts 256 1024 2048] [--tokens 64] [--rounds 3] [--kv-dtype float32]

Each side fills its cache with ``context`` tokens (random ids: the speed does not depend
on the text), decodes 4 untimed tokens, then times ``--tokens`` single-token steps that
feed a fixed token (no sampling on either side: ours replays its captured decode step,
llama.cpp's ``Llama.eval`` runs one ``llama_decode`` a token). Median over ``--rounds``
processes a side. Run the peer from a venv where llama-cpp-python is installed (the
repository's own venv has none); without it the peer's rows say so. A benchmark, not a
test: nothing is asserted. Writes JSON to docs/bench-results/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _ours(path: str, context: int, tokens: int, threads: int, kv: str) -> float:
    sys.path.insert(0, str(ROOT))
    from inference import load_model
    from inference.threads import set_threads

    llm = load_model(path, backend="cpu", kv_dtype=kv)
    set_threads(threads, llm.backend)
    m, b = llm.model, llm.backend
    ids = np.random.default_rng(0).integers(200, 20000, size=(1, context))
    cache = m.make_cache(context + tokens + 8)
    m(b.array(ids), cache, last_only=True)
    step, tok = b.decode_steps(), b.array(np.asarray([[330]]))
    for _ in range(4):
        step(m, tok, cache)
    t0 = time.perf_counter()
    for _ in range(tokens):
        step(m, tok, cache)
    return tokens / (time.perf_counter() - t0)


def _peer(path: str, context: int, tokens: int, threads: int, kv: str) -> float:
    from llama_cpp import Llama

    t = 0 if kv == "float32" else 1  # GGML_TYPE_F32 / GGML_TYPE_F16
    llm = Llama(path, n_ctx=context + tokens + 16, n_threads=threads, n_threads_batch=threads,
                type_k=t, type_v=t, verbose=False)
    llm.eval([int(i) for i in np.random.default_rng(0).integers(200, 20000, size=context)])
    for _ in range(4):
        llm.eval([330])
    t0 = time.perf_counter()
    for _ in range(tokens):
        llm.eval([330])
    return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--out", default="docs/bench-results")
    ap.add_argument("--side", choices=["ours", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from inference.store import resolve

    path = str(resolve(args.model).path)
    if args.side:  # one measurement in this process
        run = _ours if args.side == "ours" else _peer
        print(json.dumps(run(path, args.context, args.tokens, args.threads, args.kv_dtype)))
        return
    from inference.bench import write_record

    rows = []
    for context in args.contexts:
        row: dict[str, object] = {"context": context}
        for side in ("ours", "peer"):  # in turns, a process each
            rates = []
            for _ in range(args.rounds):
                p = subprocess.run([sys.executable, __file__, "--side", side, "--context",
                                    str(context), "--model", args.model, "--threads",
                                    str(args.threads), "--tokens", str(args.tokens),
                                    "--kv-dtype", args.kv_dtype],
                                   capture_output=True, text=True, cwd=ROOT)
                if p.returncode:
                    last = (p.stderr.strip().splitlines() or ["failed"])[-1]
                    rates = [last]
                    break
                rates.append(round(float(p.stdout.strip().splitlines()[-1]), 1))
            row[side] = rates
            if all(isinstance(r, float) for r in rates):
                row[f"{side}_median_tok_s"] = float(np.median(rates))
        if "ours_median_tok_s" in row and "peer_median_tok_s" in row:
            row["ratio"] = round(row["ours_median_tok_s"] / row["peer_median_tok_s"], 2)
        rows.append(row)
        print(row, flush=True)
    write_record(args.out, f"long-context-{args.kv_dtype}", "scripts/bench_long_context.py",
                 {"model": path, "threads": args.threads, "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
