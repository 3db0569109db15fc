"""Tokenizers: Hugging Face ``tokenizers`` for tokenizer.json, and GGUF-embedded
vocabularies (gpt2 byte-level BPE, llama SentencePiece) converted to it.

    tok = Tokenizer.from_gguf_metadata(checkpoint.metadata)   # or .from_dir(model_dir)
    ids = tok.encode("<|im_start|>user\\nHi<|im_end|>\\n", add_special_tokens=False)
    dec = tok.stream_decoder()
    text = "".join(dec.add(i) for i in ids) + dec.flush()
"""

from inference.tokenizer.core import END_OF_TURN, Tokenizer
from inference.tokenizer.stream import StreamDecoder

__all__ = ["END_OF_TURN", "StreamDecoder", "Tokenizer"]
