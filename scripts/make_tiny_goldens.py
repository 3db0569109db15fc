"""Write tiny random causal models and transformers' logits on them (tests/goldens/tiny/).

Each causal path of the engine is checked against transformers on a model small enough to
ship in the repo (hidden 64, 2 layers, 4 heads, 2 KV heads, MLP 128, vocab 320):

    qwen2/        Qwen2ForCausalLM, q/k/v biases, tied embeddings, float32 safetensors,
                  Qwen-style byte-level BPE tokenizer, ChatML template, eos <|im_end|>
    llama/        LlamaForCausalLM, untied lm_head, rope_theta 500000, float32 safetensors,
                  GPT-2-style BPE tokenizer adding <s>, a template using bos/eos_token
    mistral/      MistralForCausalLM, explicit head_dim 32 (!= 64 / 4), bfloat16 safetensors
    llama_mlx/    llama/ quantized the way mlx-lm writes it: bfloat16, then mx.quantize
                  (4 bits, group 32) of every Linear and the embedding; uint32 weight +
                  bf16 scales/biases, "quantization" in config.json
    llama_q4_0.gguf  llama/ written by gguf.GGUFWriter in llama.cpp's layout: q/k rows
                  permuted as convert_hf_to_gguf.py does, 2-D tensors Q4_0, norms F32,
                  the llama/ tokenizer as tokenizer.ggml.* (gpt2 BPE)
    llama3/       Llama 3.2's shape: hidden 256, 4 heads of 64, 1 KV head (GQA 4), tied
                  embeddings, rope_theta 5e5 with "llama3" rope_scaling (factor 32, low 1,
                  high 4, original context 8192), bfloat16 safetensors
    llama3_q4_k.gguf  llama3/ in llama.cpp's layout: permuted q/k, every matrix Q4_K
                  (quantized here: gguf-py only dequantizes K-quants), the scaling as a
                  rope_freqs.weight tensor as convert_hf_to_gguf.py writes it
    qwen3/        Qwen3's shape: per-head q/k RMSNorm, no biases, head_dim 32 != 64/4,
                  tied embeddings, float32 safetensors, the qwen tokenizer
    qwen3_f16.gguf, qwen3_q4_0.gguf  qwen3/ as GGUF (arch qwen3, no permutation), matrices
                  F16 or Q4_0, norms F32
    gemma/        Gemma's shape: (1 + w) RMSNorm, embeddings x sqrt(hidden), GELU-tanh MLP,
                  1 KV head, head_dim 32 != 64/4, tied, float32 safetensors
    gemma_q8_0.gguf  gemma/ as llama.cpp writes it: norms stored as 1 + w, Q8_0 matrices
    phi3/         Phi-3.5's shape: fused qkv_proj and gate_up_proj, LongRoPE (short/long
                  factors, original context 4096 of 131072), float32 safetensors
    phi3_q4_0.gguf  phi3/ as GGUF: fused attn_qkv / ffn_up, rope_factors_short/long tensors,
                  the attention factor in metadata, Q4_0 matrices
    gemma2_f32.gguf, gemma2_q4_0.gguf, gemma3_f32.gguf, gemma3_q4_0.gguf
                  gemma2/ and gemma3_text/ as llama.cpp writes Gemma 2/3 (make_gemma_ggufs)
    gemma2_q4_k.gguf, gemma3_q4_k.gguf  256-wide Gemma 2 2B / Gemma 3 1B shapes in Q4_K

Every golden from llama3/ on also records transformers' greedy continuation: ``greedy.prompt``
and the ``greedy.tokens`` it generates (GREEDY_TOKENS, do_sample=False).

Weights: every matrix N(0, 0.2), biases N(0, 0.1), norm weights 1 + N(0, 0.1), drawn in
sorted-name order from numpy's default_rng(seed), so logits spread over several units.

References: transformers in float32, eager attention, loading each directory back from disk
(bfloat16 weights upcast). For the quantized two, transformers gets the dequantized weights
(mx.dequantize, gguf.quants.dequantize + un-permute); for the GGUF the script also checks that
transformers' own GGUF loader gives the same logits.

<NAME>.npz holds, for each sequence S in (chat, random): ``S.ids`` (n,) int32 and
``S.logits`` (n, vocab) float32; for each tokenizer text T: ``tok.T`` int32 ids from
AutoTokenizer (add_special_tokens=True); ``meta`` a JSON string with texts, the rendered chat
prompt (apply_chat_template, add_generation_prompt=True), eos token, versions.

Two environments: the script runs under .venv-ref (torch, transformers, gguf) and calls
itself under .venv (mlx) for the quantization step, which needs nothing but numpy and mlx:

    .venv-ref/bin/python scripts/make_tiny_goldens.py [--out DIR] [--mlx-python .venv/bin/python]

Deterministic; about 15 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEED = 20240611
VOCAB = 320
SEQ_LEN = {"chat": 40, "random": 32}
GREEDY_TOKENS = 32
MLX_GROUP, MLX_BITS = 32, 4
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=VOCAB, rms_norm_eps=1e-5,
              max_position_embeddings=512)

QWEN_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
BRACKETS = (
    "{{ bos_token }}{% for m in messages %}{{ '[' + m['role'] + ']\n' + m['content'] | trim "
    "+ eos_token + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '[assistant]\n' }}"
    "{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Local inference runs a language model on your own machine, without a server.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Numbers like 12345 and 3.14159 and 2024-06-11 are split into digits.",
    "Caf\u00e9, na\u00efve, \u00fcber, \u6771\u4eac, \U0001f642 and other unicode text.",
    "Hello! How are you today? I'm fine, thanks; and you?",
    "Tokens, tokenizers and token ids: the model sees only integers.",
]
TOKENIZER_TEXTS = {
    "prose": "The lazy fox runs a model on your own machine.",
    "code": "def f(x):\n    return x * 12 + 3\n",
    "unicode": "na\u00efve caf\u00e9 \u2014 \u6771\u4eac \U0001f642!",
    "spaces": "  two  spaces\n\nand\ttab ",
    "special": "<|im_start|>user\nhi<|im_end|>",
}
CHAT = [{"role": "user", "content": "Hello! What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."}]


# --- tokenizers ------------------------------------------------------------------------------

def train_tokenizer(kind: str):
    """A byte-level BPE of VOCAB tokens: "qwen" (Qwen2's split regex, NFC, ChatML tokens) or
    "llama" (GPT-2's regex via ByteLevel, <s>/</s>, a post-processor adding <s>)."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tk = Tokenizer(models.BPE())
    if kind == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tk.normalizer = normalizers.NFC()
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        specials = ["<unk>", "<s>", "</s>"]
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS * 4, trainer=trainer)
    assert tk.get_vocab_size() == VOCAB, tk.get_vocab_size()
    if kind == "qwen":
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                  "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "unk_token": None, "chat_template": CHATML, "model_max_length": 512}
    else:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tk.token_to_id("<s>"))])
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                  "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                  "add_eos_token": False, "chat_template": BRACKETS, "model_max_length": 512}
    return tk, config


