"""Small broken models for the hostile-input tests: copies of the tiny goldens with config
keys or tensors replaced, and a tiny F32/Q8_0 llama GGUF with any metadata we like."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np

TINY = Path(__file__).parent / "goldens" / "tiny"

# The tiny GGUF decoder: hidden 64, 4 heads of 16 (2 KV heads), MLP 128, 2 layers, vocab 64.
H, HEADS, KV, HEAD_DIM, FF, LAYERS, VOCAB = 64, 4, 2, 16, 128, 2, 64


def tiny_copy(tmp_path: Path, name: str = "llama", config: dict[str, Any] | None = None,
              tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A copy of tests/goldens/tiny/``name`` with config keys and tensors replaced."""
    from safetensors.numpy import load_file, save_file

    dst = tmp_path / f"{name}-copy"
    shutil.copytree(TINY / name, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        w = load_file(dst / "model.safetensors")
        w.update(tensors)
        save_file(w, dst / "model.safetensors")
    return dst


def tiny_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights of the tiny GGUF decoder under GGUF names, numpy (out, in) order."""
    r = np.random.default_rng(seed)

    def m(*shape: int) -> np.ndarray:
        return (r.standard_normal(shape) * 0.1).astype(np.float32)

    w = {"token_embd.weight": m(VOCAB, H), "output_norm.weight": 1 + m(H)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        w |= {p + "attn_norm.weight": 1 + m(H), p + "ffn_norm.weight": 1 + m(H),
              p + "attn_q.weight": m(HEADS * HEAD_DIM, H), p + "attn_k.weight": m(KV * HEAD_DIM, H),
              p + "attn_v.weight": m(KV * HEAD_DIM, H), p + "attn_output.weight": m(H, H),
              p + "ffn_gate.weight": m(FF, H), p + "ffn_up.weight": m(FF, H),
              p + "ffn_down.weight": m(H, FF)}
    return w


def write_gguf(path: Path, meta: dict[str, Any] | None = None,
               tensors: dict[str, np.ndarray] | None = None, q8_embeddings: bool = False,
               arch: str = "llama", chat_template: str | None = None,
               tokens: list[str] | None = None) -> Path:
    """The tiny llama GGUF; ``meta`` overrides ``{arch}.*`` keys (by suffix; the value's
    Python type picks the GGUF type), ``tensors`` overrides weights by GGUF name, ``tokens``
    the vocabulary (64 entries by default). ``arch`` "gemma" writes the same weights as a
    Gemma file."""
    md: dict[str, Any] = {
        "block_count": LAYERS, "context_length": 256, "embedding_length": H,
        "feed_forward_length": FF, "attention.head_count": HEADS,
        "attention.head_count_kv": KV, "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": 1e-5,
    }
    md.update(meta or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in md.items():
        vtype = (gguf.GGUFValueType.STRING if isinstance(value, str) else
                 gguf.GGUFValueType.FLOAT32 if isinstance(value, float) else
                 gguf.GGUFValueType.UINT32)
        w.add_key_value(f"{arch}.{key}", value, vtype)
    w.add_tokenizer_model("gpt2")
    tokens = tokens or ["t", "0"] + [f"t{i}" for i in range(VOCAB - 2)]
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_token_merges(["t 0"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    weights = tiny_weights() | (tensors or {})
    for name, x in weights.items():
        if q8_embeddings and name == "token_embd.weight":
            from gguf.quants import quantize

            w.add_tensor(name, quantize(x, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
