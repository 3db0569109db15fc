"""Gemma 2/3 GGUF metadata -> the decoder's config, as llama.cpp reads these files.

The numeric proof is tests/test_parity_tiny.py (gemma2_*/gemma3_* GGUFs against
transformers on every backend); this file pins the translation itself, including the
values llama.cpp assumes when a file is silent (layer pattern, Gemma 2's window and
soft-caps, the 27B query scale, Gemma 3's local RoPE base).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.errors import CorruptModelError
from inference.formats import read_checkpoint
from inference.formats.gguf_file import _config
from inference.models.llama import ModelArgs

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
S, F = "sliding_attention", "full_attention"


def _md(arch: str, layers: int, **keys: Any) -> dict[str, Any]:
    md = {f"{arch}.embedding_length": 256, f"{arch}.attention.head_count": 4,
          f"{arch}.attention.head_count_kv": 1, f"{arch}.block_count": layers,
          f"{arch}.attention.key_length": 64, f"{arch}.feed_forward_length": 512,
          f"{arch}.vocab_size": 320}
    return md | {f"{arch}.{k.replace('__', '.')}": v for k, v in keys.items()}


def test_gemma3_file_in_the_converters_form_reads_as_llama_cpp_does() -> None:
    # Six layers, no pattern key: llama.cpp's pattern 6 (five sliding, one global); the
    # local base from rope.freq_base_swa; linear x8 on the global layers only.
    ck = read_checkpoint(TINY / "gemma3_q4_k.gguf")
    args = ModelArgs.from_dict(ck.config)
    assert args.model_type == "gemma3_text" and args.layer_types == [S] * 5 + [F]
    assert [args.window(i) for i in range(6)] == [8] * 5 + [None]
    assert args.theta(0) == 1e4 and args.theta(5) == 1e6
    assert args.rope_scaling["factor"] == 8.0 and args.query_pre_attn_scalar == 64
    assert args.final_logit_softcapping is None and args.attn_logit_softcapping is None
    assert args.norm_weight_offset == 0.0  # the file holds 1 + w
    assert {"model.layers.5.post_attention_layernorm.weight",
            "model.layers.5.pre_feedforward_layernorm.weight",
            "model.layers.5.post_feedforward_layernorm.weight",
            "model.layers.5.self_attn.q_norm.weight"} <= set(ck.tensors)


def test_gemma2_files() -> None:
    args = ModelArgs.from_dict(read_checkpoint(TINY / "gemma2_q4_k.gguf").config)
    assert args.layer_types == [S, F] and args.sliding_window == 8
    assert (args.attn_logit_softcapping, args.final_logit_softcapping) == (50.0, 30.0)
    assert args.query_pre_attn_scalar == 64  # head_dim, as llama.cpp assumes
    # gemma2/'s query_pre_attn_scalar is 24, not head_dim 32: its file says attention.scale.
    args = ModelArgs.from_dict(read_checkpoint(TINY / "gemma2_f32.gguf").config)
    assert args.query_pre_attn_scalar == pytest.approx(24, rel=1e-6)


def test_defaults_where_the_file_is_silent() -> None:
    cfg = _config("gemma2", _md("gemma2", 4), {})
    assert cfg["layer_types"] == [S, F, S, F] and cfg["sliding_window"] == 4096
    assert (cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"]) == (50.0, 30.0)
    assert cfg["query_pre_attn_scalar"] == 64
    # Gemma 2 27B (46 layers) and Gemma 3 27B (62): hidden / heads, not head_dim.
    big = dict(embedding_length=4608, attention__head_count=32, attention__key_length=128)
    assert _config("gemma2", _md("gemma2", 46, **big), {})["query_pre_attn_scalar"] == 144.0
    assert _config("gemma2", _md("gemma2", 42, **big), {})["query_pre_attn_scalar"] == 128
    cfg = _config("gemma3", _md("gemma3", 62, embedding_length=5376,
                                attention__head_count=32, attention__key_length=128,
                                attention__sliding_window=1024), {})
    assert cfg["query_pre_attn_scalar"] == 168.0
    assert cfg["layer_types"][:6] == [S] * 5 + [F] and cfg["rope_local_base_freq"] == 1e4
    assert cfg["final_logit_softcapping"] is None
    # No window (or 0): no sliding layers at all.
    assert _config("gemma3", _md("gemma3", 6), {})["layer_types"] == [F] * 6
    # An explicit pattern, as a period or per layer.
    cfg = _config("gemma3", _md("gemma3", 3, attention__sliding_window=8,
                                attention__sliding_window_pattern=3), {})
    assert cfg["layer_types"] == [S, S, F]
    cfg = _config("gemma3", _md("gemma3", 3, attention__sliding_window=8,
                                attention__sliding_window_pattern=np.array([0, 1, 0], bool)),
                  {})
    assert cfg["layer_types"] == [F, S, F]


def test_pattern_of_the_wrong_length_is_one_sentence() -> None:
    md = _md("gemma3", 3, attention__sliding_window=8,
             attention__sliding_window_pattern=np.array([1, 0], bool))
    with pytest.raises(CorruptModelError, match=r"has 2 entries for 3 layers\.$"):
        _config("gemma3", md, {})
