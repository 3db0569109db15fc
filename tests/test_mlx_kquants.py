"""The held K-quant rule on `mlx` (MLX's CPU device here): SmolLM2 requantized by
llama.cpp's quantizer into Q4_K_M, Q3_K_M, Q5_K_M and Q6_K files matches transformers'
float32 log-probs on the same files: top-1 agreement >= 99.5% and mean |delta log p(top-1)|
<= 0.001 on every golden text.

The files (100-140 MB each) are not in the repository: scripts/make_kquant_goldens.py
makes them and the goldens (tests/goldens/smollm2_kquants.npz, which records each file's
sha256). Point INFERDESK_KQUANT_DIR at the files to run these; without it they skip.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests import goldens_io as g

pytest.importorskip("mlx.core")

GOLDENS = g.GOLDENS_DIR / "smollm2_kquants.npz"
TYPES = ("Q4_K_M", "Q3_K_M", "Q5_K_M", "Q6_K")
MIN_TOP1, MAX_DLOGP = 0.995, 0.001


def _goldens() -> tuple[np.lib.npyio.NpzFile, dict]:
    z = np.load(GOLDENS, allow_pickle=False)
    return z, json.loads(str(z["meta"]))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", TYPES)
def test_llama_cpp_kquant_files_match_transformers_on_mlx(qtype):
    from inference.api import load_model

    d = os.environ.get("INFERDESK_KQUANT_DIR")
    path = Path(d or ".") / f"SmolLM2-135M-Instruct.{qtype}.gguf"
    if not d or not path.is_file():
        pytest.skip("set INFERDESK_KQUANT_DIR to the files scripts/make_kquant_goldens.py made")
    z, meta = _goldens()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["files"][qtype]["sha256"]
    model = load_model(str(path), backend="mlx")
    assert model.backend.precision == "float32"
    for text in meta["texts"]:
        golden = {k: z[f"{qtype}.{text}.{k}"] for k in ("top_ids", "top_logp")}
        logits = model.logits(z[f"{qtype}.{text}.ids"].tolist())
        agree, dlogp = g.smollm2_agreement(golden, logits)
        assert agree >= MIN_TOP1 and dlogp <= MAX_DLOGP, (text, agree, dlogp)
