"""GGUF reader: config and name mapping, q/k un-permutation, metadata, and bad files."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from inference.errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from inference.formats import read_checkpoint
from inference.formats.gguf_file import read_gguf, unpermute_rows
from inference.formats.quants import dequantize
from inference.formats.tensor import TensorData
from tests.bundled import smollm2_gguf

HIDDEN, HEADS, KV_HEADS, FF, LAYERS, VOCAB = 256, 4, 2, 512, 2, 32  # K-quants need 256
HEAD_DIM = HIDDEN // HEADS
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def converter_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, verbatim in NumPy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_weights(seed: int = 0, bias: bool = False) -> dict[str, np.ndarray]:
    """Random decoder weights under Hugging Face names, (out, in) order."""
    rng = np.random.default_rng(seed)

    def r(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w = {"model.embed_tokens.weight": r(VOCAB, HIDDEN), "model.norm.weight": r(HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": r(HIDDEN),
              p + "post_attention_layernorm.weight": r(HIDDEN),
              p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.k_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.v_proj.weight": r(KV_HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.o_proj.weight": r(HIDDEN, HEADS * HEAD_DIM),
              p + "mlp.gate_proj.weight": r(FF, HIDDEN), p + "mlp.up_proj.weight": r(FF, HIDDEN),
              p + "mlp.down_proj.weight": r(HIDDEN, FF)}
        if bias:
            w |= {p + "self_attn.q_proj.bias": r(HEADS * HEAD_DIM),
                  p + "self_attn.k_proj.bias": r(KV_HEADS * HEAD_DIM),
                  p + "self_attn.v_proj.bias": r(KV_HEADS * HEAD_DIM)}
    return w


GGUF_BLOCK = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}

# What each HF weight is stored as in the tiny files.
QTYPES = {"embed_tokens": T.Q8_0, "q_proj": T.Q4_0, "k_proj": T.Q4_K, "v_proj": T.Q6_K,
          "o_proj": T.Q5_1, "gate_proj": T.Q4_1, "up_proj": T.Q5_0, "down_proj": T.F16,
          "lm_head": T.Q8_0}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{GGUF_BLOCK[module]}.{kind}"


def stored(hf: str, w: np.ndarray) -> tuple[np.ndarray, T]:
    kind = next((k for k in QTYPES if k in hf), None)
    q = QTYPES[kind] if kind and w.ndim == 2 else T.F32
    if q == T.F32:
        return w, q
    if q == T.F16:
        return w.astype(np.float16), q
    if q in (T.Q4_K, T.Q6_K):  # gguf cannot quantize K-types: store random valid blocks
        from tests.test_quants import random_rows

        return random_rows(q.name, w.shape[0], w.shape[1] // 256), q
    return quantize(w, q), q


def write_decoder(path: Path, arch: str = "llama", *, untied: bool = False,
                  bias: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny decoder GGUF as llama.cpp's converter would write it; returns what it stored
    per HF name (raw bytes for quantized tensors, in Hugging Face row order)."""
    w = hf_weights(seed, bias)
    if untied:
        w["lm_head.weight"] = np.random.default_rng(seed + 1).standard_normal(
            (VOCAB, HIDDEN)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(VOCAB - 1)] + ["caf\u00e9"])
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["t o", "to k"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    expected = {}
    for hf, x in w.items():
        data, q = stored(hf, x)
        expected[hf] = data
        if arch != "qwen2" and (".q_proj." in hf or ".k_proj." in hf):
            heads = HEADS if ".q_proj." in hf else KV_HEADS
            data = converter_permute(data, heads)
        if q in (T.F32, T.F16):
            writer.add_tensor(gguf_name(hf), data)
        else:
            writer.add_tensor(gguf_name(hf), data, raw_dtype=q)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_decoder(path)


# --- a well-formed file ---------------------------------------------------------------------

def test_llama_config_names_and_metadata(tiny_llama: tuple[Path, dict]) -> None:
    path, expected = tiny_llama
    ck = read_gguf(path)
    assert ck.format == "gguf" and ck.path == path
    c = ck.config
    assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"]
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]) == (HIDDEN, FF, 2)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (4, 2, 64)
    assert c["rope_theta"] == 50000.0 and c["rms_norm_eps"] == pytest.approx(1e-5)
    assert (c["vocab_size"], c["max_position_embeddings"]) == (VOCAB, 256)
    assert c["tie_word_embeddings"] is True and c["attention_bias"] is False
    assert (c["bos_token_id"], c["eos_token_id"]) == (1, 2)
    assert set(ck.tensors) == set(expected)
    for name, t in ck.tensors.items():
        assert t.name == name
        assert t.shape == hf_weights()[name].shape
    assert ck.tensors["model.layers.0.self_attn.q_proj.weight"].qtype == "Q4_0"
    assert ck.tensors["model.layers.1.mlp.down_proj.weight"].data.dtype == np.float16
    assert ck.chat_template == TEMPLATE
    md = ck.metadata
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == LAYERS
    assert md["tokenizer.ggml.tokens"][-1] == "caf\u00e9" and len(md["tokenizer.ggml.tokens"]) == 32
    assert md["tokenizer.ggml.merges"] == ["t o", "to k"]
    assert isinstance(md["tokenizer.ggml.token_type"], np.ndarray)
    assert md["tokenizer.ggml.token_type"].tolist() == [1] * VOCAB
    assert md["tokenizer.chat_template"] == TEMPLATE


