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

# OpenBLAS's idle workers spin for 2**28 cycles (~0.1 s) after every call before they
# sleep, and the cpu backend runs its own threads between BLAS calls (prefill products,
# numba kernels); spinning beside them took a core from each (docs/cpu-backend.md,
# "Prefill"). 2**4 cycles: they sleep at once. OpenBLAS reads this when numpy loads it,
# so it is set before anything imports numpy; a value the user set is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from inference.api import CausalLM, Encoder, load_model  # noqa: E402
from inference.backends import probe_all  # noqa: E402
from inference.sampling import SamplingParams  # noqa: E402
from inference.store import ModelSpec, discover  # noqa: E402 (after the environment above)

__all__ = ["CausalLM", "Encoder", "ModelSpec", "SamplingParams", "discover", "load_model",
           "probe_all"]
