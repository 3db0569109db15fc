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

from inference.api import CausalLM, Encoder, load_model
from inference.backends import probe_all
from inference.sampling import SamplingParams
from inference.store import ModelSpec, discover

__all__ = ["CausalLM", "Encoder", "ModelSpec", "SamplingParams", "discover", "load_model",
           "probe_all"]