def write_tokenizer(tk, config: dict, d: Path) -> None:
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


# --- models (run under .venv-ref) ------------------------------------------------------------

def init_weights(model, seed: int) -> None:
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                v = 1.0 + 0.1 * rng.standard_normal(p.shape)
            elif name.endswith(".bias"):
                v = 0.1 * rng.standard_normal(p.shape)
            else:
                v = 0.2 * rng.standard_normal(p.shape)
            p.copy_(torch.from_numpy(v.astype(np.float32)))


def reference_logits(model, seqs: dict[str, list[int]]) -> dict[str, np.ndarray]:
    import torch

    out = {}
    with torch.no_grad():
        for name, ids in seqs.items():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            out[name] = logits.float().numpy().astype(np.float32)
    return out


def load_ref(d: Path, state: dict[str, np.ndarray] | None = None):
    """transformers' model from directory ``d`` in float32, optionally with other weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    if state is not None:
        sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
              for k, v in state.items()}
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def sequences(tok_dir: Path, vocab: int, seed: int) -> tuple[dict[str, list[int]], dict]:
    """The fixed id sequences, and the tokenizer goldens from AutoTokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    chat_text = tok.apply_chat_template(CHAT, tokenize=False)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    assert len(chat_ids) >= SEQ_LEN["chat"], len(chat_ids)
    rng = np.random.default_rng(seed + 1)
    seqs = {"chat": chat_ids[:SEQ_LEN["chat"]],
            "random": rng.integers(0, vocab, SEQ_LEN["random"]).tolist()}
    toks = {name: tok(text)["input_ids"] for name, text in TOKENIZER_TEXTS.items()}
    prompt = tok.apply_chat_template(CHAT[:1], tokenize=False, add_generation_prompt=True)
    info = {"chat_text": chat_text, "chat_prompt": prompt, "eos_token": tok.eos_token,
            "bos_token": tok.bos_token}
    return seqs, {"toks": toks, "info": info}


