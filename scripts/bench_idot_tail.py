"""The integer mat-vec kernels (``cpu_idot.matvec_q4`` / ``matvec_q8``) of this tree against
those of a git revision, in one process, taking turns:

    python scripts/bench_idot_tail.py [--base HEAD] [--rows 1 2 4 8 136] [--rounds 5] [--turns 3]

The revision's ``inference/backends/cpu_idot.py`` is loaded as a module of its own (its
kernels compiled uncached, as are this tree's); both run one thread over the same packed
weight and quantized rows (int16, the default). SmolLM2-135M's shapes as in
``bench_prefill_products.py``. Per type, shape and row count: ms per product, the best of
``--rounds`` rounds of 5 calls, the two builds taking ``--turns`` turns; ``ratio`` is this tree /
base. Also checks that both give the same bits. A benchmark: nothing else is asserted.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_prefill_products import SHAPES, TYPES, _best  # noqa: E402  (this script's folder)

import inference.backends.cpu as C  # noqa: E402
from inference.backends import cpu_idot  # noqa: E402
from inference.bench import write_record  # noqa: E402
from tests.bundled import random_tensor  # noqa: E402


def _load(path: Path, name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _uncached(mod):  # type: ignore[no-untyped-def]
    """The module's two kernels recompiled without numba's cache, same options."""
    out = {}
    for name in ("matvec_q4", "matvec_q8"):
        f = getattr(mod, name)
        out[name] = mod._jit(parallel=True, fastmath=mod._NO_FUSE, cache=False)(f.py_func)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 136])
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    numba.set_num_threads(1)
    src = subprocess.run(["git", "show", f"{args.base}:inference/backends/cpu_idot.py"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    tmp = Path(tempfile.mkdtemp()) / "cpu_idot_base.py"
    tmp.write_text(src)
    # this tree's module as imported (a second copy of the same file would share, and
    # confuse, its entries in numba's cache)
    mods = {"base": _load(tmp, "cpu_idot_base"), "tree": cpu_idot}
    kernels = {name: _uncached(m) for name, m in mods.items()}
    quantize = mods["tree"].quantize_rows
    b = C.CpuBackend()
    results = []
    for qtype in args.types:
        for n, k in SHAPES:
            if qtype.endswith("_K") and k % 256:
                continue
            w = b.weight(random_tensor(qtype, n, k, seed=1))
            for rows in args.rows:
                x = np.random.default_rng(0).standard_normal((rows, k)).astype(np.float32)
                xq = quantize(x, "int16")
                outs = {name: np.empty((rows, w.codes.shape[0] // (k // 32) * 32), np.float32)
                        for name in kernels}
                calls = {}
                for name, ks in kernels.items():
                    if w.bits == 8:
                        calls[name] = (ks["matvec_q8"], (w.codes, w.blocks, w.halves, w.flat,
                                                         w.kind, w.zero, *xq, outs[name]))
                    else:
                        calls[name] = (ks["matvec_q4"], (w.codes, w.blocks, w.halves, w.flat,
                                                         w.high, w.kind, w.zero, *xq,
                                                         outs[name]))
                times: dict[str, float] = {}
                for _ in range(args.turns):
                    for name, (f, a) in calls.items():
                        f(*a)
                        t = _best(lambda f=f, a=a: f(*a), args.rounds)
                        times[name] = min(times.get(name, t), t)
                same = bool(np.array_equal(outs["base"].view(np.int32),
                                           outs["tree"].view(np.int32)))
                row = {"qtype": qtype, "shape": [n, k], "rows": rows,
                       "base_ms": round(times["base"] * 1e3, 4),
                       "tree_ms": round(times["tree"] * 1e3, 4),
                       "ratio": round(times["tree"] / times["base"], 3), "same_bits": same}
                results.append(row)
                print(f"{qtype:5s} {n}x{k} rows {rows:3d}: base {row['base_ms']:7.3f} ms  "
                      f"tree {row['tree_ms']:7.3f} ms  ratio {row['ratio']:.3f}"
                      f"{'' if same else '  BITS DIFFER'}", flush=True)
    if args.out:
        write_record(args.out, "idot-tail", "scripts/bench_idot_tail.py",
                     {"base": args.base, "results": results})


if __name__ == "__main__":
    main()
