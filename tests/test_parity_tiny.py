"""Every causal path against transformers, on tiny random models (tests/goldens/tiny/).

Made by scripts/make_tiny_goldens.py (see its docstring): Qwen2 (q/k/v biases, tied
embeddings), Llama (untied, rope_theta 5e5, HF safetensors: NeoX rope, no un-permute),
Mistral (head_dim 32 != hidden/heads, bfloat16 safetensors), the Llama MLX-quantized
(4 bits, group 32, bf16 scales) and as a llama.cpp-layout Q4_0 GGUF (permuted q/k rows).
The references for the quantized two are transformers with the dequantized weights.

Bars, per sequence, on every backend: max |engine - reference| <= 1e-4 * max |reference|
(float32 summation order only; logits here reach ~7, so ~7e-4 absolute), and the argmax
is equal at every position. Tokenizer ids, the rendered chat prompt and EOS equal
transformers' AutoTokenizer / apply_chat_template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference import load_model

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
MODELS = {  # golden name -> what load_model gets
    "qwen2": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "llama_mlx": "llama_mlx",
    "llama_q4_0": "llama_q4_0.gguf",
}
BACKENDS = ["numpy", "mlx"]
REL_TOL = 1e-4


def golden(name: str) -> tuple[dict[str, np.ndarray], dict]:
    with np.load(TINY / f"{name}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(str(arrays.pop("meta")))


_loaded: dict[tuple[str, str], object] = {}


def model(name: str, backend: str):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    key = (name, backend)
    if key not in _loaded:
        _loaded[key] = load_model(str(TINY / MODELS[name]), backend=backend)
    return _loaded[key]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(name, backend):
    gold, _ = golden(name)
    m = model(name, backend)
    for seq in ("chat", "random"):
        ref = gold[f"{seq}.logits"]
        got = m.logits(gold[f"{seq}.ids"].tolist())
        assert got.shape == ref.shape, (seq, got.shape)
        diff = float(np.abs(got - ref).max())
        assert diff <= REL_TOL * float(np.abs(ref).max()), (seq, diff)
        flips = np.flatnonzero(got.argmax(-1) != ref.argmax(-1))
        assert flips.size == 0, (seq, flips.tolist())


@pytest.mark.parametrize("name", MODELS)
def test_tokenizer_and_template_match_transformers(name):
    gold, meta = golden(name)
    m = model(name, "numpy")
    for key, text in meta["texts"].items():
        assert m.tokenize(text) == gold[f"tok.{key}"].tolist(), key
    assert m.tokenize(meta["chat_text"], add_special_tokens=False)[:len(gold["chat.ids"])] \
        == gold["chat.ids"].tolist()
    assert m.chat_prompt([{"role": "user", "content": "Hello! What is 2 + 3?"}]) \
        == meta["chat_prompt"]
    assert m.tokenizer.eos_id == m.tokenizer.token_to_id(meta["eos_token"])
