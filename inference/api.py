"""The stable Python API: load_model() and the two model kinds it returns."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.backends import select_backend
from inference.backends.base import (
    Backend,
    OpProfiler,
    keep_freed_heap,
    release_library_pages,
    trim_host_heap,
)
from inference.embed import BatchLimits, Pipeline, declares_pooling, embed_ids
from inference.errors import (
    ContextOverflowError,
    InvalidInputError,
)
from inference.events import DoneEvent, GenerationEvent, MemorySample
from inference.formats import read_checkpoint
from inference.formats.gguf_file import forget_header
from inference.formats.tensor import Checkpoint
from inference.generate import stream_generate
from inference.models import CAUSAL, architecture
from inference.models.common import Weights
from inference.models.decoder_embed import DecoderEncoder
from inference.prompt_cache import PromptCache
from inference.remote import RemoteEncoder, RemoteLM, connect, is_url

if TYPE_CHECKING:
    from inference.chat_template import ChatTemplate
from inference.sampling import SamplingParams
from inference.store import ModelSpec, context_length, resolve
from inference.tokenizer import Tokenizer
from inference.tokenizer.bounded import encode_bounded, encode_segments
from inference.validate import (
    GenerateArgs,
    Generates,
    check_finite,
    check_tensors,
    first_bad_layer,
    int_arg,
    messages_arg,
    sentences_arg,
    spec_for,
    text_arg,
    tokenizer_fits,
)
from inference.validate import token_ids as _token_ids


def read_tokenizer(ckpt: Checkpoint) -> Tokenizer:
    """The tokenizer a checkpoint carries (a GGUF's metadata, else the folder's files)."""
    if ckpt.format == "gguf":
        return Tokenizer.from_gguf_metadata(ckpt.metadata, ckpt.identity)
    return Tokenizer.from_dir(ckpt.path)


class LoadedModel:
    """What every loaded model offers: its description, backend, and memory."""

    kind = "model"

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, backend: Backend, reason: str,
                 n_layers: int | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 cancel: threading.Event | None = None, tokenizer: Tokenizer | None = None):
        self.spec = spec
        self.backend = backend
        self.backend_reason = reason
        self.config = ckpt.config
        arch = architecture(ckpt.config["model_type"], ckpt.path.name)
        self.args = arch.ModelArgs.from_dict(ckpt.config)
        check_tensors(self.args, ckpt.tensors, spec_for(ckpt.config["model_type"], arch),
                      where=ckpt.path.name)
        if n_layers is not None:  # keep only the first layers (tests, kernel bring-up)
            self.args.num_hidden_layers = min(n_layers, self.args.num_hidden_layers)
        self.tokenizer = read_tokenizer(ckpt) if tokenizer is None else tokenizer
        tokenizer_fits(self.tokenizer, int(self.args.vocab_size), ckpt.path.name)
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
        """Drop weights so their memory can be reclaimed, and what the backend holds for them
        (MLX on Metal: the wired-memory limit)."""
        self.model = None
        self.backend.close()


class CausalLM(LoadedModel, Generates):
    kind = "causal"

    def __init__(self, spec: ModelSpec, ckpt: Checkpoint, backend: Backend, reason: str,
                 n_layers: int | None = None, **kw: Any):
        super().__init__(spec, ckpt, backend, reason, n_layers, **kw)
        # What the chat template is chosen from (the checkpoint's headers go with the load).
        self._template_inputs = SimpleNamespace(
            path=ckpt.path, chat_template=ckpt.chat_template,
            config={"model_type": ckpt.config.get("model_type")},
            metadata={k: v for k, v in ckpt.metadata.items() if k == "tokenizer.chat_template"})
        self.prompt_cache = PromptCache()  # the last turn's KV cache, reused by the next
        self.context_length = context_length(ckpt.config, self.args)
        backend.prepare(self.model)  # the first reply as fast as the next ones

    @functools.cached_property
    def template(self) -> ChatTemplate:
        """The file's own template, else its family's, else ChatML: ``template_source`` says
        which and why, ``fallback_reason`` why the file's own was passed over. Compiled when
        first used, so a run without a chat never imports Jinja."""
        from inference.chat_template import ChatTemplate

        return ChatTemplate.for_checkpoint(self._template_inputs, self.tokenizer)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text_arg(text, "text"),
                                     add_special_tokens=add_special_tokens)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(_token_ids(ids, self.tokenizer.vocab_size).tolist())

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return self.template.render(messages_arg(messages), add_generation_prompt=True)

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits, numpy (n_tokens, vocab) float32."""
        ids = _token_ids(token_ids, int(self.args.vocab_size))
        if len(ids) == 0:
            raise InvalidInputError("Cannot compute logits of an empty token list.")
        if len(ids) > self.context_length:
            raise InvalidInputError(f"{len(ids)} tokens are more than {self.name} holds "
                                    f"({self.context_length}).")
        B = self.backend
        cache = self.model.make_cache(len(ids))
        out = B.to_numpy(self.model(B.array(ids[None, :]), cache))[0]
        check_finite(out, "logits", lambda: first_bad_layer(
            self.model, lambda: self.model(B.array(ids[None, :]), self.model.make_cache(len(ids))),
            B.to_numpy))
        return out.astype(np.float32, copy=False)

    def _prompt_ids(self, prompt: str | None, messages: Sequence[dict[str, str]] | None,
                    cancel: threading.Event | None = None, continue_final: bool = False
                    ) -> list[int]:
        limit = self.context_length - 1  # a prompt leaves room for one generated token
        if messages is not None:
            chat = messages_arg(messages)
            if not any(m["content"].strip() for m in chat):
                raise InvalidInputError("The conversation is empty: write a message first.")
            if continue_final:
                ids, complete = self._continue_ids(chat, limit, cancel)
            else:
                ids, complete = self._chat_ids(chat, limit, cancel)
        else:
            if prompt is None or not text_arg(prompt, "prompt").strip():
                raise InvalidInputError("The prompt is empty: write something to continue.")
            ids, complete = encode_bounded(self.tokenizer, prompt, limit)
        if not complete or len(ids) > limit:
            count = f"more than {limit}" if not complete else str(len(ids))
            raise ContextOverflowError(
                f"The prompt is {count} tokens but {self.name} holds at most "
                f"{self.context_length}; shorten it.")
        return ids

    def _chat_ids(self, chat: list[dict[str, str]], limit: int,
                  cancel: threading.Event | None) -> tuple[list[int], bool]:
        """Ids of the rendered chat. The template's own markup (rendered text already holds
        every BOS/special token it wants) is parsed for special tokens; message contents are
        not, so "<|im_end|>" typed by a user stays text and cannot forge a turn."""
        return encode_segments(self.tokenizer, self.template.render_segments(
            chat, cancel=cancel), limit)

    def _continue_ids(self, chat: list[dict[str, str]], limit: int,
                      cancel: threading.Event | None) -> tuple[list[int], bool]:
        """Ids that continue the final (assistant) message: the chat before it with the
        generation prompt, then that message's text (content: special tokens stay text)."""
        if len(chat) < 2 or chat[-1]["role"] != "assistant":
            raise InvalidInputError("Only a reply can be continued: the last message must be "
                                    "the assistant's.")
        ids, complete = self._chat_ids(chat[:-1], limit, cancel)
        if not complete:
            return ids, False
        tail, complete = encode_bounded(self.tokenizer, chat[-1]["content"], limit - len(ids),
                                        add_special_tokens=False, parse_special=False,
                                        after=ids[-1] if ids else None)
        return ids + tail, complete

    def _generate(self, a: GenerateArgs) -> Iterator[GenerationEvent]:
        if a.prompt_ids is None:
            ids, n = self.plan(a.prompt, a.messages, a.max_tokens, a.cancel, a.continue_final)
        else:
            ids = _token_ids(a.prompt_ids, int(self.args.vocab_size), "prompt ids").tolist()
            if not ids or len(ids) >= self.context_length:
                raise InvalidInputError(f"prompt_ids must hold 1 to {self.context_length - 1} "
                                        f"token ids; it holds {len(ids)}.")
            n = min(a.max_tokens, self.context_length - len(ids))
        return self._stream(ids, n, a.sampling, a.stop, a.cancel, a.profile, a.ignore_eos)

    def plan(self, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None,
             max_tokens: int = 256, cancel: threading.Event | None = None,
             continue_final: bool = False) -> tuple[list[int], int]:
        """The prompt's token ids and ``max_tokens`` capped to the context, or
        InvalidInputError: what :meth:`generate` checks before it starts."""
        max_tokens = int_arg(max_tokens, "max_tokens", 1)
        if prompt is not None and messages is not None:
            raise InvalidInputError("Pass either prompt or messages, not both.")
        if continue_final and messages is None:
            raise InvalidInputError("continue_final needs messages, not a prompt.")
        ids = self._prompt_ids(prompt, messages, cancel, continue_final)
        return ids, min(max_tokens, self.context_length - len(ids))

    def _stream(self, ids: list[int], max_tokens: int, sampling: SamplingParams,
                stop: Sequence[str], cancel: threading.Event | None, profile: bool,
                ignore_eos: bool = False) -> Iterator[GenerationEvent]:
        prof = OpProfiler(self.backend) if profile else None
        if prof is not None:
            prof.start()
        try:
            for ev in stream_generate(
                self.model, self.tokenizer, ids, max_tokens=max_tokens, sampling=sampling,
                eos_ids=set() if ignore_eos else self.tokenizer.eos_ids, stop=stop, cancel=cancel,
                max_len=len(ids) + max_tokens, prompt_cache=self.prompt_cache,
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
        if ckpt.config["model_type"] in CAUSAL:  # a decoder embedder (Qwen3-Embedding)
            self.model = DecoderEncoder(self.model)
        self.pipeline = Pipeline.from_dir(ckpt.path, getattr(self.args, "pooling_type", -1))
        # Positions past the table would index outside it.
        limit = context_length(ckpt.config, self.args)
        self.max_seq_length = min(self.pipeline.max_seq_length or limit, limit)
        self.normalize = self.pipeline.normalize
        self.limits = getattr(backend, "embed_limits", BatchLimits())

    @property
    def dim(self) -> int:
        return int(self.args.hidden_size)

    def tokenize(self, text: str) -> list[int]:
        """Ids with [CLS]/[SEP], truncated to max_seq_length as sentence-transformers does
        (only a bounded prefix of a long text is tokenized)."""
        ids, _ = encode_bounded(self.tokenizer, text_arg(text, "text"), self.max_seq_length)
        if len(ids) > self.max_seq_length:
            ids = ids[: self.max_seq_length - 1] + ids[-1:]
        return ids

    def embed(self, sentences: Sequence[str], batch_size: int = 32,
              progress: Callable[[int, int], None] | None = None,
              cancel: threading.Event | None = None, batching: str = "planned") -> np.ndarray:
        """One float32 row per sentence (empty strings included), L2-normalised if the
        model's sentence-transformers pipeline normalises. ``batching``: "planned" (by
        length within the memory budget) or "fixed" (``batch_size`` sentences by length,
        as sentence-transformers batches); the vectors do not depend on it."""
        sentences = sentences_arg(sentences)
        batch_size = int_arg(batch_size, "batch_size", 1)
        if batching not in ("planned", "fixed"):
            raise InvalidInputError(f"batching must be 'planned' or 'fixed', not {batching!r}.")
        ids = [self.tokenize(s) for s in sentences]
        limits = dataclasses.replace(self.limits,
                                     max_batch=min(batch_size, self.limits.max_batch))
        if not ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        self.backend.adapt_threads()
        vecs = embed_ids(self.model, ids, pad_id=self.tokenizer.pad_id, limits=limits,
                         normalize=self.normalize, pooling=self.pipeline.pooling,
                         progress=progress, cancel=cancel, batching=batching)
        bad = np.flatnonzero(~np.isfinite(vecs).all(axis=1))
        if bad.size:
            check_finite(vecs[bad[0]], f"embeddings of sentence {int(bad[0])}",
                         lambda: self._diagnose(ids[int(bad[0])]))
        return vecs

    def _diagnose(self, ids: list[int]) -> str:
        """Where a NaN/Inf first appears in the forward pass of one input."""
        B = self.backend
        n = len(ids)

        def run() -> Any:
            def arr(a: list[list[int]]) -> Any:
                return B.array(np.asarray(a, dtype=np.int64))
            return self.model(arr([ids]), arr([list(range(n))]), arr([[0]]),
                              B.array(np.ones((1, n), dtype=np.float32)))
        return first_bad_layer(self.model, run, B.to_numpy)


def _weight_store(B: Backend, ckpt: Checkpoint, n_layers: int | None
                  ) -> contextlib.AbstractContextManager[Any]:
    """The cpu backend's store of packed weights for this file (a whole model only)."""
    if B.name != "cpu" or n_layers is not None:
        return contextlib.nullcontext()
    from inference.backends.cpu.pack import pack_store

    return pack_store(ckpt.identity)


_library_pages_released = False  # by a load of this process (release_library_pages)


def load_model(name_or_path: str | Path | ModelSpec, backend: str = "auto",
               n_layers: int | None = None,
               progress: Callable[[int, int], None] | None = None,
               cancel: threading.Event | None = None,
               api_key: str | None = None,
               kv_dtype: str | None = None, prefill_dtype: str | None = None,
               compile_progress: Callable[[int, int, str], None] | None = None
               ) -> CausalLM | Encoder | RemoteLM | RemoteEncoder:
    """Load a model by store name, path or ModelSpec onto a backend ("auto" picks one).

    The backend is checked for every op and quant type the architecture needs before any
    weight is converted. ``n_layers`` keeps only the first layers (tests, kernels bring-up).
    ``progress(bytes_done, bytes_total)`` follows weight conversion; setting ``cancel``
    stops the load between tensors with CancelledError. An ``http(s)://`` URL connects to
    an OpenAI-compatible server instead (:mod:`inference.remote`; ``api_key`` if it needs
    one): ``"http://host:8080/v1#model-id"``. ``kv_dtype`` ("float32", "float16",
    "bfloat16"): the KV cache's element type where the backend offers it (default: the
    backend's own, float32 on cpu, float16 on cuda); refused before any weight loads.
    ``prefill_dtype`` ("float32", "float16", "bfloat16"): the cuda backend's prefill GEMM
    input type (CudaBackend.use_prefill_dtype); other backends refuse it.
    ``compile_progress(done, total, module)``: the kernel modules a backend compiles as it
    starts, on the calling thread (cuda's first run on a machine: NVRTC, tens of seconds;
    an app shows "compiling N of M"); see inference.backends.cuda.create.
    """
    if is_url(name_or_path):
        return connect(str(name_or_path), api_key=api_key)
    if n_layers is not None:
        n_layers = int_arg(n_layers, "n_layers", 1)
    if isinstance(name_or_path, ModelSpec):
        spec, ckpt = name_or_path, read_checkpoint(name_or_path.path)
    else:  # a model file is read once, for its description and its load
        path = Path(str(name_or_path).strip()).expanduser()
        ckpt = read_checkpoint(path) if path.is_file() else None
        spec = resolve(str(name_or_path), checkpoint=ckpt)
        if ckpt is None:
            ckpt = read_checkpoint(spec.path)
    model_type = ckpt.config.get("model_type", "?")
    mod = architecture(model_type, ckpt.path.name)
    qtypes = {t.qtype for t in ckpt.tensors.values()}
    B, reason = select_backend(backend, mod.REQUIRED_OPS, qtypes, model_type,
                               compile_progress=compile_progress)
    if kv_dtype is not None:
        B.use_kv_dtype(kv_dtype)
    if prefill_dtype is not None:
        if not hasattr(B, "use_prefill_dtype"):
            raise InvalidInputError(f"The {B.name} backend has no prefill_dtype setting.")
        B.use_prefill_dtype(prefill_dtype)
    cls = CausalLM if model_type in CAUSAL and not declares_pooling(ckpt.path) else Encoder
    # Built before the packed weights are mapped: its build holds the vocabulary and merges
    # as Python objects (~150 MiB for Llama 3's 128k tokens), returned to the OS here rather
    # than stacked on the weights' resident pages at the load's peak.
    tokenizer = read_tokenizer(ckpt)
    trim_host_heap()
    with _weight_store(B, ckpt, n_layers) as store:
        model = cls(spec, ckpt, B, reason, n_layers=n_layers, progress=progress, cancel=cancel,
                    tokenizer=tokenizer)
    ckpt.release_pages()  # pages read while converting; weights kept in file layout map again
    if ckpt.format == "gguf":
        forget_header(ckpt.path)  # the model holds what it needs: the vocabulary's strings go
    del ckpt  # its views and temporaries go now
    trim_host_heap()
    keep_freed_heap()  # from here on, reuse what inference frees (prefill's temporaries)
    global _library_pages_released
    # The first model's kernels are loaded: the libraries' code pages go (the compiler's, the
    # tokenizer build's), once a process (a later load would drop only what an earlier
    # model's kernels, loaded at their first call, faulted in and use again).
    if not _library_pages_released:
        release_library_pages()
        _library_pages_released = True
    if store is not None:  # the packed weights resident last (PackStore.populate)
        store.populate()
    return model
