"""One prefill product by each of its routes, in turns in one process: the integer GEMM of
AVX2 (inference/backends/cpu/gemm_int.py) against dequantize + sgemm.

    python scripts/bench_prefill_gemm.py --model FILE [--model FILE ...] --threads 2 \
        [--rows 138] [--rounds 7] [--json OUT]

For each weight type of each file's layers that the GEMM takes, its largest layer weight
(the scale models of scripts/make_scale_models.py hold real shapes), random activations,
int16 activations (the default). Prints the median time of each route and their ratio;
``--json`` keeps every round. The GEMM runs only where the CPU backend routes prefill
products to it (AVX2 without AVX-512, or numba built for such a target:
``NUMBA_CPU_NAME=haswell`` with ``NUMBA_CPU_FEATURES`` lacking AVX-512); elsewhere the
script says so and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# OpenBLAS at one thread, as the app runs it (inference/__init__.py) though numpy loads first
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from inference.backends.cpu import CpuBackend, backend, features  # noqa: E402
from inference.backends.cpu.routing import DEQUANT, GEMM_INT  # noqa: E402
from inference.bench.record import machine  # noqa: E402
from inference.formats import read_checkpoint  # noqa: E402
from inference.threads import set_threads  # noqa: E402


def _layer_weights(path: Path) -> dict[str, object]:
    """The largest 2-D layer weight of each type in the file at ``path``."""
    out: dict[str, object] = {}
    for name, t in read_checkpoint(path).tensors.items():
        if len(t.shape) == 2 and ".layers." in name:
            best = out.get(t.qtype)
            if best is None or t.shape[0] * t.shape[1] > best.shape[0] * best.shape[1]:
                out[t.qtype] = t
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=138)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if features.form() != "avx2":
        print(f"the GEMM route is AVX2's; this target's form is {features.form()!r}")
        return 1
    b = CpuBackend("int16")
    set_threads(args.threads, b)
    route = backend.prefill_route
    rng = np.random.default_rng(0)
    results = []
    for path in args.model:
        for qtype, t in sorted(_layer_weights(path).items()):
            w = b.weight(t)
            if b._prefill_route(w) != GEMM_INT:
                continue
            n, k = t.shape
            x = rng.standard_normal((args.rows, k)).astype(np.float32)
            times: dict[str, list[float]] = {GEMM_INT: [], DEQUANT: []}
            for r in range(args.rounds + 1):  # round 0 warms both routes up
                for name in (GEMM_INT, DEQUANT) if r % 2 else (DEQUANT, GEMM_INT):
                    backend.prefill_route = route if name == GEMM_INT else (
                        lambda w, a, nb: DEQUANT)
                    t0 = time.perf_counter()
                    b.linear(x, w)
                    if r:
                        times[name].append(time.perf_counter() - t0)
            backend.prefill_route = route
            g, d = (statistics.median(times[r]) for r in (GEMM_INT, DEQUANT))
            print(f"{path.name} {qtype} {n}x{k}: gemm {g * 1e3:.1f} ms, dequant+sgemm "
                  f"{d * 1e3:.1f} ms, ratio {g / d:.2f}")
            results.append({"file": path.name, "tensor": t.name, "qtype": qtype,
                            "shape": [n, k], "gemm_s": times[GEMM_INT],
                            "dequant_s": times[DEQUANT], "ratio_of_medians": g / d})
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join(os.path.basename(a) if os.path.isabs(a) else a  # no folders
                                for a in sys.argv), "machine": machine(), "rows": args.rows,
            "threads": args.threads, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
