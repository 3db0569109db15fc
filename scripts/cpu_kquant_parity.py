"""Parity of the `cpu` backend on SmolLM2 requantized by llama.cpp (Q4_K_M, Q3_K_M, Q5_K_M,
Q6_K) against transformers' float32 logits: top-1 agreement and mean |delta log p(top-1)|
per file, golden text, path (prefill; decode token by token) and activation mode.

    INFERDESK_KQUANT_DIR=DIR python scripts/cpu_kquant_parity.py [--modes int16 int8 float]
        [--kv-dtype float32 float16]

The files come from ``scripts/make_kquant_goldens.py --files DIR --check``. Prints a table
and writes the raw figures as JSON (docs/bench-results). tests/test_cpu_kquants.py asserts
the bars for the default mode.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.api import load_model  # noqa: E402
from inference.backends.cpu import ACTIVATIONS, ACTIVATIONS_ENV  # noqa: E402
from inference.bench import write_record  # noqa: E402
from scripts import goldens_io as g  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", nargs="+", default=["int16"], choices=ACTIVATIONS)
    ap.add_argument("--types", nargs="+", default=list(g.KQUANT_TYPES), choices=g.KQUANT_TYPES)
    ap.add_argument("--kv-dtype", nargs="+", default=["float32"], choices=["float32", "float16"],
                    help="KV cache element types to run (each a load of its own)")
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    rows = []
    for kv in args.kv_dtype:
        for mode in args.modes:
            os.environ[ACTIVATIONS_ENV] = mode
            for qtype in args.types:
                found = g.kquant_file(qtype)
                if found is None:
                    raise SystemExit(g.KQUANT_MISSING)
                path, z, meta = found
                model = load_model(str(path), backend="cpu", kv_dtype=kv)
                for text in meta["texts"]:
                    golden = {k: z[f"{qtype}.{text}.{k}"] for k in ("top_ids", "top_logp")}
                    ids = z[f"{qtype}.{text}.ids"].tolist()
                    # Prefill takes the mode's activations too (4/5-bit products).
                    paths = [("prefill", lambda m, i: m.logits(i)), ("decode", g.decode_logits)]
                    for name, run in paths:
                        agree, dlogp = g.smollm2_agreement(golden, run(model, ids))
                        rows.append({"mode": mode, "kv_dtype": kv, "file": qtype, "text": text,
                                     "path": name, "tokens": len(ids), "top1": round(agree, 4),
                                     "mean_abs_dlogp": float(f"{dlogp:.3g}")})
                        print(f"{mode:6s} kv {kv:7s} {qtype:7s} {text:8s} {name:8s} "
                              f"top-1 {agree:.1%} mean |d log p| {dlogp:.2g}", flush=True)
                del model
    write_record(args.out, "cpu-kquant-parity", "scripts/cpu_kquant_parity.py", {"rows": rows})


if __name__ == "__main__":
    main()
