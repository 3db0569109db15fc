"""The activation quantizer of the integer kernels (``cpu_idot.quantize_rows``: groups of
32 to int16 or int8, scale and sum per group), ns per element, one thread.

    python scripts/bench_quantize.py [--rounds 7] [--out docs/bench-results]

Shapes: a decode row (1 x 576, 1 x 1536), a server step of 8 rows, a prefill of the bench
prompt (138 rows). Best of ``--rounds`` rounds of 50 calls each. A benchmark, nothing asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_prefill_products import _best  # noqa: E402  (this script's folder)

from inference.backends import cpu_idot  # noqa: E402
from inference.bench import write_record  # noqa: E402
from inference.threads import set_threads  # noqa: E402

SHAPES = ((1, 576), (1, 1536), (8, 576), (8, 1536), (138, 576), (138, 1536))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="docs/bench-results")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    set_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    for width in ("int16", "int8"):
        for t, k in SHAPES:
            x = (rng.standard_normal((t, k)) * 3).astype(np.float32)
            fill, _ = cpu_idot.quantize_call(x, width)
            fill()  # compile

            def ten(fill=fill) -> None:
                for _ in range(10):
                    fill()

            best = _best(ten, args.rounds) / 10  # rounds of 5 x 10 calls
            rows.append({"width": width, "shape": [t, k], "us": round(best * 1e6, 3),
                         "ns_per_element": round(best * 1e9 / (t * k), 3)})
            r = rows[-1]
            print(f"{width} {t}x{k}: {r['us']:8.2f} us  {r['ns_per_element']:.3f} ns/el")
    name = "quantize" + (f"-{args.label}" if args.label else "")
    write_record(args.out, name, "scripts/bench_quantize.py", {"rows": rows})


if __name__ == "__main__":
    main()
