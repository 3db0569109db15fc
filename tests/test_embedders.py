"""Embedders beyond BERT against sentence-transformers, on every backend.

Tiny random models saved by sentence-transformers (scripts/make_embedder_goldens.py):
XLM-RoBERTa in multilingual-e5's shape (mean pooling) and bge-m3's (CLS pooling), and a
Qwen3 decoder in Qwen3-Embedding's (last-token pooling), a nomic-bert in nomic-embed-text-
v1.5's (RoPE, SwiGLU, mean pooling) in the layout transformers writes, with nomic-ai's
config.json, and as llama.cpp's nomic-bert GGUF, all normalised, as each model's
modules.json and 1_Pooling/config.json declare; and a BERT in bge-small's shape (WordPiece,
CLS pooling) as llama.cpp writes it to GGUF. A GGUF's pooling comes from its pooling_type.
Bar: cosine >= 0.9999 per sentence (float32 on every backend; the CUDA backend runs
through the host emulator).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inference import load_model
from inference.embed import Pipeline, pool
from inference.errors import InvalidInputError, UnsupportedModelError
from tests.goldens_io import MINILM_MIN_COSINE, cosine_rows, load_npz

EMBEDDERS = Path(__file__).parent / "goldens" / "embedders"
# Test name -> (model under EMBEDDERS, its golden .npz): one golden per set of weights.
SOURCES = {"xlmr_e5": ("xlmr_e5", "xlmr_e5"), "xlmr_bge": ("xlmr_bge", "xlmr_bge"),
           "qwen3_embed": ("qwen3_embed", "qwen3_embed"),
           "bert_bge": ("bert_bge.gguf", "bert_bge"),
           "nomic_embed": ("nomic_embed", "nomic_embed"),
           "nomic_embed_hub": ("nomic_embed_hub", "nomic_embed"),
           "nomic_embed_gguf": ("nomic_embed.gguf", "nomic_embed")}
NAMES = list(SOURCES)
BACKENDS = ["numpy", "cpu", "mlx", "cuda"]


def golden(name: str) -> tuple[dict[str, np.ndarray], dict]:
    return load_npz(f"embedders/{SOURCES[name][1]}.npz")


_loaded: dict[tuple[str, str], object] = {}


def encoder(name: str, backend: str):
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    key = (name, backend)
    if key not in _loaded:
        path = EMBEDDERS / SOURCES[name][0]
        if backend == "cuda":
            from inference.api import Encoder
            from inference.backends.cuda import CudaBackend
            from inference.formats import read_checkpoint
            from inference.store import spec_for_path
            from tests.kernels.emulator.device import EmulatedDevice

            _loaded[key] = Encoder(spec_for_path(path), read_checkpoint(path),
                                   CudaBackend(EmulatedDevice()), "emulated")
        else:
            _loaded[key] = load_model(str(path), backend=backend)
    return _loaded[key]


# nomic_embed_hub differs from nomic_embed only in config.json: one backend shows it is read.
PARITY = [(n, b) for n in NAMES for b in BACKENDS if n != "nomic_embed_hub" or b == "numpy"]


@pytest.mark.parametrize("name,backend", PARITY)
def test_embeddings_match_sentence_transformers(name, backend):
    gold, meta = golden(name)
    m = encoder(name, backend)
    assert (m.pipeline.pooling, m.normalize) == (meta["pooling"], meta["normalize"])
    vecs = m.embed(meta["sentences"], batch_size=4)
    cos = cosine_rows(vecs, gold["embeddings"])
    assert cos.min() >= MINILM_MIN_COSINE, (int(np.argmin(cos)), float(cos.min()))
    # Normalised vectors: the lengths agree as well as the directions.
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_fixed_batches_give_the_planned_vectors():
    """The bench's like-for-like row batches as sentence-transformers does; the vectors
    are the planner's (to float32 summation order: padding differs between batches)."""
    gold, meta = golden(NAMES[0])
    m = encoder(NAMES[0], "cpu")
    planned = m.embed(meta["sentences"], batch_size=3)
    fixed = m.embed(meta["sentences"], batch_size=3, batching="fixed")
    np.testing.assert_allclose(fixed, planned, atol=1e-5)
    with pytest.raises(InvalidInputError, match="batching"):
        m.embed(["a"], batching="sorted")


@pytest.mark.parametrize("name", NAMES)
def test_ids_and_truncation_match_sentence_transformers(name):
    gold, meta = golden(name)
    m = encoder(name, "numpy")
    for i, s in enumerate(meta["sentences"]):
        assert m.tokenize(s) == gold[f"ids.{i}"].tolist(), s[:30]
    assert m.max_seq_length == meta["max_seq_length"]
    assert max(len(m.tokenize(s)) for s in meta["sentences"]) == meta["max_seq_length"]


@pytest.mark.parametrize("name,other", [("xlmr_bge", "mean"), ("xlmr_e5", "cls"),
                                        ("qwen3_embed", "mean"), ("bert_bge", "mean"),
                                        ("nomic_embed", "cls")])
def test_pooling_changes_the_vectors(name, other):
    # Pooling another way is measurably wrong, so the parity test above could not pass
    # with a default in place of the mode each model declares.
    from inference.embed import embed_ids

    gold, meta = golden(name)
    m = encoder(name, "numpy")
    ids = [m.tokenize(s) for s in meta["sentences"]]
    wrong = embed_ids(m.model, ids, pad_id=m.tokenizer.pad_id, limits=m.limits,
                      normalize=True, pooling=other)
    assert cosine_rows(wrong, gold["embeddings"]).min() < 0.99