def test_rows_come_back_in_hugging_face_order(tiny_llama: tuple[Path, dict]) -> None:
    path, expected = tiny_llama
    ck = read_gguf(path)
    for name, want in expected.items():
        got = ck.tensors[name].data
        assert np.array_equal(np.asarray(got), want), name
    q = ck.tensors["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(dequantize(q), dequantize(
        TensorData("q", q.shape, "Q4_0", quantize(hf_weights()[q.name], T.Q4_0))))


def test_unpermute_inverts_the_converter() -> None:
    rng = np.random.default_rng(1)
    for heads, rows, cols in ((4, 64, 8), (3, 192, 2), (9, 576, 1)):
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        assert np.array_equal(unpermute_rows(converter_permute(w, heads), heads), w)
        b = w[:, 0]
        assert np.array_equal(unpermute_rows(converter_permute(b, heads), heads), b)


def _rope_neox(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang),
                           x2 * np.cos(ang) + x1 * np.sin(ang)], axis=-1)


def _rope_adjacent(x: np.ndarray, pos: np.ndarray, theta: float) -> np.ndarray:
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(ang) - b * np.sin(ang)
    out[..., 1::2] = b * np.cos(ang) + a * np.sin(ang)
    return out


def test_why_unpermute_lets_models_use_neox_rope() -> None:
    # GGML's adjacent-pair RoPE on the converter's permuted q equals the HF (half-split)
    # RoPE on the original q, up to the same permutation: so attention scores agree, and
    # with un-permuted rows the model must use the half-split form.
    rng = np.random.default_rng(2)
    heads, d, seq = 3, 16, 5
    w = rng.standard_normal((heads * d, 24))
    x = rng.standard_normal((seq, 24))
    pos = np.arange(seq, dtype=np.float64)
    q_hf = (x @ w.T).reshape(seq, heads, d).transpose(1, 0, 2)
    q_gg = (x @ converter_permute(w, heads).T).reshape(seq, heads, d).transpose(1, 0, 2)
    rot_hf = _rope_neox(q_hf, pos, 1e4)
    rot_gg = _rope_adjacent(q_gg, pos, 1e4)
    back = unpermute_rows(rot_gg.transpose(0, 2, 1).reshape(heads * d, seq), heads)
    assert np.allclose(back, rot_hf.transpose(0, 2, 1).reshape(heads * d, seq), atol=1e-12)
    # and without un-permuting, the two RoPE forms disagree
    assert not np.allclose(rot_gg, rot_hf)


def test_untied_output_and_read_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "untied.gguf"
    write_decoder(path, untied=True)
    ck = read_checkpoint(path)
    assert ck.config["tie_word_embeddings"] is False
    assert ck.tensors["lm_head.weight"].shape == (VOCAB, HIDDEN)
    assert read_checkpoint(tmp_path).config["model_type"] == "llama"  # dir with one .gguf


