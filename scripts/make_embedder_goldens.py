"""Write tests/goldens/embedders/: tiny random sentence-embedding models beyond BERT, saved by
sentence-transformers, and its embeddings of a multilingual sentence set.

    .venv-ref/bin/python scripts/make_embedder_goldens.py

Models (hidden 64, 2 layers, 4 heads, MLP 128; weights N(0, 0.2), biases N(0, 0.1),
LayerNorm weights 1 + N(0, 0.1), drawn in sorted-name order from default_rng(seed)):

    xlmr_e5/   multilingual-e5's shape: XLMRobertaModel (positions start after the pad id,
               one token type), a SentencePiece-style Unigram tokenizer adding <s> ... </s>,
               mean pooling, Normalize
    xlmr_bge/  bge-m3 (dense)'s shape: the same architecture, CLS pooling, Normalize
    qwen3_embed/  Qwen3-Embedding's shape: Qwen3Model (no lm_head; per-head q/k norms, GQA,
               head_dim 16), Qwen's byte-level BPE whose post-processor appends
               <|endoftext|>, left padding, last-token pooling, Normalize

    bert_bge.gguf  bge-small's shape as llama.cpp's converter writes a BERT: a tiny BertModel
               (uncased WordPiece vocabulary trained here, [CLS] ... [SEP], CLS pooling,
               Normalize) in arch "bert" with pooling_type 2, F32 tensors, and the
               vocabulary in its "phantom space" form (a word-initial piece "\u2581word",
               a continuation "##ing" stored as "ing", control tokens as they are), special
               ids by gguf.SpecialVocab. The sentence-transformers directory it came from is
               not kept; bert_bge.npz holds its embeddings. ``--only bert`` writes these two
               alone.
    nomic_embed/  nomic-embed-text-v1.5's shape: NomicBertModel (RoPE base 1000 on whole
               heads, SwiGLU MLP, no biases but the LayerNorms, post-norm as BERT), the
               WordPiece tokenizer above, mean pooling, Normalize. transformers 5 writes
               its own config keys and the Hub's tensor names (contrastors': emb_ln,
               encoder.layers.N.attn.Wqkv = [q; k; v] rows, fc11 = up, fc12 = gate, fc2,
               norm1, norm2), reversing its conversion mapping.
    nomic_embed_hub/  the same directory with config.json as nomic-ai's checkpoints ship
               it: GPT-2-style keys (n_embd, n_inner, rotary_emb_base, activation_function
               "swiglu", ...). transformers ignores those keys, so it is checked here with
               the dimensions passed in: it loads to the same hidden states.
    nomic_embed.gguf  the same model as llama.cpp's converter writes a NomicBertModel: arch
               "nomic-bert", tensors named by gguf-py's own TensorNameMap from the Hub's
               names, rope.freq_base, pooling_type 1 (mean), F32, the vocabulary as for
               bert_bge.gguf. All three share nomic_embed.npz. ``--only nomic`` writes them
               alone.

sentence-transformers writes modules.json, 1_Pooling/config.json and sentence_bert_config.json
itself, so the engine reads the pooling the way real checkpoints declare it.
``NAME.npz``: ``embeddings`` (n, 64) float32 from ``SentenceTransformer(dir).encode``,
``ids.<i>`` the ids its tokenizer gave sentence i, ``meta`` (sentences, versions, pooling).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import sentence_transformers
import sentencepiece as spm
import tokenizers
import torch
import transformers
from make_family_tokenizer_goldens import QWEN2_SPLIT, train_byte_level
from sentence_transformers import SentenceTransformer
from sentence_transformers import models as st_models
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoModel,
    BertConfig,
    BertModel,
    NomicBertConfig,
    NomicBertModel,
    Qwen3Config,
    Qwen3Model,
    XLMRobertaConfig,
    XLMRobertaModel,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "goldens" / "embedders"
MAX_SEQ = 48

SENTENCES = [
    "", "   ", "A cat sits on the mat.", "A kitten is sitting on a rug.",
    "The stock market fell sharply today.", "Der Hund läuft schnell über die Straße.",
    "Le chat dort sur le canapé.", "El niño come una manzana roja.",
    "東京は日本の首都です。", "你好，世界！", "Привет, мир!", "مرحبا بالعالم",
    "Emoji 🤖🚀 and symbols ∑ ≤ ≠", "query: how do tokenizers work?",
    "passage: Tokenizers split text into pieces a model knows.",
    "def add(a, b):\n    return a + b",
    " ".join(f"word{i}" for i in range(80)),  # longer than MAX_SEQ: truncated
]
TRAIN = SENTENCES * 3 + [
    "The quick brown fox jumps over the lazy dog.", "Sentence embeddings compare meaning.",
    "Multilingual models read many scripts: Latin, Cyrillic, Arabic, CJK.",
    "query: passage: what is the capital of France? Paris is the capital of France.",
] * 5


def unigram_tokenizer() -> Tokenizer:
    """XLM-R's tokenizer.json shape: a SentencePiece Unigram model (trained here by
    sentencepiece, single-threaded so the result is stable), Metaspace, ``<s> $A </s>``,
    ids <s> 0, <pad> 1, </s> 2, <unk> 3 as in XLM-R."""
    with tempfile.TemporaryDirectory() as t:
        (Path(t) / "train.txt").write_text("\n".join(TRAIN), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(Path(t) / "train.txt"), model_prefix=str(Path(t) / "u"),
            model_type="unigram", vocab_size=300, character_coverage=1.0, num_threads=1,
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=str(Path(t) / "u.model"))
    pieces = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(1, sp.get_piece_size())]
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces]
    tk = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    tk.add_special_tokens([AddedToken(x, special=True) for x in ("<s>", "<pad>", "</s>", "<unk>")])
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    return tk


def init_weights(model: torch.nn.Module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("LayerNorm.weight", "norm.weight", "layernorm.weight")):
                v = 1.0 + 0.1 * rng.standard_normal(p.shape)
            elif name.endswith(".bias"):
                v = 0.1 * rng.standard_normal(p.shape)
            else:
                v = 0.2 * rng.standard_normal(p.shape)
            p.copy_(torch.from_numpy(v.astype(np.float32)))


def make_xlmr(name: str, pooling: str, seed: int) -> None:
    d = OUT / name
    base = OUT / f"_{name}_base"
    base.mkdir(parents=True)
    tk = unigram_tokenizer()
    tk.save(str(base / "tokenizer.json"))
    (base / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "model_max_length": 512}, indent=1))
    cfg = XLMRobertaConfig(vocab_size=tk.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128,
                           max_position_embeddings=MAX_SEQ + 2, type_vocab_size=1,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           layer_norm_eps=1e-5, hidden_act="gelu")
    model = XLMRobertaModel(cfg, add_pooling_layer=False)
    init_weights(model, seed)
    model.save_pretrained(base, safe_serialization=True)
    transformer = st_models.Transformer(str(base), max_seq_length=MAX_SEQ)
    pool = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=pooling)
    st = SentenceTransformer(modules=[transformer, pool, st_models.Normalize()], device="cpu")
    st.save(str(d))
    (d / "README.md").unlink(missing_ok=True)  # a generated model card
    shutil.rmtree(base)
    reference(d, {"pooling": pooling, "normalize": True})


def make_qwen3_embed(name: str, seed: int) -> None:
    d = OUT / name
    base = OUT / f"_{name}_base"
    base.mkdir(parents=True)
    tk = train_byte_level(QWEN2_SPLIT, nfc=True)
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True)
                           for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    eot = tk.token_to_id("<|endoftext|>")
    tk.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)])
    tk.save(str(base / "tokenizer.json"))
    (base / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "padding_side": "left",
        "model_max_length": 131072}, indent=1))
    cfg = Qwen3Config(vocab_size=tk.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      intermediate_size=128, max_position_embeddings=256, rope_theta=1e6,
                      tie_word_embeddings=True, rms_norm_eps=1e-6)
    model = Qwen3Model(cfg)
    init_weights(model, seed)
    model.save_pretrained(base, safe_serialization=True)
    transformer = st_models.Transformer(str(base), max_seq_length=MAX_SEQ)
    pool = st_models.Pooling(transformer.get_word_embedding_dimension(),
                             pooling_mode="lasttoken")
    st = SentenceTransformer(modules=[transformer, pool, st_models.Normalize()], device="cpu")
    st.save(str(d))
    (d / "README.md").unlink(missing_ok=True)
    shutil.rmtree(base)
    reference(d, {"pooling": "lasttoken", "normalize": True})


def wordpiece_tokenizer() -> Tokenizer:
    """bert-base-uncased's tokenizer.json shape, trained small on the same sentences."""
    from tokenizers.implementations import BertWordPieceTokenizer

    tk = BertWordPieceTokenizer(lowercase=True, strip_accents=None, handle_chinese_chars=True,
                                clean_text=True)
    tk.train_from_iterator(TRAIN, vocab_size=400, min_frequency=1, show_progress=False,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    out = Tokenizer.from_str(tk.to_str())
    out.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", out.token_to_id("[CLS]")), ("[SEP]", out.token_to_id("[SEP]"))])
    return out


def save_wordpiece_tokenizer(base: Path, model_max_length: int) -> Tokenizer:
    """wordpiece_tokenizer() saved in ``base`` with bert-base-uncased's tokenizer_config."""
    tk = wordpiece_tokenizer()
    tk.save(str(base / "tokenizer.json"))
    (base / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "mask_token": "[MASK]", "model_max_length": model_max_length}, indent=1))
    return tk