def greedy(model, prompt: list[int]) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (GREEDY_TOKENS new ids)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS,
                             min_new_tokens=GREEDY_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def save_golden(path: Path, seqs: dict, logits: dict, toks: dict, meta: dict,
                model=None) -> None:
    arrays = {}
    if model is not None:
        prompt = seqs["chat"][:8]
        arrays["greedy.prompt"] = np.asarray(prompt, dtype=np.int32)
        arrays["greedy.tokens"] = np.asarray(greedy(model, prompt), dtype=np.int32)
    for name, ids in seqs.items():
        arrays[f"{name}.ids"] = np.asarray(ids, dtype=np.int32)
        arrays[f"{name}.logits"] = logits[name]
    for name, ids in toks.items():
        arrays[f"tok.{name}"] = np.asarray(ids, dtype=np.int32)
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    np.savez(path, **arrays)


def make_hf(name: str, cls_name: str, cfg: dict, tk, tk_config: dict, out: Path,
            seed: int, versions: dict, save_dtype: str = "float32",
            with_greedy: bool = False) -> Path:
    import torch
    import transformers

    cls = getattr(transformers, cls_name)
    config_cls = {"Gemma3ForCausalLM": "Gemma3TextConfig"}.get(
        cls_name, cls_name.replace("ForCausalLM", "Config"))
    config = getattr(transformers, config_cls)(**{**COMMON, **cfg})
    torch.manual_seed(seed)
    model = cls(config)
    init_weights(model, seed)
    d = out / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    model.to(getattr(torch, save_dtype)).save_pretrained(d, safe_serialization=True)
    write_tokenizer(tk, tk_config, d)
    seqs, tg = sequences(d, VOCAB, seed)
    ref = load_ref(d)
    logits = reference_logits(ref, seqs)
    save_golden(out / f"{name}.npz", seqs, logits, tg["toks"],
                {**tg["info"], "texts": TOKENIZER_TEXTS, "reference": f"transformers {cls_name} "
                 f"float32 eager, weights stored as {save_dtype}", "versions": versions},
                ref if with_greedy else None)
    return d


# --- MLX quantization (run under .venv, which has mlx) ---------------------------------------

def mlx_quantize(src_npz: Path, out_dir: Path, dq_npz: Path) -> None:
    """bfloat16 every tensor, quantize 2-D ones as mlx-lm does, save model.safetensors in
    out_dir, and the float32 dequantized weights (what transformers gets) to dq_npz."""
    import mlx.core as mx

    with np.load(src_npz) as z:
        weights = {k: z[k] for k in z.files}
    saved, dq = {}, {}
    for name in sorted(weights):
        w = mx.array(weights[name]).astype(mx.bfloat16)
        if w.ndim == 2 and w.shape[-1] % MLX_GROUP == 0:
            q, s, b = mx.quantize(w, group_size=MLX_GROUP, bits=MLX_BITS)
            prefix = name[:-len(".weight")]
            saved |= {name: q, f"{prefix}.scales": s, f"{prefix}.biases": b}
            dq[name] = np.array(mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32),
                                              group_size=MLX_GROUP, bits=MLX_BITS))
        else:
            saved[name] = w
            dq[name] = np.array(w.astype(mx.float32))
    mx.save_safetensors(str(out_dir / "model.safetensors"), saved, metadata={"format": "mlx"})
    np.savez(dq_npz, **dq)
    print(f"mlx {mx.__version__}: quantized {sum(n.endswith('.scales') for n in saved)} tensors")


