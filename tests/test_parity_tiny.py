"""Every causal path against transformers, on tiny random models (tests/goldens/tiny/).

Made by scripts/make_tiny_goldens.py (see its docstring): Qwen2 (q/k/v biases, tied
embeddings), Llama (untied, rope_theta 5e5, HF safetensors: NeoX rope, no un-permute),
Mistral (head_dim 32 != hidden/heads, bfloat16 safetensors), the Llama MLX-quantized
(4 bits, group 32, bf16 scales) and as a llama.cpp-layout Q4_0 GGUF (permuted q/k rows).
The references for the quantized two are transformers with the dequantized weights.
Llama 3 (llama3 RoPE scaling, GQA 4, head_dim 64, tied; bf16 safetensors and a Q4_K GGUF
carrying rope_freqs.weight) and Qwen 3 (per-head q/k RMSNorm, head_dim 32 != 64/4; f32
safetensors, F16 and Q4_0 GGUFs), Gemma (1 + w norms, scaled embeddings, GELU-tanh MLP;
f32 safetensors, a Q8_0 GGUF with 1 + w stored) and Phi-3 (fused qkv/gate_up, LongRoPE
short factors and attention factor; f32 safetensors, a Q4_0 GGUF with rope_factors
tensors) also record transformers' greedy 32-token continuation. So do Gemma 2 and Gemma 3
as llama.cpp-layout GGUFs (arch gemma2/gemma3, sandwich norm names, 1 + w stored): the
gemma2/ and gemma3_text/ models in F32 and Q4_0, and 256-wide Gemma 2 2B- and Gemma 3
1B-shaped models in Q4_K whose metadata leaves the layer pattern, local RoPE base and query
scale to llama.cpp's built-in values.

Bars, per sequence, on every backend (numpy, cpu, mlx on its CPU device, cuda through the
host emulator; cuda has no MLX-quantized weights): max |engine - reference| <= 1e-3 and
<= 1e-4 * max |reference| (float32 summation order only; logits here reach ~7-20), the argmax
equal at every position, and the greedy continuation identical token for token. Tokenizer
ids, the rendered chat prompt and EOS equal transformers' AutoTokenizer /
apply_chat_template.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference import load_model
from inference.generate import generate_step
from inference.sampling import SamplingParams

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
MODELS = {  # golden name -> what load_model gets
    "qwen2": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "llama_mlx": "llama_mlx",
    "llama_q4_0": "llama_q4_0.gguf",
    "llama3": "llama3",
    "llama3_q4_k": "llama3_q4_k.gguf",
    "qwen3": "qwen3",
    "qwen3_f16": "qwen3_f16.gguf",
    "qwen3_q4_0": "qwen3_q4_0.gguf",
    "gemma": "gemma",
    "gemma_q8_0": "gemma_q8_0.gguf",
    "phi3": "phi3",
    "phi3_q4_0": "phi3_q4_0.gguf",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3_text",
    "gemma2_f32": "gemma2_f32.gguf",
    "gemma2_q4_0": "gemma2_q4_0.gguf",
    "gemma2_q4_k": "gemma2_q4_k.gguf",
    "gemma3_f32": "gemma3_f32.gguf",
    "gemma3_q4_0": "gemma3_q4_0.gguf",
    "gemma3_q4_k": "gemma3_q4_k.gguf",
}
GREEDY = [n for n in MODELS if n.startswith(("llama3", "qwen3", "gemma", "phi3"))]
BACKENDS = ["numpy", "cpu", "mlx", "cuda"]
REL_TOL = 1e-4
ABS_TOL = 1e-3


def golden(name: str) -> tuple[dict[str, np.ndarray], dict]:
    with np.load(TINY / f"{name}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(str(arrays.pop("meta")))


_loaded: dict[tuple[str, str], object] = {}


def model(name: str, backend: str):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    if backend == "cuda" and name == "llama_mlx":
        pytest.skip("the CUDA kernels have no MLX-quantized weights (refused at load)")
    key = (name, backend)
    if key not in _loaded:
        if backend == "cuda":
            _loaded[key] = _emulated_cuda(str(TINY / MODELS[name]))
        elif backend == "cpu-float":
            _loaded[key] = _float_cpu(str(TINY / MODELS[name]))
        else:
            _loaded[key] = load_model(str(TINY / MODELS[name]), backend=backend)
    return _loaded[key]


def _float_cpu(path: str):
    """load_model on ``cpu`` with float activations. The logits bars below are float32's:
    with the default int16 activations (decode, and prefill's 4/5-bit products on AVX-512
    VNNI) each product rounds x to 1/32767 of its group's largest value, which moved
    these logits by up to 1.5e-3 (bar 1e-4 of their scale, 6.6e-4); that mode is held to
    the parity bars in tests/test_cpu_kquants.py and tests/test_cpu_idot.py, and to the
    greedy tokens below."""
    import os

    from inference.backends.cpu import ACTIVATIONS_ENV

    before = os.environ.get(ACTIVATIONS_ENV)
    os.environ[ACTIVATIONS_ENV] = "float"
    try:
        return load_model(path, backend="cpu")
    finally:
        if before is None:
            del os.environ[ACTIVATIONS_ENV]
        else:
            os.environ[ACTIVATIONS_ENV] = before


def _emulated_cuda(path: str):
    """load_model's CausalLM on the CUDA backend over the host emulator (no GPU here)."""
    from inference.api import CausalLM
    from inference.backends.cuda import CudaBackend
    from inference.formats import read_checkpoint
    from inference.store import resolve
    from tests.kernels.emulator.device import EmulatedDevice

    spec = resolve(path)
    backend = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)  # float32 bars
    backend.q8_1_activations = False  # these bars are float32's; q8_1 x: tests/kernels
    return CausalLM(spec, read_checkpoint(spec.path), backend, "emulated")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", MODELS)
def test_logits_match_transformers(name, backend):
    gold, _ = golden(name)
    m = model(name, "cpu-float" if backend == "cpu" else backend)  # float32's bars
    for seq in ("chat", "random"):
        ref = gold[f"{seq}.logits"]
        got = m.logits(gold[f"{seq}.ids"].tolist())
        assert got.shape == ref.shape, (seq, got.shape)
        diff = float(np.abs(got - ref).max())
        assert diff <= min(ABS_TOL, REL_TOL * float(np.abs(ref).max())), (seq, diff)
        flips = np.flatnonzero(got.argmax(-1) != ref.argmax(-1))
        assert flips.size == 0, (seq, flips.tolist())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", GREEDY)
def test_greedy_continuation_matches_transformers(name, backend):
    gold, _ = golden(name)
    m = model(name, backend)
    want = gold["greedy.tokens"].tolist()
    steps = generate_step(m.model, gold["greedy.prompt"].tolist(),
                          SamplingParams(temperature=0.0), np.random.default_rng(0),
                          max_len=len(gold["greedy.prompt"]) + len(want))
    got = [next(steps) for _ in want]
    steps.close()
    assert got == want


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
