"""Safetensors directories: plain, sharded, BERT names, MLX-quantized, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from inference.errors import CorruptModelError, ModelNotFoundError
from inference.formats import read_checkpoint
from inference.formats.quants import dequantize
from inference.formats.safetensors_dir import read_safetensors_dir
from tests.bundled import minilm_dir

LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 32, "max_position_embeddings": 128}


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"model.embed_tokens.weight": rng.standard_normal((32, 64)).astype(np.float32),
            "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(
                np.float32),
            "model.layers.0.mlp.up_proj.weight": rng.standard_normal((128, 64)).astype(
                np.float16),
            "model.norm.weight": rng.standard_normal(64).astype(np.float32)}


def write_dir(path: Path, config: dict, tensors: dict[str, np.ndarray], **extra_json: dict
              ) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    for name, content in extra_json.items():
        (path / f"{name}.json").write_text(json.dumps(content))
    if tensors:
        save_file(tensors, str(path / "model.safetensors"))
    return path


def test_plain_dir_is_memory_mapped_and_exact(tmp_path: Path) -> None:
    w = weights()
    d = write_dir(tmp_path / "m", LLAMA_CONFIG, w,
                  tokenizer_config={"chat_template": "{{ messages }}"})
    ck = read_checkpoint(d)
    assert ck.format == "safetensors" and ck.config == LLAMA_CONFIG
    assert ck.chat_template == "{{ messages }}"
    assert set(ck.tensors) == set(w)
    for name, want in w.items():
        t = ck.tensors[name]
        assert t.shape == want.shape and t.qtype == {np.float32: "F32", np.float16: "F16"}[
            want.dtype.type]
        assert np.array_equal(t.data, want)
        assert not t.data.flags.writeable  # a view of the read-only map, not a copy
    assert read_checkpoint(d / "model.safetensors").tensors.keys() == w.keys()


def test_sharded_dir(tmp_path: Path) -> None:
    w = weights(1)
    d = write_dir(tmp_path / "sharded", LLAMA_CONFIG, {})
    names = sorted(w)
    shards = {"model-00001-of-00002.safetensors": names[:2],
              "model-00002-of-00002.safetensors": names[2:]}
    for fname, part in shards.items():
        save_file({n: w[n] for n in part}, str(d / fname))
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    ck = read_safetensors_dir(d)
    assert all(np.array_equal(ck.tensors[n].data, w[n]) for n in w)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CorruptModelError, match="00002"):
        read_safetensors_dir(d)


def test_bert_prefix_is_dropped_and_buffers_skipped(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = {"bert.embeddings.word_embeddings.weight": rng.standard_normal((8, 4)).astype(np.float32),
         "bert.embeddings.position_ids": np.arange(16, dtype=np.int64)[None],
         "bert.encoder.layer.0.output.dense.weight": np.ones((4, 4), np.float32),
         "cls.predictions.bias": np.zeros(8, np.float32)}
    d = write_dir(tmp_path / "b", {"model_type": "bert", "hidden_size": 4}, w)
    ck = read_safetensors_dir(d)
    assert set(ck.tensors) == {"embeddings.word_embeddings.weight",
                               "encoder.layer.0.output.dense.weight", "cls.predictions.bias"}
    assert ck.tensors["embeddings.word_embeddings.weight"].name == \
        "embeddings.word_embeddings.weight"


def test_bundled_minilm() -> None:
    ck = read_checkpoint(minilm_dir())
    ref = load_file(str(minilm_dir() / "model.safetensors"))
    assert ck.config["model_type"] == "bert" and ck.format == "safetensors"
    assert set(ck.tensors) == set(ref) - {"embeddings.position_ids"}
    assert len(ck.tensors) == 103
    assert ck.tensors["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert ck.tensors["encoder.layer.5.intermediate.dense.weight"].shape == (1536, 384)
    assert all(np.array_equal(ck.tensors[n].data, ref[n]) for n in ck.tensors)


# --- MLX ------------------------------------------------------------------------------------

mx = pytest.importorskip("mlx.core")


def test_bf16_tensors_travel_as_raw_bytes(tmp_path: Path) -> None:
    d = tmp_path / "bf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    x = mx.array(np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32))
    mx.save_safetensors(str(d / "model.safetensors"), {"model.norm.weight": x.astype(mx.bfloat16)})
    t = read_safetensors_dir(d).tensors["model.norm.weight"]
    assert (t.qtype, t.shape, t.data.dtype, t.data.shape) == ("BF16", (3, 8), np.uint8, (3, 16))
    assert np.array_equal(dequantize(t), np.array(x.astype(mx.bfloat16).astype(mx.float32)))


def test_mlx_quantized_dir(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    d = tmp_path / "mlx"
    d.mkdir()
    config = dict(LLAMA_CONFIG, quantization={
        "group_size": 64, "bits": 4,
        "model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 6}})
    (d / "config.json").write_text(json.dumps(config))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"},
                           {"name": "default", "template": "D"}]}))
    dense = {"model.embed_tokens": (32, 64, 64, 4), "model.layers.0.self_attn.q_proj":
             (64, 128, 64, 4), "model.layers.0.mlp.up_proj": (128, 64, 32, 6)}
    tensors, refs = {}, {}
    for prefix, (rows, cols, group, bits) in dense.items():
        w = mx.array(rng.standard_normal((rows, cols)).astype(np.float32)).astype(mx.bfloat16)
        q, s, b = mx.quantize(w, group_size=group, bits=bits)
        tensors |= {f"{prefix}.weight": q, f"{prefix}.scales": s, f"{prefix}.biases": b}
        refs[f"{prefix}.weight"] = np.array(mx.dequantize(
            q, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits))
    tensors["model.norm.weight"] = mx.ones((64,), dtype=mx.bfloat16)
    mx.save_safetensors(str(d / "model.safetensors"), tensors)

    ck = read_checkpoint(d)
    assert ck.format == "mlx" and ck.chat_template == "D"
    assert set(ck.tensors) == set(refs) | {"model.norm.weight"}
    for name, ref in refs.items():
        t = ck.tensors[name]
        assert t.qtype == "MLX" and t.shape == ref.shape
        assert (t.extra["group_size"], t.extra["bits"]) == dense[name[:-7]][2:]
        assert t.data.dtype == np.uint32 and t.extra["scales"].dtype == np.float32
        assert np.array_equal(dequantize(t), ref)
    assert ck.tensors["model.norm.weight"].qtype == "BF16"


def test_mlx_mismatched_bits_is_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "bad-mlx"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(LLAMA_CONFIG, quantization={
        "group_size": 64, "bits": 8})))
    q, s, b = mx.quantize(mx.ones((8, 128)), group_size=64, bits=4)
    mx.save_safetensors(str(d / "model.safetensors"), {"x.weight": q, "x.scales": s,
                                                        "x.biases": b})
    with pytest.raises(CorruptModelError, match="x.*8-bit"):
        read_safetensors_dir(d)


# --- bad input ------------------------------------------------------------------------------

def test_missing_and_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nowhere"):
        read_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="config.json"):
        read_safetensors_dir(tmp_path / "empty")
    write_dir(tmp_path / "noweights", LLAMA_CONFIG, {})
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        read_safetensors_dir(tmp_path / "noweights")


def test_truncated_and_garbage_files_are_corrupt(tmp_path: Path) -> None:
    d = write_dir(tmp_path / "t", LLAMA_CONFIG, weights())
    f = d / "model.safetensors"
    data = f.read_bytes()
    for n in (0, 4, 8, 50, len(data) // 2, len(data) - 1):
        f.write_bytes(data[:n])
        with pytest.raises(CorruptModelError, match="model.safetensors"):
            read_safetensors_dir(d)
    f.write_bytes(b"\xff" * 64)
    with pytest.raises(CorruptModelError):
        read_safetensors_dir(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CorruptModelError, match="config.json"):
        read_safetensors_dir(d)
