"""The stable Python API: load_model() and the two model kinds it returns."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends import select_backend
from inference.backends.base import (
    Backend,
    MemorySample,
    OpProfiler,
    SamplingParams,
    trim_host_heap,
)
from inference.chat_template import ChatTemplate
from inference.embed import BatchLimits, embed_ids
from inference.errors import InvalidInputError
from inference.events import DoneEvent, GenerationEvent
from inference.formats import read_checkpoint
from inference.formats.tensor import Checkpoint
from inference.generate import stream_generate
from inference.models import CAUSAL, architecture
from inference.models.common import Weights
from inference.store import ModelSpec, resolve
from inference.tokenizer import Tokenizer


class LoadedModel:
    """What every loaded model offers: its description, backend, and memory."""

    kind = "model"

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, backend: Backend, reason: str,
                 n_layers: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None):
        self.spec = spec
        self.backend = backend
        self.backend_reason = reason
        self.config = ckpt.config
        arch = architecture(ckpt.config["model_type"], ckpt.path.name)
        self.args = arch.ModelArgs.from_dict(ckpt.config)
        if n_layers is not None:  # keep only the first layers (tests, kernel bring-up)
            self.args.num_hidden_layers = min(n_layers, self.args.num_hidden_layers)
        weights = Weights(ckpt, backend, progress, cancel)
        self.model = arch.Model(self.args, backend, weights)
        if progress is not None:  # tensors the architecture does not use count as done
            progress(weights.total, weights.total)

    @property
    def name(self) -> str:
        return self.spec.name

    def memory(self) -> MemorySample:
        return self.backend.memory()

    def close(self) -> None:
        """Drop weights so their memory can be reclaimed."""
        self.model = None


class CausalLM(LoadedModel):
    kind = "causal"

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, backend: Backend, reason: str,
                 n_layers: int | None = None, **kw: Any):
        super().__init__(spec, ckpt, backend, reason, n_layers, **kw)
        if ckpt.format == "gguf":
            self.tokenizer = Tokenizer.from_gguf_metadata(ckpt.metadata)
        else:
            self.tokenizer = Tokenizer.from_dir(ckpt.path)
        self.template = ChatTemplate.for_checkpoint(ckpt, self.tokenizer)
        self.context_length = int(self.args.max_position_embeddings)
        # We attend over the whole context; a sliding-window model (Mistral v0.1, Qwen2 with
        # use_sliding_window) is only right while everything fits in its window.
        # (Models whose layers declare their windows, Gemma 2/3, attend within them exactly.)
        window = ckpt.config.get("sliding_window")
        windowed = "sliding_attention" in (getattr(self.args, "layer_types", None) or [])
        if window and not windowed and ckpt.config.get(
                "use_sliding_window", ckpt.config["model_type"] != "qwen2"):
            self.context_length = min(self.context_length, int(window))

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.template.render(list(messages), add_generation_prompt=True)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits, numpy (n_tokens, vocab) float32."""
        if len(token_ids) == 0:
            raise InvalidInputError("Cannot compute logits of an empty token list.")
        B = self.backend
        cache = self.model.make_cache(len(token_ids))
        out = self.model(B.array(np.asarray([token_ids], dtype=np.int64)), cache)
        return B.to_numpy(out)[0].astype(np.float32, copy=False)

    def _prompt_ids(self, prompt: str | None, messages: Sequence[dict[str, str]] | None
                    ) -> list[int]:
        if messages is not None:
            if not messages or not any(m.get("content", "").strip() for m in messages):
                raise InvalidInputError("The conversation is empty: write a message first.")
            # The template already writes the BOS/special tokens it wants.
            return self.tokenize(self.chat_prompt(messages), add_special_tokens=False)
        if prompt is None or not prompt.strip():
            raise InvalidInputError("The prompt is empty: write something to continue.")
        return self.tokenize(prompt)

    def generate(
        self,
        prompt: str | None = None,
        messages: Sequence[dict[str, str]] | None = None,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        profile: bool = False,
    ) -> Iterator[GenerationEvent]:
        """Stream TokenEvents then one DoneEvent. Raises InvalidInputError up front."""
        ids = self._prompt_ids(prompt, messages)
        if max_tokens < 1:
            raise InvalidInputError("max_tokens must be at least 1.")
        if len(ids) >= self.context_length:
            raise InvalidInputError(
                f"The prompt is {len(ids)} tokens but {self.name} holds at most "
                f"{self.context_length}; shorten it."
            )
        max_tokens = min(max_tokens, self.context_length - len(ids))
        return self._stream(ids, max_tokens, sampling or SamplingParams(), stop, cancel, profile)

    def _stream(self, ids: list[int], max_tokens: int, sampling: SamplingParams,
                stop: Sequence[str], cancel: threading.Event | None, profile: bool
                ) -> Iterator[GenerationEvent]:
        prof = OpProfiler(self.backend) if profile else None
        if prof is not None:
            prof.start()
        try:
            for ev in stream_generate(
                self.model, self.tokenizer, ids, max_tokens=max_tokens, sampling=sampling,
                eos_ids=self.tokenizer.eos_ids, stop=stop, cancel=cancel,
                max_len=len(ids) + max_tokens,
            ):
                if prof is not None and isinstance(ev, DoneEvent):
                    ev.op_times_s = dict(prof.totals)
                yield ev
        finally:
            if prof is not None:
                prof.stop()


