"""The `cpu` backend on the files people download: SmolLM2 requantized by llama.cpp's own
quantizer into Q4_K_M, Q3_K_M, Q5_K_M and Q6_K (mixes of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K), against transformers' float32 logits on the same file
(tests/goldens/smollm2_kquants.npz), with the parity bars: top-1 agreement >= 99% and
mean |delta log p(top-1)| <= 0.01 on every golden text.

- decode, token by token, with the default int16 activations (the integer mat-vecs);
- prefill (teacher forcing: 4- and 5-bit products by the same integer kernels over
  int16 activations, 8-bit ones by dequantize + sgemm in float32).

Opt-in, as tests/test_mlx_kquants.py: the files (93-138 MB) are not in the repository;
``scripts/make_kquant_goldens.py --files DIR --check`` remakes them byte for byte, and
INFERDESK_KQUANT_DIR points at them. Measured figures: docs/cpu-backend.md.
"""

from __future__ import annotations

import pytest

from tests import goldens_io as g

MIN_TOP1, MAX_DLOGP = 0.99, 0.01  # the parity bars (int16 activations quantize x)


decode_logits = g.decode_logits  # test_cpu_kdot and test_cpu_kv_f16 import it from here


@pytest.mark.slow
@pytest.mark.parametrize("qtype", g.KQUANT_TYPES)
def test_llama_cpp_kquant_files_match_transformers_on_cpu(qtype):
    from inference.api import load_model

    found = g.kquant_file(qtype)
    if found is None:
        pytest.skip(g.KQUANT_MISSING)
    path, z, meta = found
    model = load_model(str(path), backend="cpu")
    assert model.backend.activations == "int16"
    for text in meta["texts"]:
        golden = {k: z[f"{qtype}.{text}.{k}"] for k in ("top_ids", "top_logp")}
        ids = z[f"{qtype}.{text}.ids"].tolist()
        for path_name, logits in (("prefill", model.logits(ids)),
                                  ("decode", decode_logits(model, ids))):
            agree, dlogp = g.smollm2_agreement(golden, logits)
            assert agree >= MIN_TOP1 and dlogp <= MAX_DLOGP, (text, path_name, agree, dlogp)