def make_bert_gguf(name: str, seed: int) -> None:
    """A tiny BERT embedder (CLS pooling, Normalize) as a sentence-transformers directory in
    a temporary place, its embeddings as the reference, and the model as llama.cpp's
    BertModel converter writes it (see the module docstring)."""
    import gguf

    with tempfile.TemporaryDirectory() as t:
        d, base = Path(t) / name, Path(t) / "base"
        base.mkdir()
        tk = save_wordpiece_tokenizer(base, model_max_length=512)
        cfg = BertConfig(vocab_size=tk.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=MAX_SEQ, type_vocab_size=2,
                         layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0)
        model = BertModel(cfg, add_pooling_layer=False)
        init_weights(model, seed)
        model.save_pretrained(base, safe_serialization=True)
        transformer = st_models.Transformer(str(base), max_seq_length=MAX_SEQ)
        pool = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="cls")
        st = SentenceTransformer(modules=[transformer, pool, st_models.Normalize()], device="cpu")
        st.save(str(d))
        reference(d, {"pooling": "cls", "normalize": True, "source": "bert_bge.gguf"})

        w = encoder_gguf(name, "bert", cfg, gguf.PoolingType.CLS, tk, base)
        names = {"embeddings.word_embeddings": "token_embd",
                 "embeddings.position_embeddings": "position_embd",
                 "embeddings.token_type_embeddings": "token_types",
                 "embeddings.LayerNorm": "token_embd_norm"}
        block = {"attention.self.query": "attn_q", "attention.self.key": "attn_k",
                 "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
                 "attention.output.LayerNorm": "attn_output_norm",
                 "intermediate.dense": "ffn_up", "output.dense": "ffn_down",
                 "output.LayerNorm": "layer_output_norm"}
        for i in range(cfg.num_hidden_layers):
            names |= {f"encoder.layer.{i}.{h}": f"blk.{i}.{g}" for h, g in block.items()}
        for hname, p in model.state_dict().items():
            stem, kind = hname.rsplit(".", 1)
            if stem in names:
                w.add_tensor(f"{names[stem]}.{kind}", p.float().numpy())
        finish_gguf(w)