def test_qwen2_is_not_unpermuted_and_has_biases(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    expected = write_decoder(path, arch="qwen2", bias=True)
    ck = read_gguf(path)
    assert ck.config["model_type"] == "qwen2" and ck.config["attention_bias"] is True
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias"):
        assert np.array_equal(np.asarray(ck.tensors[name].data), expected[name])


def test_llama_biases_are_unpermuted_too(tmp_path: Path) -> None:
    path = tmp_path / "bias.gguf"
    expected = write_decoder(path, bias=True)
    ck = read_gguf(path)
    assert ck.config["attention_bias"] is True
    b = "model.layers.0.self_attn.q_proj.bias"
    assert np.array_equal(ck.tensors[b].data, expected[b])


def test_bert_names(tmp_path: Path) -> None:
    path = tmp_path / "bert.gguf"
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_layer_norm_eps(1e-12)
    w.add_token_list([f"t{i}" for i in range(16)])
    shapes = {"token_embd.weight": (16, 32), "position_embd.weight": (128, 32),
              "token_types.weight": (2, 32), "token_embd_norm.weight": (32,),
              "blk.0.attn_q.weight": (32, 32), "blk.0.attn_q.bias": (32,),
              "blk.0.attn_output_norm.bias": (32,), "blk.0.ffn_up.weight": (64, 32),
              "blk.0.layer_output_norm.weight": (32,)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = read_gguf(path)
    assert ck.config["model_type"] == "bert" and ck.config["num_hidden_layers"] == 1
    assert ck.config["type_vocab_size"] == 2 and ck.config["vocab_size"] == 16
    assert set(ck.tensors) == {
        "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
        "encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.query.bias",
        "encoder.layer.0.attention.output.LayerNorm.bias",
        "encoder.layer.0.intermediate.dense.weight", "encoder.layer.0.output.LayerNorm.weight"}


# --- bad input ------------------------------------------------------------------------------

def _one_tensor_file(path: Path, arch: str = "llama", qtype: T = T.F32) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    if qtype == T.F32:
        w.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    else:
        bsize, tsize = gguf.GGML_QUANT_SIZES[qtype]
        w.add_tensor("token_embd.weight", np.zeros((4, 256 // bsize * tsize), np.uint8),
                     raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        read_gguf(tmp_path / "nope.gguf")


def test_bad_magic_and_empty(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(100))
    with pytest.raises(CorruptModelError, match="bad.gguf.*magic"):
        read_gguf(bad)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(CorruptModelError, match="empty.gguf"):
        read_gguf(empty)


def test_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="mamba"):
        read_gguf(_one_tensor_file(tmp_path / "m.gguf", arch="mamba"))


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="token_embd.weight.*IQ4_NL"):
        read_gguf(_one_tensor_file(tmp_path / "iq.gguf", qtype=T.IQ4_NL))


def test_unknown_type_id(tmp_path: Path) -> None:
    path = _one_tensor_file(tmp_path / "u.gguf")
    raw = bytearray(path.read_bytes())
    name = b"token_embd.weight"
    at = raw.find(name) + len(name) + 4 + 2 * 8  # n_dims, two dims, then the type id
    assert int.from_bytes(raw[at:at + 4], "little") == 0  # F32
    raw[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(UnsupportedModelError, match="token_embd.weight.*99"):
        read_gguf(path)


def test_absurd_counts_fail_fast(tmp_path: Path) -> None:
    path = _one_tensor_file(tmp_path / "c.gguf")
    raw = bytearray(path.read_bytes())
    raw[16:24] = (2**62).to_bytes(8, "little")  # kv_count
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptModelError, match="c.gguf"):
        read_gguf(path)


def test_every_truncation_of_a_small_file_is_corrupt(tiny_llama: tuple[Path, dict],
                                                     tmp_path: Path) -> None:
    path, _ = tiny_llama
    data = path.read_bytes()
    reader = gguf.GGUFReader(path)
    data_end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    cut = tmp_path / "cut.gguf"
    cuts = sorted(set(range(0, 1500, 11)) | set(range(0, data_end, max(1, data_end // 100))))
    for n in cuts:
        cut.write_bytes(data[:n])
        with pytest.raises(CorruptModelError, match="cut.gguf"):
            read_gguf(cut)


# --- the bundled SmolLM2 --------------------------------------------------------------------



def testsmollm2_gguf() -> None:
    ck = read_gguf(smollm2_gguf())
    c = ck.config
    assert {k: c[k] for k in ("model_type", "hidden_size", "intermediate_size",
                              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                              "head_dim", "vocab_size", "max_position_embeddings",
                              "tie_word_embeddings", "bos_token_id", "eos_token_id")} == {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}
    assert c["rope_theta"] == 100000.0 and c["rms_norm_eps"] == pytest.approx(1e-5)
    assert len(ck.tensors) == 272 and "lm_head.weight" not in ck.tensors
    emb = ck.tensors["model.embed_tokens.weight"]
    assert (emb.shape, emb.qtype, emb.data.shape) == ((49152, 576), "Q8_0", (49152, 612))
    k = ck.tensors["model.layers.7.self_attn.k_proj.weight"]
    assert (k.shape, k.qtype) == ((192, 576), "Q4_1")
    from inference.formats.gguf_file import open_gguf  # the file's own rows, unmapped

    raw = next(t for t in open_gguf(smollm2_gguf()).tensors if t.name == "blk.7.attn_k.weight")
    assert np.array_equal(k.data, unpermute_rows(np.asarray(raw.data), 3))
    assert not np.array_equal(k.data, raw.data)
    assert ck.chat_template.startswith("{% for message in messages %}")
    assert len(ck.metadata["tokenizer.ggml.tokens"]) == 49152
    assert ck.metadata["tokenizer.ggml.model"] == "gpt2"


@pytest.mark.parametrize("keep", [3, 100, 5000, 2_000_000, 40_000_000, 98_362_000])
def test_truncated_smollm2_is_corrupt(keep: int, tmp_path: Path) -> None:
    cut = tmp_path / "smol-cut.gguf"
    with open(smollm2_gguf(), "rb") as src:
        cut.write_bytes(src.read(keep))
    with pytest.raises(CorruptModelError, match="smol-cut.gguf") as e:
        read_gguf(cut)
    assert "\n" not in str(e.value)


def test_split_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m-00001-of-00002.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint16("split.count", 2)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="00001-of-00002.gguf.*split"):
        read_gguf(path)
