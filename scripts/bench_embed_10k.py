"""Embed 10,000 sentences of mixed length on every available backend; report peak RSS.

The bar: peak process RSS <= 1.5 GB (model included) on every backend. Each backend runs
in its own child process so peaks do not mix. Usage:

    .venv/bin/python scripts/bench_embed_10k.py [--backends numpy,mlx] [--n 10000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LIMIT_BYTES = int(1.5 * 2**30)


def sentences(n: int) -> list[str]:
    """The bench set of 1,000 mixed-length sentences, cycled and numbered to n distinct."""
    from inference.bench import workloads

    base = workloads()[1]
    return [f"{i}. {base[i % len(base)]}" if i >= len(base) else base[i] for i in range(n)]


def child(backend: str, n: int) -> None:
    from inference import load_model

    texts = sentences(n)
    model = load_model("all-MiniLM-L6-v2", backend=backend)
    chunks = []
    t0 = time.perf_counter()
    vecs = model.embed(texts, batch_size=32, progress=lambda d, t: chunks.append(d))
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"backend": backend, "sentences": len(texts), "shape": list(vecs.shape),
                      "seconds": round(dt, 2), "sentences_s": round(len(texts) / dt, 1),
                      "chunks": len(chunks), "peak_rss_mb": round(peak / 2**20, 1),
                      "within_limit": peak <= LIMIT_BYTES}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="", help="comma list; default: every available")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.n)
        return 0
    from inference.backends import probe_all

    names = [b for b in args.backends.split(",") if b] or [
        p.name for p in probe_all() if p.available]
    ok = True
    for name in names:
        r = subprocess.run([sys.executable, __file__, "--child", name, "--n", str(args.n)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(json.dumps({"backend": name, "error": r.stderr.strip().splitlines()[-1:]}))
            ok = False
            continue
        line = r.stdout.strip().splitlines()[-1]
        print(line)
        ok &= json.loads(line)["within_limit"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