def encoder_gguf(name: str, arch: str, cfg, pooling, tk: Tokenizer, tok_dir: Path):
    """A GGUFWriter for OUT/name.gguf with an encoder's header as llama.cpp's BertModel
    converter writes it (F32) and the WordPiece vocabulary of ``tk`` (saved in ``tok_dir``)."""
    import gguf

    w = gguf.GGUFWriter(str(OUT / f"{name}.gguf"), arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_token_type_count(cfg.type_vocab_size)
    add_wordpiece_vocab(w, tk, tok_dir)
    return w


def finish_gguf(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_wordpiece_vocab(w, tk: Tokenizer, base: Path) -> None:
    """The WordPiece vocabulary of ``tk`` (saved in ``base``) as llama.cpp's converter writes
    a BERT's: "phantom space" pieces (see the module docstring), special ids by
    gguf.SpecialVocab."""
    import gguf

    vocab = json.loads((base / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    special = {a.content for a in tk.get_added_tokens_decoder().values() if a.special}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
             for t in tokens]
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([t if ty == gguf.TokenType.CONTROL else t[2:] if t.startswith("##")
                      else "\u2581" + t for t, ty in zip(tokens, types, strict=True)])
    w.add_token_types(types)
    gguf.SpecialVocab(base, n_vocab=len(tokens)).add_to_gguf(w)


def make_nomic(name: str, seed: int) -> None:
    """nomic_embed/, nomic_embed_hub/ and nomic_embed.gguf (see the module docstring)."""
    import gguf
    from safetensors.torch import load_file

    d, hub = OUT / name, OUT / f"{name}_hub"
    for old in (d, hub):
        shutil.rmtree(old, ignore_errors=True)
    base = OUT / f"_{name}_base"
    base.mkdir(parents=True)
    tk = save_wordpiece_tokenizer(base, model_max_length=8192)
    dims = dict(vocab_size=tk.get_vocab_size(), hidden_size=64, num_hidden_layers=2,
                num_attention_heads=4, head_dim=16, intermediate_size=128,
                max_position_embeddings=MAX_SEQ, type_vocab_size=2)
    cfg = NomicBertConfig(**dims, hidden_act="silu", layer_norm_eps=1e-12, pad_token_id=0,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model = NomicBertModel(cfg)
    init_weights(model, seed)
    model.save_pretrained(base, safe_serialization=True)
    transformer = st_models.Transformer(str(base), max_seq_length=MAX_SEQ)
    pool = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    st = SentenceTransformer(modules=[transformer, pool, st_models.Normalize()], device="cpu")
    st.save(str(d))
    (d / "README.md").unlink(missing_ok=True)
    shutil.rmtree(base)
    reference(d, {"pooling": "mean", "normalize": True,
                  "sources": [name, f"{name}_hub", f"{name}.gguf"]})

    # nomic-ai's config.json; model.safetensors is the same file (git stores it once).
    shutil.copytree(d, hub)
    (hub / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
        "activation_function": "swiglu", "n_embd": cfg.hidden_size,
        "n_head": cfg.num_attention_heads, "n_inner": cfg.intermediate_size,
        "n_layer": cfg.num_hidden_layers, "n_positions": cfg.max_position_embeddings,
        "max_trained_positions": cfg.max_position_embeddings,
        "layer_norm_epsilon": cfg.layer_norm_eps, "vocab_size": cfg.vocab_size,
        "type_vocab_size": cfg.type_vocab_size, "pad_token_id": 0,
        "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_scaling_factor": None, "causal": False,
        "prenorm": False, "parallel_block": False, "use_rms_norm": False,
        "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "torch_dtype": "float32"}, indent=1))
    again = AutoModel.from_pretrained(str(hub), **dims, hidden_act="silu", layer_norm_eps=1e-12)
    ids = torch.tensor([st.tokenizer("A cat sits on the mat.")["input_ids"]])
    with torch.no_grad():
        diff = (model(ids).last_hidden_state - again(ids).last_hidden_state).abs().max()
    assert float(diff) == 0.0, float(diff)

    w = encoder_gguf(name, "nomic-bert", cfg, gguf.PoolingType.MEAN, tk, d)
    w.add_rope_freq_base(1000.0)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.NOMIC_BERT, cfg.num_hidden_layers)
    for hname, p in load_file(str(d / "model.safetensors")).items():  # the Hub's names
        gname = names.get_name(hname, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hname
        w.add_tensor(gname, p.float().numpy())
    finish_gguf(w)


def reference(d: Path, facts: dict) -> None:
    st = SentenceTransformer(str(d), device="cpu")
    emb = st.encode(SENTENCES, batch_size=4, convert_to_numpy=True).astype(np.float32)
    tok = st.tokenizer
    arrays = {"embeddings": emb}
    for i, s in enumerate(SENTENCES):
        ids = tok(s, truncation=True, max_length=st.max_seq_length)["input_ids"]
        arrays[f"ids.{i}"] = np.asarray(ids, dtype=np.int32)
    meta = {"sentences": SENTENCES, "max_seq_length": st.max_seq_length, **facts,
            "reference": "SentenceTransformer(dir, device='cpu').encode(batch_size=4)",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "sentence-transformers": sentence_transformers.__version__,
                         "tokenizers": tokenizers.__version__}}
    np.savez(OUT / f"{d.name}.npz", meta=np.array(json.dumps(meta, ensure_ascii=False)),
             **arrays)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["bert", "nomic"],
                    help="write the BERT GGUF or the nomic-bert goldens alone")
    torch.manual_seed(0)
    only = ap.parse_args().only
    if only == "bert":
        make_bert_gguf("bert_bge", seed=14)
        return
    if only == "nomic":
        make_nomic("nomic_embed", seed=15)
        return
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    make_xlmr("xlmr_e5", "mean", seed=11)
    make_xlmr("xlmr_bge", "cls", seed=12)
    make_qwen3_embed("qwen3_embed", seed=13)
    make_bert_gguf("bert_bge", seed=14)
    make_nomic("nomic_embed", seed=15)
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(f"{p.relative_to(ROOT)} {p.stat().st_size // 1024} KiB")


if __name__ == "__main__":
    main()