def make_mlx(llama: Path, out: Path, mlx_python: str, versions: dict) -> None:
    import subprocess as sp

    from safetensors.numpy import load_file

    d = out / "llama_mlx"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama / f, d / f)
    config = json.loads((llama / "config.json").read_text())
    quant = {"group_size": MLX_GROUP, "bits": MLX_BITS, "mode": "affine"}
    config |= {"quantization": quant, "quantization_config": quant, "dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        src, dq = Path(tmp) / "src.npz", Path(tmp) / "dq.npz"
        np.savez(src, **load_file(llama / "model.safetensors"))
        sp.run([mlx_python, __file__, "--mlx-quantize", str(src), str(d), str(dq)], check=True)
        with np.load(dq) as z:
            state = {k: z[k] for k in z.files}
        mlx_version = sp.run([mlx_python, "-c", "import mlx.core as mx; print(mx.__version__)"],
                             check=True, capture_output=True, text=True).stdout.strip()
    seqs, tg = sequences(d, VOCAB, SEED + 1)
    logits = reference_logits(load_ref(llama, state), seqs)
    save_golden(out / "llama_mlx.npz", seqs, logits, tg["toks"], {
        **tg["info"], "texts": TOKENIZER_TEXTS, "versions": {**versions, "mlx": mlx_version},
        "reference": f"transformers LlamaForCausalLM float32 eager with the llama/ weights "
                     f"rounded to bfloat16, quantized by mx.quantize (group {MLX_GROUP}, "
                     f"{MLX_BITS} bits) and dequantized by mx.dequantize"})


# --- GGUF (llama.cpp layout) -----------------------------------------------------------------

def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF half-split rows -> adjacent pairs."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


GGUF_BLOCK = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
              "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
GGUF_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
            "output": "lm_head"}


