"""Measure the memory a model takes on a backend; run as a script in a fresh process.

    python -m tests.gui.measure_model_memory NAME BACKEND CONTEXT

Loads the model and runs it once (so the backend's one-time costs, its imports and
compiled kernels, are paid), closes it, then loads it again and runs a job that fills
``CONTEXT`` tokens (a chat model) or embeds a full batch of the longest inputs (an
encoder), sampling RSS every 5 ms. Prints JSON: the RSS growth over the baseline taken
before the second load, at its peak while the model is loaded and in use (the load's
own transient, the parsed file header, is gone before the model can be used).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time


def _job(model, context: int) -> None:  # noqa: ANN001
    if model.kind == "causal":
        ids = model.tokenize(" ".join(f"w{i}" for i in range(2 * context)))
        text = model.detokenize(ids[: context - 80])
        for _ev in model.generate(prompt=text, max_tokens=64):
            pass
    else:
        model.embed([" ".join(f"w{i}" for i in range(j, j + 400)) for j in range(32)],
                    batch_size=32)


def main(name: str, backend: str, context: int) -> dict:
    import inference
    from inference.backends.base import host_rss, trim_host_heap

    model = inference.load_model(name, backend=backend)
    _job(model, context)
    model.close()
    del model
    gc.collect()
    trim_host_heap()
    base = host_rss()
    model = inference.load_model(name, backend=backend)
    loaded = host_rss()
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
    return {"backend": model.backend.name, "loaded": loaded - base, "peak": peak[0] - base}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