class Encoder(LoadedModel):
    kind = "encoder"

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, backend: Backend, reason: str,
                 n_layers: int | None = None, **kw: Any):
        super().__init__(spec, ckpt, backend, reason, n_layers, **kw)
        self.tokenizer = Tokenizer.from_dir(ckpt.path)
        st = _read_json(ckpt.path / "sentence_bert_config.json")
        self.max_seq_length = int(st.get("max_seq_length", self.args.max_position_embeddings))
        self.normalize = (ckpt.path / "modules.json").exists() and "Normalize" in (
            ckpt.path / "modules.json").read_text()
        self.limits = getattr(backend, "embed_limits", BatchLimits())

    @property
    def dim(self) -> int:
        return int(self.args.hidden_size)

    def tokenize(self, text: str) -> list[int]:
        """Ids with [CLS]/[SEP], truncated to max_seq_length as sentence-transformers does."""
        ids = self.tokenizer.encode(text, add_special_tokens=True)
        if len(ids) > self.max_seq_length:
            ids = ids[: self.max_seq_length - 1] + ids[-1:]
        return ids

    def embed(self, sentences: Sequence[str], batch_size: int = 32,
              progress: Callable[[int, int], None] | None = None,
              cancel: threading.Event | None = None) -> np.ndarray:
        """One float32 row per sentence (empty strings included), L2-normalised if the
        model's sentence-transformers pipeline normalises."""
        if isinstance(sentences, str):
            raise InvalidInputError("embed() takes a list of sentences, not one string.")
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1.")
        ids = [self.tokenize(s) for s in sentences]
        limits = dataclasses.replace(self.limits,
                                     max_batch=min(batch_size, self.limits.max_batch))
        if not ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        return embed_ids(self.model, ids, pad_id=self.tokenizer.pad_id, limits=limits,
                         normalize=self.normalize, progress=progress, cancel=cancel)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def load_model(name_or_path: str | Path | ModelSpec, backend: str = "auto",
               n_layers: int | None = None,
               progress: Callable[[int, int], None] | None = None,
               cancel: threading.Event | None = None) -> CausalLM | Encoder:
    """Load a model by store name, path or ModelSpec onto a backend ("auto" picks one).

    The backend is checked for every op and quant type the architecture needs before any
    weight is converted. ``n_layers`` keeps only the first layers (tests, kernels bring-up).
    ``progress(bytes_done, bytes_total)`` follows weight conversion; setting ``cancel``
    stops the load between tensors with CancelledError.
    """
    spec = name_or_path if isinstance(name_or_path, ModelSpec) else resolve(str(name_or_path))
    ckpt = read_checkpoint(spec.path)
    model_type = ckpt.config.get("model_type", "?")
    mod = architecture(model_type, ckpt.path.name)
    qtypes = {t.qtype for t in ckpt.tensors.values()}
    B, reason = select_backend(backend, mod.REQUIRED_OPS, qtypes, model_type)
    cls = CausalLM if model_type in CAUSAL else Encoder
    model = cls(spec, ckpt, B, reason, n_layers=n_layers, progress=progress, cancel=cancel)
    del ckpt  # the parsed metadata goes now, and with it the heap it held
    trim_host_heap()
    return model
