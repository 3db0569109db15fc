"""The cpu backend's encoder with and without packed rows and fused ops, in one process.

One MiniLM on the ``cpu`` backend embeds the bench's 1,000 sentences in three setups,
taking turns each round: "padded" (the encoder before packing: every batch right-padded
with a key mask, and the separate bias, GELU, residual and LayerNorm ops), "fused" (padded,
fused ops) and "packed" (what the backend runs now: Model.packed and the fused ops). Each
setup runs fixed batches of 32 (sentence-transformers' batches) and the planner's. Timed
in CPU seconds of this process, so at 1 thread another process on the machine changes
little; the bench (``inference.bench --compare``) stays the figure against peers. Usage:

    .venv/bin/python scripts/bench_embed_packing.py [--threads 1] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial


def main() -> None:
    from inference.api import load_model
    from inference.backends.base import Backend
    from inference.bench import EMBED_MODEL, workloads, write_record
    from inference.threads import set_threads

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", help="write the JSON record under this directory")
    args = p.parse_args()
    sentences = workloads()[1]
    model = load_model(EMBED_MODEL, backend="cpu")
    set_threads(args.threads, model.backend)
    B = model.backend
    unfused = {op: partial(getattr(Backend, op), B) for op in ("linear_gelu", "linear_add_norm")}
    setups = {"padded": (False, False), "fused": (False, True), "packed": (True, True)}

    def use(name: str) -> None:  # instance attributes shadow the class's for this model
        packs, fused = setups[name]
        B.packs_rows = packs
        for op, fn in unfused.items():
            if fused:
                B.__dict__.pop(op, None)
            else:
                setattr(B, op, fn)

    rates: dict[str, list[float]] = {}
    for name in setups:  # compile and warm every path once
        use(name)
        model.embed(sentences[:64], batching="fixed")
    for _ in range(args.rounds):
        for name in setups:
            use(name)
            for batching in ("fixed", "planned"):
                t0 = time.process_time()
                model.embed(sentences, batching=batching)
                rates.setdefault(f"{name} {batching}", []).append(
                    len(sentences) / (time.process_time() - t0))
    result = {k: {"median": round(statistics.median(v), 1), "best": round(max(v), 1),
                  "samples": [round(x, 1) for x in v]} for k, v in rates.items()}
    for k, v in result.items():
        print(f"{k:16s} median {v['median']:6.1f}  best {v['best']:6.1f} sentences/s (CPU time)")
    if args.out:
        write_record(args.out, f"embed-packing-{args.threads}t", __file__,
                     {"threads": args.threads, "rounds": args.rounds,
                      "sentences_per_cpu_s": result})


if __name__ == "__main__":
    main()
