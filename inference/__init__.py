"""Inferdesk engine: find, load and run models. Imports no Qt.

Public API (used by the CLI, the GUI and outside scripts)::

    import inference
    specs = inference.discover()                      # list[ModelSpec]
    model = inference.load_model("SmolLM2-135M-Instruct.Q4_1", backend="auto")
    model.backend_reason                              # why this backend was chosen
    ids = model.tokenize("Hello")                     # list[int]
    lp = model.logits(ids)                            # numpy (n_tokens, vocab)
    for ev in model.generate(messages=[{"role": "user", "content": "Hi"}], max_tokens=64):
        ...                                           # TokenEvent..., then DoneEvent
    enc = inference.load_model("all-MiniLM-L6-v2")
    vecs = enc.embed(["a", "b"], batch_size=32, progress=lambda done, total: None)
"""

import os

# OpenBLAS runs on the calling thread only: the cpu backend shares work out between its own
# threads, each calling BLAS (prefill products, attention heads). OpenBLAS's own pool
# beside them spins its idle workers for ~0.1 s after every call, and its thread count
# can be changed only from the thread that started it, not from a model-loading or server
# thread (docs/cpu-backend.md, "Prefill"). Read when numpy loads OpenBLAS, so it is set
# before anything imports numpy; a value the user set is kept, and where OpenBLAS has
# several threads the backend lets it share the work instead.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import inference.threads  # noqa: E402,F401 (its first reading of the cores' load, at import)
from inference.api import CausalLM, Encoder, load_model  # noqa: E402
from inference.backends import probe_all  # noqa: E402
from inference.sampling import SamplingParams  # noqa: E402
from inference.store import ModelSpec, discover  # noqa: E402 (after the environment above)

__all__ = ["CausalLM", "Encoder", "ModelSpec", "SamplingParams", "discover", "load_model",
           "probe_all"]
