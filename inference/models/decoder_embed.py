"""A decoder read as a sentence encoder (Qwen3-Embedding and kin): the final norm's output
of every token, pooled by the embedder (last token, as these models declare).

Inputs arrive right-padded. Attention is causal, so a real token never sees the padding
after it, and its hidden state equals that of the unpadded input: no key mask is needed.
"""

from __future__ import annotations

from typing import Any

from inference.models.llama import Model


class DecoderEncoder:
    """:class:`~inference.models.protocol.EncoderModel` over a decoder ``Model``."""

    def __init__(self, decoder: Model):
        self.decoder = decoder
        self.B = decoder.B
        self.args = decoder.args
        self.layers = decoder.layers  # where first_bad_layer looks for a NaN

    def __call__(self, ids: Any, positions: Any, type_ids: Any, key_mask: Any) -> Any:
        """Hidden states (batch, seq, hidden); positions count from 0 as the decoder's do."""
        return self.decoder.hidden_states(ids, self.decoder.make_cache(ids.shape[1]))
