"""Comparison peers for `inferdesk bench --compare`: llama-cpp-python and
sentence-transformers, driven through the same workloads as the engine.

Each runner is built once (model loaded, threads fixed) and then timed repeatedly, so the
bench can interleave engine and peer rounds in one process. Neither package is a
dependency: :func:`llama_cpp_runner` / :func:`st_runner` return a reason string instead of a
runner when the package is missing or fails to load.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class LlamaCppLLM:
    """Prefill the prompt ids, then greedy-decode n tokens one eval() at a time."""

    name = "llama.cpp"

    def __init__(self, gguf: Path, threads: int, n_ctx: int):
        import llama_cpp

        # the build's instruction sets, as llama.cpp reports them (AVX2, AVX512, ... = 1)
        info = llama_cpp.llama_print_system_info().decode(errors="replace")
        isa = [f.split("=")[0].split(":")[-1].strip() for f in info.split("|")
               if f.strip().endswith("= 1")]
        self.version = f"{llama_cpp.__version__} ({' '.join(isa)})"
        self.llm = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()

    def _next(self) -> int:
        # eval() keeps no logits unless logits_all; read the last row from the context.
        row = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,))
        return int(np.argmax(row))

    def run(self, ids: Sequence[int], n_decode: int) -> dict[str, Any]:
        llm = self.llm
        llm.reset()  # n_tokens = 0: eval() then drops the old KV entries
        t0 = time.perf_counter()
        llm.eval(list(ids))
        tok = self._next()
        t1 = time.perf_counter()
        toks = [tok]
        for _ in range(n_decode):
            llm.eval([tok])
            tok = self._next()
            toks.append(tok)
        t2 = time.perf_counter()
        return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1),
                "tokens": toks}


class SentenceTransformersEmbed:
    name = "sentence-transformers"

    def __init__(self, model_dir: Path, threads: int):
        import sentence_transformers
        import torch

        torch.set_num_threads(threads)
        self.version = f"{sentence_transformers.__version__} (torch {torch.__version__})"
        self.model = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")

    def run(self, sentences: Sequence[str], batch_size: int) -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        vecs = self.model.encode(list(sentences), batch_size=batch_size, convert_to_numpy=True,
                                 show_progress_bar=False)
        return len(sentences) / (time.perf_counter() - t0), np.asarray(vecs, dtype=np.float32)


def _why(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return f"not installed ({e.name or e})"
    return f"failed to load ({type(e).__name__}: {e})"


def llama_cpp_runner(gguf: Path, threads: int, n_ctx: int) -> LlamaCppLLM | str:
    try:
        return LlamaCppLLM(gguf, threads, n_ctx)
    except Exception as e:  # a peer that cannot run is reported, never fatal
        return _why(e)


def st_runner(model_dir: Path, threads: int) -> SentenceTransformersEmbed | str:
    try:
        return SentenceTransformersEmbed(model_dir, threads)
    except Exception as e:
        return _why(e)


def _rss() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def llama_cpp_generate(gguf: str, prompt: str, n_tokens: int, threads: int) -> dict[str, Any]:
    """What a user of llama-cpp-python waits for in a fresh process: import, load (the file
    memory-mapped), then the prompt tokenized and prefilled, and ``n_tokens`` greedy tokens
    in all (the first from the prefill; end-of-sequence does not stop it), each timed."""
    t0 = time.perf_counter()
    import llama_cpp

    t1 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=2048, n_batch=512, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    t2 = time.perf_counter()
    rss = _rss()
    n_vocab = llm.n_vocab()
    ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
    times = []
    tok_in = ids
    for _ in range(n_tokens):
        llm.eval(tok_in)
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        tok_in = [int(np.argmax(row))]
        times.append(time.perf_counter())
    return {"version": llama_cpp.__version__, "import_s": t1 - t0, "load_s": t2 - t1,
            "rss_after_load_bytes": rss, "n_prompt": len(ids), "n_generated": len(times),
            "ttft_s": times[0] - t2, "prefill_tok_s": len(ids) / (times[0] - t2),
            "token_times_s": [t - t2 for t in times], "threads": [threads, threads]}


if __name__ == "__main__":  # one llama.cpp generation, run by the bench as a script file
    import json
    import sys

    model, prompt_file, n, t = sys.argv[1:5]
    print(json.dumps(llama_cpp_generate(model, Path(prompt_file).read_text(encoding="utf-8"),
                                        int(n), int(t))))
