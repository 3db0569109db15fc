"""Measure the memory a model takes on a backend; run as a script in a fresh process.

    python -m tests.gui.measure_model_memory NAME_OR_PATH BACKEND CONTEXT

Loads the model and runs it once (so the backend's one-time costs, its imports, compiled
kernels and caches, are paid), closes it, then loads it again and runs a job that fills
``CONTEXT`` tokens (a chat model) or embeds a full batch of the longest inputs (an
encoder), after passing 12,000 distinct words through the tokenizer (as a session fills
its word cache); the chat job's prompt fills all but 16 tokens of the context, so its last
prefill chunk attends over (nearly) the whole context. The peak is the kernel's own
high-water mark of RSS (``VmHWM``, reset through ``/proc/self/clear_refs`` just before
the second load), so a peak lasting a millisecond counts; where Linux's ``/proc`` is
missing, RSS sampled every 5 ms, which can miss such peaks. Prints JSON:

- ``loaded``, ``peak``: the RSS growth over the baseline taken just before the second
  load, after it and at its peak while the model is in use (the load's own transient, the
  parsed file header, is gone before the model can be used);
- on ``mlx`` also ``mlx_loaded``, ``mlx_peak``: the same growth in MLX's own allocator
  counters (``mx.get_active_memory`` after the load, ``mx.get_peak_memory`` over the job,
  whose peak is reset when a generation starts), which count exactly the bytes of live
  arrays: no Python objects, no buffer cache, no allocator slack.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from itertools import islice, product

# 12,000 distinct words of letters (digits split into single tokens in many tokenizers).
WORDS = ["".join(p) for p in islice(product("bcdfghjklmnpqrstvwxz", repeat=4), 0, 24_000, 2)]


def _job(model, context: int, words: bool = True) -> None:  # noqa: ANN001
    # As a session does, the tokenizer first sees more distinct words than its word cache
    # keeps (10,000 in tokenizers' BPE and Unigram models), a few at a time.
    for i in range(0, len(WORDS) if words else 0, 8):
        model.tokenizer.encode(" ".join(WORDS[i:i + 8]))
    if model.kind == "causal":
        ids = model.tokenize(" ".join(f"w{i}" for i in range(2 * context)))
        text = model.detokenize(ids[: context - 16])  # fills the context, less a margin
        for _ev in model.generate(prompt=text, max_tokens=8):  # for re-tokenizing
            pass
    else:
        model.embed([" ".join(f"w{i}" for i in range(j, j + 400)) for j in range(32)],
                    batch_size=32)


def _mlx_active() -> int:
    import mlx.core as mx

    mx.synchronize()
    return int(mx.get_active_memory())


def _reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _kernel_peak() is not None
    except OSError:
        return False


def _kernel_peak() -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def main(name: str, backend: str, context: int) -> dict:
    import inference
    from inference.backends.base import host_rss, trim_host_heap

    model = inference.load_model(name, backend=backend)
    _job(model, context, words=False)  # the runtime's one-time costs; no cache survives
    model.close()
    del model
    gc.collect()
    trim_host_heap()
    on_mlx = backend == "mlx"
    mlx_base = _mlx_active() if on_mlx else 0
    base = host_rss()
    exact = _reset_peak()
    model = inference.load_model(name, backend=backend)
    loaded = host_rss()
    mlx_loaded = _mlx_active() if on_mlx else 0
    peak = [loaded]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], host_rss())
            time.sleep(0.005)

    th = threading.Thread(target=poll)
    th.start()
    try:
        _job(model, context)
    finally:
        stop.set()
        th.join()
    if exact:
        peak[0] = max(peak[0], _kernel_peak() or 0)
    out = {"backend": model.backend.name, "loaded": loaded - base, "peak": peak[0] - base,
           "exact_peak": exact}
    if on_mlx:
        import mlx.core as mx

        out.update(mlx_loaded=mlx_loaded - mlx_base,
                   mlx_peak=int(mx.get_peak_memory()) - mlx_base)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
