"""``python -m inference.warm``: the cpu backend's kernels compiled into numba's cache at
install (``make run`` and ``make test`` run it): every weight type's products
(:mod:`inference.backends.cpu.warm`), then a few tokens of the bundled chat model and an
embedding by the bundled encoder, where present (the norms, RoPE, attention, step replay,
sampling). The chat model runs with each KV cache type a user can pick in the app (float32,
float16): its attention over float16 keys is a kernel of its own, which otherwise compiled at
that first load (12.9 s on the Intel Xeon beside a test run: the bundled model's load
13.1 s, against 0.24 s once warmed; docs/bench-results/20261130-0940-warm-float16-kv.json).
"""

from __future__ import annotations

from inference.backends.cpu.warm import Step, main


def _chat(backend_name: str, kv_dtype: str | None = None) -> None:
    """A few tokens of the bundled chat model: prefill, capture, check and replay, over a
    KV cache of ``kv_dtype`` (None: the backend's)."""
    from inference import load_model
    from inference.generate import stream_generate
    from inference.sampling import SamplingParams

    m = load_model("SmolLM2-135M-Instruct.Q4_1", backend=backend_name, kv_dtype=kv_dtype)
    ids = m.tokenize("The kernels compile once, at install, and load from the cache later.")
    for _ in stream_generate(m.model, m.tokenizer, ids, max_tokens=6, sampling=SamplingParams(),
                             eos_ids=set(), max_len=len(ids) + 6):
        pass
    m.close()


def _embed(backend_name: str) -> None:
    """The bundled encoder over two sentences of different lengths (packed rows)."""
    from inference import load_model

    m = load_model("all-MiniLM-L6-v2", backend=backend_name)
    m.embed(["a short one", "a somewhat longer sentence than the first one is"])
    m.close()


def model_steps() -> list[Step]:
    """The bundled models' steps, for those present."""
    from inference.store import bundled_paths

    names = {name or path.name for path, name in bundled_paths()}
    steps: list[Step] = []
    if any("SmolLM2" in n for n in names):
        steps.append(("the bundled chat model", lambda: _chat("cpu")))
        steps.append(("the bundled chat model, float16 KV cache",
                      lambda: _chat("cpu", "float16")))
    if "all-MiniLM-L6-v2" in names:
        steps.append(("the bundled encoder", lambda: _embed("cpu")))
    return steps


if __name__ == "__main__":
    raise SystemExit(main(model_steps()))
