"""The held K-quant rule on `mlx` (MLX's CPU device here): files quantized by llama.cpp's
own quantizer match transformers' float32 logits on the same files.

- Always: the tiny Llama 3 (tests/goldens/tiny/llama3_*.llamacpp.gguf, 0.35-0.43 MB; every
  row a multiple of 256, so every matrix is a K-quant, and between the two files every K
  type, Q2_K to Q6_K, appears): the tiny-parity bars (max |delta logit| <= 1e-3 and
  <= 1e-4 * max |logit|, the same argmax at every position).
- Opt-in (slow): SmolLM2 requantized into Q4_K_M, Q3_K_M, Q5_K_M and Q6_K: top-1 agreement
  >= 99.5% and mean |delta log p(top-1)| <= 0.001 on every golden text. Those files (93-138
  MB) are not in the repository; ``scripts/make_kquant_goldens.py --files DIR --check``
  remakes them byte for byte with llama-cpp-python 0.3.36's libllama (tests/goldens/
  smollm2_kquants.npz records each file's sha256). Point INFERDESK_KQUANT_DIR at them.

All files and goldens come from scripts/make_kquant_goldens.py.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from tests import goldens_io as g

pytest.importorskip("mlx.core")

MIN_TOP1, MAX_DLOGP = 0.995, 0.001

TINY = g.GOLDENS_DIR / "tiny"
TINY_FILES = ("llama3_Q2_K.llamacpp", "llama3_Q3_K_M.llamacpp")
K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}


def test_tiny_llama_cpp_files_hold_every_k_type():
    seen = set()
    for name in TINY_FILES:
        meta = json.loads(str(np.load(TINY / f"{name}.npz")["meta"]))
        assert hashlib.sha256((TINY / f"{name}.gguf").read_bytes()).hexdigest() == meta["sha256"]
        assert set(meta["tensor_types"]) <= K_TYPES | {"F32"}  # every matrix a K-quant
        seen |= set(meta["tensor_types"])
    assert seen >= K_TYPES


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_llama_cpp_kquant_files_match_transformers_on_mlx(name):
    from inference.api import load_model

    z = np.load(TINY / f"{name}.npz")
    model = load_model(str(TINY / f"{name}.gguf"), backend="mlx")
    assert model.backend.precision == "float32"
    for seq in ("chat", "random"):
        ref = z[f"{seq}.logits"]
        got = model.logits(z[f"{seq}.ids"].tolist())
        # float32 summation order only (logits here reach ~10)
        diff = float(np.abs(got - ref).max())
        assert diff <= min(1e-3, 1e-4 * float(np.abs(ref).max())), (seq, diff)
        assert np.array_equal(got.argmax(-1), ref.argmax(-1)), seq


def _log_softmax(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64) - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_llama_cpp_kquant_files_in_float16_on_mlx(name, monkeypatch):
    """Float16 (Metal's default) on the same files: every K type's float16 scales. Two
    layers of random weights amplify rounding more than trained ones (SmolLM2's float16
    bars are 99% / 0.01): measured top-1 97.5-100% and mean |delta log p(top-1)| 0.012-0.016
    (0.011-0.015 with the earlier 8-bit Q3_K and 2-bit Q2_K forms)."""
    from inference.api import load_model
    from inference.backends import mlx_backend

    monkeypatch.setenv(mlx_backend.DTYPE_ENV, "float16")
    z = np.load(TINY / f"{name}.npz")
    model = load_model(str(TINY / f"{name}.gguf"), backend="mlx")
    assert model.backend.precision == "float16"
    for seq in ("chat", "random"):
        ref = z[f"{seq}.logits"]
        got = model.logits(z[f"{seq}.ids"].tolist())
        top = ref.argmax(-1)
        rows = np.arange(len(top))
        dlogp = np.abs(_log_softmax(got)[rows, top] - _log_softmax(ref)[rows, top]).mean()
        assert (got.argmax(-1) == top).mean() >= 0.95 and dlogp <= 0.025, (seq, dlogp)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("qtype", g.KQUANT_TYPES)
def test_llama_cpp_kquant_files_match_transformers_on_mlx(qtype, precision, monkeypatch):
    """float32 to the K-quant bars; float16 (Metal's default) to SmolLM2's float16 bars."""
    from inference.api import load_model
    from inference.backends import mlx_backend

    found = g.kquant_file(qtype)
    if found is None:
        pytest.skip(g.KQUANT_MISSING)
    path, z, meta = found
    monkeypatch.setenv(mlx_backend.DTYPE_ENV, precision)
    model = load_model(str(path), backend="mlx")
    assert model.backend.precision == precision
    top1, max_dlogp = ((MIN_TOP1, MAX_DLOGP) if precision == "float32" else
                       (g.SMOLLM2_MIN_TOP1_AGREEMENT, g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1))
    for text in meta["texts"]:
        golden = {k: z[f"{qtype}.{text}.{k}"] for k in ("top_ids", "top_logp")}
        logits = model.logits(z[f"{qtype}.{text}.ids"].tolist())
        agree, dlogp = g.smollm2_agreement(golden, logits)
        assert agree >= top1 and dlogp <= max_dlogp, (text, agree, dlogp)
