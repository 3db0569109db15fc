"""Architectures and settings the engine cannot run are refused at load, in one sentence
that names what is missing (before any weight moves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference import load_model
from inference.errors import UnsupportedModelError
from inference.models import architecture
from inference.models.llama import ModelArgs

BASE = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
        "intermediate_size": 16, "num_attention_heads": 2, "vocab_size": 10}


@pytest.mark.parametrize("model_type", ["gemma3", "mamba"])
def test_unfinished_architectures_are_refused_by_name(model_type: str) -> None:
    with pytest.raises(UnsupportedModelError, match=f"'{model_type}'.*not support"):
        architecture(model_type, "x")


@pytest.mark.parametrize("change, words", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
    ({"hidden_act": "relu"}, "activation 'relu'"),
    ({"partial_rotary_factor": 0.75}, "partial_rotary_factor 0.75"),
])
def test_unsupported_settings_are_refused_in_one_sentence(change: dict, words: str) -> None:
    with pytest.raises(UnsupportedModelError, match=words) as e:
        ModelArgs.from_dict({**BASE, **change})
    assert str(e.value).count(". ") == 0 and str(e.value).endswith(".")


def test_multimodal_gemma3_directory_is_refused_at_load(tmp_path: Path) -> None:
    # Gemma 3 4B+ as Gemma3ForConditionalGeneration (model_type gemma3): vision tower and
    # language_model.* names; only its text-only form (gemma3_text) runs.
    src = Path(__file__).resolve().parent / "goldens" / "tiny" / "gemma"
    d = tmp_path / "g3"
    d.mkdir()
    for f in src.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text()) | {"model_type": "gemma3"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="'gemma3'"):
        load_model(str(d), backend="numpy")


def test_fused_weight_with_wrong_rows_names_the_tensor() -> None:
    import numpy as np

    from inference.backends.numpy_backend import NumpyBackend
    from inference.formats.tensor import Checkpoint, TensorData
    from inference.models.common import Weights

    t = TensorData("qkv", (10, 4), "F32", np.zeros((10, 4), np.float32))
    w = Weights(Checkpoint(Path("m.gguf"), "gguf", {}, {"qkv": t}), NumpyBackend())
    with pytest.raises(UnsupportedModelError, match="qkv has 10 rows, expected 4 \\+ 4"):
        w.linears(["q", "k"], fused="qkv", sizes=[4, 4])


def test_a_decoder_process_does_not_import_the_encoders_code() -> None:
    """The registry imports an architecture's module at its first lookup: loading and
    running a decoder keeps BERT's code out of the process (and the other way round)."""
    import os
    import subprocess
    import sys

    code = ("import sys, inference, inference.cli; from inference.models import ARCHITECTURES, "
            "architecture; before = 'inference.models.bert' in sys.modules; "
            "known = 'bert' in ARCHITECTURES and len(ARCHITECTURES) == len(list(ARCHITECTURES)); "
            "architecture('llama'); after = 'inference.models.bert' in sys.modules; "
            "print(before, known, after, architecture('xlm-roberta').__name__)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.stdout.split() == ["False", "True", "False", "inference.models.bert"]