def test_decoder_embedder_is_listed_and_loaded_as_an_encoder():
    from inference.store import spec_for_path

    spec = spec_for_path(EMBEDDERS / "qwen3_embed")
    assert (spec.kind, spec.architecture, spec.problem) == ("encoder", "qwen3", None)
    m = encoder("qwen3_embed", "numpy")
    assert m.kind == "encoder" and m.dim == 64 and m.tokenize("hi")[-1] == m.tokenizer.pad_id


def test_pool_modes():
    h = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    mask = np.array([[1, 1, 1], [1, 1, 0]], dtype=np.float32)
    assert pool(h, mask, "cls").tolist() == [[0, 1], [6, 7]]
    assert pool(h, mask, "lasttoken").tolist() == [[4, 5], [8, 9]]
    assert pool(h, mask, "mean").tolist() == [[2, 3], [7, 8]]


@pytest.mark.parametrize("config,mode", [
    ({"pooling_mode": "cls"}, "cls"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, "mean"),
    ({"pooling_mode_lasttoken": True}, "lasttoken"),
])
def test_pipeline_reads_both_pooling_config_formats(tmp_path, config, mode):
    # sentence-transformers >= 6 writes "pooling_mode"; the models on the Hub carry flags.
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 512}')
    assert Pipeline.from_dir(tmp_path) == Pipeline(mode, True, 512)


@pytest.mark.parametrize("config,named", [
    ({"pooling_mode_max_tokens": True}, "max"),
    ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "mean \\+ cls"),
])
def test_pooling_it_cannot_compute_is_refused_by_name(tmp_path, config, named):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(UnsupportedModelError, match=named):
        Pipeline.from_dir(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(UnsupportedModelError, match="Dense"):
        Pipeline.from_dir(tmp_path)


def test_no_modules_json_means_mean_pooling_unnormalised(tmp_path):
    assert Pipeline.from_dir(tmp_path) == Pipeline("mean", False, None)
    assert Pipeline.from_dir(tmp_path, gguf_pooling=2).pooling == "cls"


def test_gguf_bert_reads_its_own_pipeline_and_wordpiece(tmp_path):
    # llama.cpp's "phantom space" vocabulary back to WordPiece ("\u2581word" a word,
    # "ing" a continuation "##ing"); pooling from pooling_type, normalised as llama.cpp's
    # embedding tools do; a sentence-transformers folder beside the file changes nothing.
    import shutil

    from inference.store import spec_for_path

    src = EMBEDDERS / "bert_bge.gguf"
    spec = spec_for_path(src)
    assert (spec.kind, spec.architecture, spec.problem) == ("encoder", "bert", None)
    m = encoder("bert_bge", "numpy")
    tokens = m.tokenizer.backend.get_vocab()
    assert any(t.startswith("##") for t in tokens) and "[CLS]" in tokens
    assert m.tokenize("Hello") == m.tokenize("HELLO")  # uncased, as llama.cpp's WPM
    ids = m.tokenize("A cat.")
    assert (ids[0], ids[-1]) == (m.tokenizer.token_to_id("[CLS]"),
                                 m.tokenizer.token_to_id("[SEP]"))
    shutil.copy(src, tmp_path / "bert.gguf")
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    assert Pipeline.from_dir(tmp_path / "bert.gguf", gguf_pooling=2) == Pipeline("cls", True)
    assert Pipeline.from_dir(tmp_path / "bert.gguf") == Pipeline("mean", True)


# --- nomic-bert -------------------------------------------------------------------------------

def nomic_hub_copy(tmp_path: Path, **config: object) -> Path:
    """nomic_embed_hub with ``config`` over nomic-ai's config.json keys."""
    import shutil

    d = tmp_path / "nomic"
    shutil.copytree(EMBEDDERS / "nomic_embed_hub", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, **config}))
    return d


@pytest.mark.parametrize("name", ["nomic_embed", "nomic_embed_hub", "nomic_embed_gguf"])
def test_nomic_is_listed_as_an_encoder(name):
    from inference.store import spec_for_path

    spec = spec_for_path(EMBEDDERS / SOURCES[name][0])
    assert (spec.kind, spec.architecture, spec.problem) == ("encoder", "nomic_bert", None)
    assert spec.context_length == golden(name)[1]["max_seq_length"]


def test_nomic_reads_its_rope_base(tmp_path):
    # The base (1000 in nomic-embed-text-v1.5, not RoPE's usual 10000) moves every vector,
    # so the parity test above could not pass with it ignored.
    gold, meta = golden("nomic_embed")
    m = load_model(str(nomic_hub_copy(tmp_path, rotary_emb_base=10000)), backend="numpy")
    assert m.args.rope_theta == 10000.0
    assert cosine_rows(m.embed(meta["sentences"]), gold["embeddings"]).min() < 0.999


@pytest.mark.parametrize("config,named", [
    ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction"),
    ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved"),
    ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
    ({"activation_function": "gelu"}, "activation_function"),
    ({"qkv_proj_bias": True}, "qkv_proj_bias"),
    ({"prenorm": True}, "prenorm"),
    ({"moe_every_n_layers": 2, "num_experts": 8}, "mixture of experts"),
])
def test_nomic_variants_it_does_not_compute_are_refused_by_name(tmp_path, config, named):
    from inference.store import spec_for_path

    d = nomic_hub_copy(tmp_path, **config)
    with pytest.raises(UnsupportedModelError, match=named):
        load_model(str(d), backend="numpy")
    assert named in spec_for_path(d).problem  # the picker says why before a load


def test_nomic_bert_moe_gguf_is_refused_by_name(tmp_path):
    import gguf

    from inference.formats import read_checkpoint

    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "nomic-bert-moe")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'nomic-bert-moe'"):
        read_checkpoint(tmp_path / "moe.gguf")