def make_gguf(llama: Path, out: Path, versions: dict) -> None:
    import gguf
    from gguf import GGMLQuantizationType as T
    from safetensors.numpy import load_file

    cfg = json.loads((llama / "config.json").read_text())
    tk_json = json.loads((llama / "tokenizer.json").read_text())
    tk_cfg = json.loads((llama / "tokenizer_config.json").read_text())
    weights = load_file(llama / "model.safetensors")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))

    path = out / "llama_q4_0.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    vocab = tk_json["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(tokens) == cfg["vocab_size"]
    special = {a["content"] for a in tk_json["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in tk_json["model"]["merges"]])
    w.add_bos_token_id(vocab[tk_cfg["bos_token"]])
    w.add_eos_token_id(vocab[tk_cfg["eos_token"]])
    w.add_unk_token_id(vocab[tk_cfg["unk_token"]])
    w.add_add_bos_token(True)
    w.add_chat_template(tk_cfg["chat_template"])

    state = {}
    names = [(f"{g}.weight", f"{h}.weight") for g, h in GGUF_TOP.items()]
    names += [(f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight")
              for i in range(cfg["num_hidden_layers"]) for g, h in GGUF_BLOCK.items()]
    for gname, hname in names:
        a = weights[hname].astype(np.float32)
        n_head = heads if "attn_q" in gname else kv if "attn_k" in gname else None
        if n_head:
            a = permute(a, n_head)
        if a.ndim == 2:
            q = gguf.quants.quantize(a, T.Q4_0)
            w.add_tensor(gname, q, raw_dtype=T.Q4_0)
            a = gguf.quants.dequantize(q, T.Q4_0)
        else:
            w.add_tensor(gname, a)
        state[hname] = unpermute(a, n_head) if n_head else a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    seqs, tg = sequences(llama, VOCAB, SEED + 1)
    logits = reference_logits(load_ref(llama, state), seqs)
    meta = {**tg["info"], "texts": TOKENIZER_TEXTS, "versions": versions,
            "reference": "transformers LlamaForCausalLM float32 eager with the llama/ weights "
                         "after gguf.quants quantize + dequantize (Q4_0)"}
    try:  # transformers' own GGUF reader (its dequantize and un-permute) must agree
        import torch
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(out, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    except Exception as e:  # the cross-check is extra, not the reference
        meta["transformers_gguf_max_abs_diff"] = f"not checked: {type(e).__name__}: {e}"
        print(f"gguf: transformers cannot load it ({e}); cross-check skipped")
    else:
        cross = reference_logits(m, seqs)
        diff = max(float(np.abs(cross[k] - logits[k]).max()) for k in seqs)
        assert diff < 1e-4, diff
        meta["transformers_gguf_max_abs_diff"] = diff
        print(f"gguf: transformers' GGUF loader agrees to {diff:.2e}")
    save_golden(out / "llama_q4_0.npz", seqs, logits, tg["toks"], meta)


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """(rows, cols) float32 -> GGML Q4_K blocks (rows, cols / 256 * 144) uint8.

    A block is d, dmin (float16), 12 bytes of 6-bit scales/mins for its eight 32-element
    sub-blocks (ggml's get_scale_min_k4 packing), then 128 bytes of 4-bit codes: byte
    32 c + l holds element 64 c + l (low nibble) and 64 c + 32 + l (high). Each value is
    d * sc * q - dmin * m. Round-to-nearest over each sub-block's [min(x, 0), max(x)]
    (not ggml's search): the reference dequantizes these very bytes with gguf-py, so only
    the layout must be ggml's. MLX repacks Q4_K exactly, unlike Q6_K and Q2_K.
    """
    rows, cols = a.shape
    x = a.astype(np.float32).reshape(-1, 8, 32)  # (blocks, sub-blocks, 32)
    lo = np.minimum(x.min(-1), 0.0)
    step = (x.max(-1) - lo) / 15.0
    d = (step.max(-1) / 63.0).astype(np.float16)
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16)
    df, mf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(step / np.where(df > 0, df, 1)), 1, 63).astype(np.uint8)
    m = np.clip(np.rint(-lo / np.where(mf > 0, mf, 1)), 0, 63).astype(np.uint8)
    scale = (df * sc)[:, :, None]
    q = np.rint((x + (mf * m)[:, :, None]) / np.where(scale > 0, scale, 1))
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(-1, 4, 2, 32)  # (blocks, c, half, l)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    packed = np.empty((x.shape[0], 12), np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    blocks = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8),
                             packed, qs], axis=1)
    return blocks.reshape(rows, cols // 256 * 144)


# Gemma 2/3 name their four norms as llama.cpp's gemma2/gemma3 tensor maps do.
GGUF_SANDWICH = {"post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm",
                 "post_ffw_norm": "post_feedforward_layernorm"}


def _add_metadata(w, arch: str, metadata: dict) -> None:
    """``{arch}.key`` = value: ints uint32, floats float32, strings, lists arrays."""
    for key, value in metadata.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{key}", value)
        else:
            w.add_float32(f"{arch}.{key}", value)


def write_gguf(src: Path, path: Path, arch: str, qtype: str, tk_pre: str,
               extra: dict[str, np.ndarray] | None = None,
               metadata: dict | None = None) -> dict[str, np.ndarray]:
    """src/ (HF safetensors) as a llama.cpp-layout GGUF: matrices in ``qtype``, 1-D tensors
    F32, q/k rows permuted for arch llama, Gemma norms stored as ``1 + w`` (every Gemma
    converter of llama.cpp adds the 1 to each ``*norm.weight``). Returns the HF state
    transformers should get (the file's weights dequantized by gguf-py, un-permuted)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    cfg = json.loads((src / "config.json").read_text())
    tk_json = json.loads((src / "tokenizer.json").read_text())
    tk_cfg = json.loads((src / "tokenizer_config.json").read_text())
    weights = {k: np.asarray(v, dtype=np.float32) for k, v in _load_f32(src).items()}
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)  # Gemma 3: the global layers' RoPE
    theta = cfg.get("rope_theta") or rope.get("rope_theta")

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tk_json["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tk_json["added_tokens"] if a["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tk_pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in tk_json["model"]["merges"]])
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id)):
        if tk_cfg.get(key):
            add(vocab[tk_cfg[key]])
    w.add_add_bos_token(bool(tk_cfg.get("add_bos_token", False)))
    w.add_chat_template(tk_cfg["chat_template"])
    _add_metadata(w, arch, metadata or {})

    block = {**GGUF_BLOCK, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    if arch == "phi3":  # fused projections keep one tensor each
        block |= {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
    if arch in ("gemma2", "gemma3"):
        block |= GGUF_SANDWICH
    gemma = arch.startswith("gemma")
    state = {}
    names = [(f"{g}.weight", f"{h}.weight") for g, h in GGUF_TOP.items()]
    names += [(f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight")
              for i in range(cfg["num_hidden_layers"]) for g, h in block.items()]
    for gname, hname in names:
        if hname not in weights:
            continue  # tied lm_head, or no q/k norms
        a = weights[hname]
        n_head = heads if "attn_q." in gname else kv if "attn_k." in gname else None
        n_head = n_head if arch == "llama" else None
        if n_head:
            a = permute(a, n_head)
        if gemma and a.ndim == 1:  # convert_hf_to_gguf.py stores 1 + w
            a = a + np.float32(1.0)
        if a.ndim == 2 and qtype == "F16":
            w.add_tensor(gname, a.astype(np.float16))
            a = a.astype(np.float16).astype(np.float32)
        elif a.ndim == 2 and qtype != "F32":
            q = quantize_q4_k(a) if qtype == "Q4_K" else gguf.quants.quantize(a, T[qtype])
            w.add_tensor(gname, q, raw_dtype=T[qtype])
            a = gguf.quants.dequantize(q, T[qtype]).reshape(a.shape)
        else:
            w.add_tensor(gname, a)
        if gemma and a.ndim == 1:
            a = a - np.float32(1.0)  # transformers adds the 1 itself
        state[hname] = unpermute(a, n_head) if n_head else a
    for gname, a in (extra or {}).items():
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return state


def _load_f32(src: Path) -> dict[str, np.ndarray]:
    """A directory's safetensors as float32 (bfloat16 widened), via torch."""
    from safetensors.torch import load_file

    return {k: v.float().numpy() for k, v in load_file(src / "model.safetensors").items()}


def make_gguf_golden(src: Path, out: Path, name: str, arch: str, qtype: str, tk_pre: str,
                     seed: int, versions: dict, extra: dict | None = None,
                     metadata: dict | None = None) -> None:
    path = out / f"{name}.gguf"
    state = write_gguf(src, path, arch, qtype, tk_pre, extra, metadata)
    seqs, tg = sequences(src, VOCAB, seed)
    ref = load_ref(src, state)
    logits = reference_logits(ref, seqs)
    meta = {**tg["info"], "texts": TOKENIZER_TEXTS, "versions": versions,
            "reference": f"transformers float32 eager with the {src.name}/ weights after "
                         f"{qtype} quantization, dequantized by gguf.quants"}
    save_golden(out / f"{name}.npz", seqs, logits, tg["toks"], meta, ref)


def llama3_freq_factors(cfg: dict) -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py writes it: base / scaled frequency."""
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    conf = AutoConfig.for_model(**cfg)
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](conf, torch.device("cpu"))
    head_dim = cfg["head_dim"]
    base = 1.0 / cfg["rope_parameters"]["rope_theta"] ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    return (base / inv).numpy().astype(np.float32)


def make_new_families(out: Path, v: dict) -> None:
    """llama3/, qwen3/ and their GGUF forms (see the module docstring)."""
    qwen_tk, qwen_cfg = train_tokenizer("qwen")
    llama_tk, llama_cfg = train_tokenizer("llama")
    ids = {t: llama_tk.token_to_id(t) for t in ("<s>", "</s>")}
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    llama3 = make_hf("llama3", "LlamaForCausalLM", dict(
        hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
        head_dim=64, tie_word_embeddings=True,
        rope_parameters={"rope_theta": 500000.0, **scaling}, bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"]), llama_tk, llama_cfg, out, SEED + 3, v,
        save_dtype="bfloat16", with_greedy=True)
    cfg = json.loads((llama3 / "config.json").read_text())
    make_gguf_golden(llama3, out, "llama3_q4_k", "llama", "Q4_K", "gpt2", SEED + 4, v,
                     extra={"rope_freqs.weight": llama3_freq_factors(cfg)})
    specials = {t: qwen_tk.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>")}
    qwen3 = make_hf("qwen3", "Qwen3ForCausalLM", dict(
        head_dim=32, tie_word_embeddings=True, rope_theta=1000000.0, bos_token_id=None,
        eos_token_id=specials["<|im_end|>"], pad_token_id=specials["<|endoftext|>"]),
        qwen_tk, qwen_cfg, out, SEED + 5, v, with_greedy=True)
    make_gguf_golden(qwen3, out, "qwen3_f16", "qwen3", "F16", "qwen2", SEED + 6, v)
    make_gguf_golden(qwen3, out, "qwen3_q4_0", "qwen3", "Q4_0", "qwen2", SEED + 7, v)
    gemma = make_hf("gemma", "GemmaForCausalLM", dict(
        num_key_value_heads=1, head_dim=32, hidden_activation="gelu_pytorch_tanh",
        rope_theta=10000.0, bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
        pad_token_id=0), llama_tk, llama_cfg, out, SEED + 8, v, with_greedy=True)
    make_gguf_golden(gemma, out, "gemma_q8_0", "gemma", "Q8_0", "gpt2", SEED + 9, v)
    gemma2 = make_hf("gemma2", "Gemma2ForCausalLM", dict(
        head_dim=32, query_pre_attn_scalar=24, attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], rope_theta=10000.0,
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=0),
        llama_tk, llama_cfg, out, SEED + 13, v, with_greedy=True)
    make_hf("gemma3_text", "Gemma3ForCausalLM", dict(
        num_hidden_layers=3, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=8, layer_types=["sliding_attention", "sliding_attention",
                                       "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}},
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=0),
        llama_tk, llama_cfg, out, SEED + 14, v, with_greedy=True)
    del gemma2
    rng = np.random.default_rng(SEED + 10)
    half = COMMON["hidden_size"] // COMMON["num_attention_heads"] // 2
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0,
                "short_factor": (1 + rng.uniform(0, 2, half)).round(4).tolist(),
                "long_factor": (1 + rng.uniform(0, 30, half)).round(4).tolist(),
                "original_max_position_embeddings": 4096}
    phi3 = make_hf("phi3", "Phi3ForCausalLM", dict(
        max_position_embeddings=131072, original_max_position_embeddings=4096,
        rope_parameters=longrope, tie_word_embeddings=False, bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"], pad_token_id=0), llama_tk, llama_cfg, out, SEED + 11, v,
        with_greedy=True)
    factor = 131072 / 4096
    make_gguf_golden(phi3, out, "phi3_q4_0", "phi3", "Q4_0", "gpt2", SEED + 12, v, extra={
        "rope_factors_short.weight": np.asarray(longrope["short_factor"], np.float32),
        "rope_factors_long.weight": np.asarray(longrope["long_factor"], np.float32)},
        metadata={"rope.scaling.attn_factor": float(np.sqrt(1 + np.log(factor) / np.log(4096))),
                  "rope.scaling.original_context_length": 4096})


def gemma_gguf_metadata(cfg: dict, arch: str) -> dict:
    """The ``{arch}.*`` keys llama.cpp's converter writes for Gemma 2/3 beyond the common ones,
    plus the two it leaves implicit where a tiny model departs from llama.cpp's built-in
    values: ``attention.scale`` when query_pre_attn_scalar is not head_dim (llama.cpp
    assumes head_dim, or hidden/heads for the 27B sizes), and ``attention.sliding_window_pattern``
    when the layers are not llama.cpp's pattern (gemma2: every other layer from 0 is
    sliding; gemma3: five sliding, then one global)."""
    md: dict = {"attention.sliding_window": cfg["sliding_window"]}
    types = cfg["layer_types"]
    n = 2 if arch == "gemma2" else 6
    if types != ["sliding_attention" if i % n < n - 1 else "full_attention"
                 for i in range(len(types))]:
        md["attention.sliding_window_pattern"] = [t == "sliding_attention" for t in types]
    if cfg["query_pre_attn_scalar"] != cfg["head_dim"]:
        md["attention.scale"] = float(cfg["query_pre_attn_scalar"] ** -0.5)
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if cfg.get(key):
            md[key] = float(cfg[key])
    rope = cfg.get("rope_parameters") or {}
    if "sliding_attention" in rope:
        md["rope.freq_base_swa"] = float(rope["sliding_attention"]["rope_theta"])
        full = rope["full_attention"]
        if full.get("rope_type") == "linear":
            md["rope.scaling.type"] = "linear"
            md["rope.scaling.factor"] = float(full["factor"])
    return md


def make_gemma_ggufs(out: Path, v: dict) -> None:
    """Gemma 2 and Gemma 3 as llama.cpp writes them (architectures ``gemma2``/``gemma3``,
    post_attention_norm / ffn_norm / post_ffw_norm, norms stored as 1 + w): gemma2/ and
    gemma3_text/ in F32 and Q4_0, and two 256-wide models (K-quants need rows of 256) in
    Q4_K whose metadata is exactly the converter's: Gemma 2 2B's shape (two layers,
    query_pre_attn_scalar = head_dim 64) and Gemma 3 1B's (six layers, five sliding then
    one global, local base 1e4, global 1e6 with linear x8 as the 4B+ sizes have)."""
    llama_tk, llama_cfg = train_tokenizer("llama")
    ids = {t: llama_tk.token_to_id(t) for t in ("<s>", "</s>")}
    special = dict(bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=0)
    for name, arch, seed in (("gemma2", "gemma2", SEED + 20), ("gemma3_text", "gemma3", SEED + 22)):
        src = out / name
        cfg = json.loads((src / "config.json").read_text())
        md = gemma_gguf_metadata(cfg, arch)
        make_gguf_golden(src, out, f"{arch}_f32", arch, "F32", "gpt2", seed, v, metadata=md)
        make_gguf_golden(src, out, f"{arch}_q4_0", arch, "Q4_0", "gpt2", seed + 1, v, metadata=md)
    wide = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, head_dim=64,
                query_pre_attn_scalar=64, sliding_window=8, rope_theta=10000.0, **special)
    with tempfile.TemporaryDirectory() as tmp:
        src = make_hf("gemma2_wide", "Gemma2ForCausalLM", dict(
            wide, num_key_value_heads=2, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, layer_types=["sliding_attention", "full_attention"]),
            llama_tk, llama_cfg, Path(tmp), SEED + 24, v)
        cfg = json.loads((src / "config.json").read_text())
        make_gguf_golden(src, out, "gemma2_q4_k", "gemma2", "Q4_K", "gpt2", SEED + 25, v,
                         metadata=gemma_gguf_metadata(cfg, "gemma2"))
        del wide["rope_theta"]
        src = make_hf("gemma3_wide", "Gemma3ForCausalLM", dict(
            wide, num_hidden_layers=6, num_key_value_heads=1,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                             "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1e6}}),
            llama_tk, llama_cfg, Path(tmp), SEED + 26, v)
        cfg = json.loads((src / "config.json").read_text())
        md = gemma_gguf_metadata(cfg, "gemma3")
        assert "attention.sliding_window_pattern" not in md and "attention.scale" not in md
        make_gguf_golden(src, out, "gemma3_q4_k", "gemma3", "Q4_K", "gpt2", SEED + 27, v,
                         metadata=md)


# --- main ------------------------------------------------------------------------------------

def versions() -> dict[str, str]:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "transformers", "tokenizers", "gguf",
                                        "safetensors", "numpy")} | {
        "python": sys.version.split()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "goldens" / "tiny")
    ap.add_argument("--mlx-python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="a Python with mlx installed, for the quantization step")
    ap.add_argument("--only-new", action="store_true",
                    help="write only the llama3/qwen3 goldens (the others stay as they are)")
    ap.add_argument("--only-gemma-gguf", action="store_true",
                    help="write only the Gemma 2/3 GGUF goldens (from gemma2/, gemma3_text/)")
    ap.add_argument("--mlx-quantize", nargs=3, type=Path, metavar=("SRC", "OUT_DIR", "DQ"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mlx_quantize:
        mlx_quantize(*args.mlx_quantize)
        return

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    v = versions()
    if args.only_gemma_gguf:
        make_gemma_ggufs(out, v)
        return
    make_new_families(out, v)
    make_gemma_ggufs(out, v)
    if args.only_new:
        return
    qwen_tk, qwen_cfg = train_tokenizer("qwen")
    llama_tk, llama_cfg = train_tokenizer("llama")
    specials = {t: qwen_tk.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>")}
    make_hf("qwen2", "Qwen2ForCausalLM", dict(
        tie_word_embeddings=True, rope_theta=1000000.0, bos_token_id=None,
        eos_token_id=specials["<|im_end|>"], pad_token_id=specials["<|endoftext|>"]),
        qwen_tk, qwen_cfg, out, SEED, v)
    ids = {t: llama_tk.token_to_id(t) for t in ("<s>", "</s>")}
    llama = make_hf("llama", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, rope_theta=500000.0, bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"]), llama_tk, llama_cfg, out, SEED + 1, v)
    make_hf("mistral", "MistralForCausalLM", dict(
        tie_word_embeddings=False, head_dim=32, rope_theta=1000000.0, sliding_window=None,
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"]),
        llama_tk, llama_cfg, out, SEED + 2, v, save_dtype="bfloat16")
    make_mlx(llama, out, args.mlx_python, v)
    make_gguf(llama, out, v)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
