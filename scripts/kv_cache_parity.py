"""SmolLM2 (the bundled Q4_1) on the `cpu` backend with its KV cache in float32 and in
float16, against transformers' float32 logits: top-1 agreement and mean |delta log p| per
golden text and path (prefill; decode token by token through replayed steps).

    python scripts/kv_cache_parity.py [--out docs/bench-results]

The K-quant files: ``scripts/cpu_kquant_parity.py --kv-dtype float32 float16``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference import load_model  # noqa: E402
from inference.bench import write_record  # noqa: E402
from scripts import goldens_io as g  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/bench-results")
    args = ap.parse_args()
    rows = []
    for kv in ("float32", "float16"):
        m = load_model("SmolLM2-135M-Instruct.Q4_1", backend="cpu", kv_dtype=kv)
        for name, text in g.load_smollm2()["texts"].items():
            ids = [int(i) for i in text["ids"]]
            for path, logits in (("prefill", m.logits(ids)), ("decode", g.decode_logits(m, ids))):
                agree, dlogp = g.smollm2_agreement(text, logits)
                rows.append({"kv_dtype": kv, "text": name, "path": path, "tokens": len(ids),
                             "top1": round(agree, 4), "mean_abs_dlogp": float(f"{dlogp:.3g}")})
                print(f"kv {kv:7s} {name:6s} {path:7s} top-1 {agree:.1%} "
                      f"mean |d log p| {dlogp:.2g}", flush=True)
    write_record(args.out, "kv-cache-parity", "scripts/kv_cache_parity.py", {"rows": rows})


if __name__ == "__main__":
    main()
