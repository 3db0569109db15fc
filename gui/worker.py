"""The work the window asks of the engine, as functions the job runner runs
(:mod:`gui.jobs`): each takes the job's context (the model registry, its cancel event,
a progress call) and its arguments, runs on the runner's thread, never touches a widget,
and returns its result. The data classes here are what the jobs report.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gui import analysis
from gui.jobs import JobContext, user_message
from gui.registry import MemoryReading, release_memory

log = logging.getLogger(__name__)
NO_CHAT_MODEL = "Load a chat model first (Models tab)."
NO_ENCODER = "Load an embedding model first (Models tab)."

__all__ = ["MemoryReading", "release_memory", "user_message"]


@dataclass
class GenerateRequest:
    messages: list[dict]
    max_tokens: int = 256
    sampling: dict = field(default_factory=dict)  # SamplingParams fields
    profile: bool = False
    context_limit: int | None = None  # tokens this chat may use (None: the model's context)
    policy: str = "stop"  # inference.context.POLICIES
    continue_final: bool = False  # extend the last (assistant) message instead of answering


@dataclass
class RemoteTarget:
    """A model on an OpenAI-compatible server, to load as ``kind``. The key lives here,
    in memory, for the life of the connection."""
    url: str
    model_id: str
    kind: str  # "causal" | "encoder"
    api_key: str | None = None

    @property
    def name(self) -> str:
        return self.model_id


@dataclass
class LoadedInfo:
    kind: str  # "causal" | "encoder"
    name: str
    path: str
    backend: str
    reason: str
    est_memory: int | None
    used_memory: int | None  # measured growth of device (or host) memory during the load
    context_length: int | None = None  # tokens a conversation can hold (chat models)
    template: str = ""  # the chat template used and why (the engine's template_source)

    @property
    def remote(self) -> bool:
        return self.backend == "remote"


@dataclass
class Prefill:
    """A prompt's prefill, reported when it ends (the first token): ``n_prompt`` tokens of
    which ``n_cached`` came from the prompt cache, in ``seconds``."""
    n_prompt: int
    n_cached: int
    seconds: float

    @property
    def n_prefilled(self) -> int:
        return max(0, self.n_prompt - self.n_cached)

    @property
    def tok_s(self) -> float:
        """Tokens prefilled per second (cached ones are not prefilled, so not counted)."""
        return self.n_prefilled / self.seconds if self.seconds > 0 else 0.0


def prefill_of(done: Any) -> Prefill:
    """The prefill of a finished generation (a DoneEvent)."""
    return Prefill(int(done.n_prompt), int(getattr(done, "n_cached", 0) or 0),
                   float(done.ttft_s))


@dataclass
class EmbedResult:
    sentences: list[str]
    vectors: np.ndarray  # (n, dim) float32, L2-normalised
    heatmap: np.ndarray  # cosine similarity, at most analysis.HEATMAP_MAX_SIDE square
    block: int  # sentences per heatmap pixel
    projection: np.ndarray  # (n, 2)
    elapsed_s: float
    cut: list[int] = field(default_factory=list)  # rows longer than the model's window
    window: int | None = None  # the model's window in tokens (None: not known here)


@dataclass
class BackendInfo:
    name: str
    available: bool
    reason: str
    free_memory: int | None


def free_memory(backend: str) -> int | None:
    """Memory a model may still take on ``backend``: the device's free memory on CUDA,
    available RAM elsewhere (the CPU backends, and MLX, whose GPU shares the RAM)."""
    if backend == "cuda":
        try:
            import cupy

            return int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:  # noqa: BLE001 - no device figure: say unknown, not RAM
            return None
    from inference.backends.base import host_memory

    return host_memory()[1]



@dataclass
class Estimates:
    """Memory each model would take: on ``backend`` with a ``context``-token KV cache in
    ``kv_dtype`` ("": the backend's), by model path."""
    backend: str
    context: int
    kv_dtype: str
    by_path: dict


@dataclass
class Measured:
    """Prompt tokens a conversation would send now, the context it may use, and what the
    context policy would do (the idle context indicator)."""
    used: int
    limit: int
    note: str


@dataclass
class Neighbours:
    hits: list  # (sentence, score, row)


@dataclass
class LoadStarted:
    name: str


@dataclass
class LoadProgress:
    done: int  # weight bytes converted
    total: int


@dataclass
class Compiling:
    """Kernels a backend readies at model load: ``done`` of ``total`` (``what`` was the
    last), reported since ``started`` (time.monotonic). The cpu backend loads each from
    numba's cache, compiling it on a first run; cuda compiles NVRTC modules."""
    done: int
    total: int
    what: str
    started: float

    @property
    def ended(self) -> bool:
        return self.done >= self.total

    def text(self, now: float | None = None) -> str:
        """The status line: what, how far and for how long."""
        seconds = (time.monotonic() if now is None else now) - self.started
        return (f"Preparing kernels (compiled on a first run, then cached): {self.done} of "
                f"{self.total}, {seconds:.0f} s")


@dataclass
class Progress:
    """Work done of a total (sentences embedded, bytes downloaded)."""
    done: int
    total: int


# --- jobs (run on the runner's thread) -------------------------------------------------
def discover(ctx: JobContext, extra_paths: list) -> list:
    """The models found (bundled, in the store, added files); unreadable files listed
    with their reason, as `inferdesk models` does."""
    import inference

    try:
        return _with_templates(inference.discover(extra_paths=tuple(extra_paths),
                                                  include_unreadable=True))
    except Exception:  # noqa: BLE001 - one unreadable added file must not hide the rest
        if not extra_paths:
            raise
        ctx.progress(_with_templates(inference.discover()))
        from inference.errors import InvalidInputError

        raise InvalidInputError("Some added model files could not be read.") from None


def _with_templates(specs: list) -> list:
    """``specs`` with each chat template line worked out here (a spec reads it when first
    asked: the header read and template compile stay off the window's thread)."""
    for spec in specs:
        _ = spec.chat_template
    return specs


def probe(ctx: JobContext) -> list:
    from inference.backends import probe_all

    infos = []
    for r in probe_all():
        infos.append(BackendInfo(r.name, bool(r.available), str(r.reason),
                                 free_memory(r.name) if r.available else None))
    return infos


def load(ctx: JobContext, target: Any, backend: str = "auto", kv_dtype: str = "") -> LoadedInfo:
    """Load ``target`` on ``backend`` with its KV cache in ``kv_dtype`` ("": the
    backend's own); a backend without that type refuses in one sentence. Cancel stops
    the load between tensors. The model replaces the registry's one of its kind. Kernels
    the backend compiles or loads on the way are reported as ``Compiling``."""
    import inference
    from inference.backends.base import host_rss

    name = getattr(target, "name", None) or Path(str(target)).name
    ctx.progress(LoadStarted(name))
    rss_before = host_rss()
    if isinstance(target, RemoteTarget):
        from inference.remote import connect

        model = connect(f"{target.url}#{target.model_id}", target.api_key, target.kind)
    else:
        started: list[float] = []

        def compiling(done: int, total: int, what: str) -> None:
            started[:] = started or [time.monotonic()]
            ctx.progress(Compiling(done, total, what, started[0]))

        model = inference.load_model(target, backend=backend, cancel=ctx.cancel,
                                     progress=lambda d, t: ctx.progress(LoadProgress(d, t)),
                                     kv_dtype=kv_dtype or None, compile_progress=compiling)
    ctx.models.put(model)
    sample = model.backend.memory()
    if model.backend.name == "remote":
        used = None  # held by the server, which does not say
    elif sample.device_used is not None and sample.device_total is not None \
            and model.backend.name not in ("numpy", "cpu"):
        used = sample.device_used
    else:
        used = max(0, sample.host_rss - rss_before)
    spec = model.spec
    return LoadedInfo(
        model.kind, spec.name, str(spec.path), model.backend.name,
        model.backend_reason, spec.est_memory, used,
        getattr(model, "context_length", None),
        str(getattr(getattr(model, "template", None), "template_source", "") or ""))


def unload(ctx: JobContext, kind: str) -> str:
    """Close the model of ``kind`` and give its memory back; the kind."""
    ctx.models.remove(kind)
    return kind


def list_remote(ctx: JobContext, url: str, api_key: str) -> tuple[str, list]:
    from inference.remote import list_models

    return url, list_models(url, api_key or None)


def estimate(ctx: JobContext, specs: list, backend: str, context: int,
             kv_dtype: str = "") -> Estimates:
    """Memory each model would take on ``backend`` ("auto": the one the engine would
    pick for it) with a KV cache of ``context`` tokens in ``kv_dtype`` ("": the
    backend's own). Quiet: a model whose estimate fails keeps its stored allowance."""
    from inference.backends import select_backend
    from inference.memory_estimate import estimate as estimate_one
    from inference.models import architecture

    out = {}
    for spec in specs:
        try:
            mod = architecture(spec.architecture, spec.path.name)
            B, _ = select_backend(backend, mod.REQUIRED_OPS, set(spec.quant_types),
                                  spec.architecture)
            if kv_dtype:
                B.use_kv_dtype(kv_dtype)
            out[str(spec.path)] = estimate_one(spec, B, context or None)
        except Exception:  # noqa: BLE001 - the stored allowance stays shown
            log.debug("estimate failed for %s", spec.path, exc_info=True)
    return Estimates(backend, context, kv_dtype, out)


def generate(ctx: JobContext, req: GenerateRequest) -> Any:
    """A reply to ``req``: progress is the plan (``Fitted``), the prefill (``Prefill``),
    each ``TokenEvent`` and memory readings; the result the ``DoneEvent`` (None if the
    engine ended without one). The chat model's forward lock is held throughout."""
    from inference.context import fit
    from inference.events import DoneEvent
    from inference.sampling import SamplingParams

    with ctx.models.using("causal", NO_CHAT_MODEL) as model:
        fitted = fit(model, req.messages, req.policy,
                     req.context_limit or getattr(model, "context_length", None),
                     req.max_tokens, req.continue_final, ctx.cancel)
        ctx.progress(fitted)
        done = None
        # The ids the fit counted: the chat is templated and tokenized once per Send.
        prompt = ({"prompt_ids": fitted.ids} if fitted.ids is not None else
                  {"messages": fitted.messages, "continue_final": req.continue_final})
        for ev in model.generate(**prompt, max_tokens=fitted.reply_tokens(req.max_tokens),
                                 sampling=SamplingParams(**req.sampling),
                                 cancel=ctx.cancel, profile=req.profile):
            if isinstance(ev, DoneEvent):
                done = ev
                continue
            if ev.index == 0 and ev.token_id != -1:  # the prompt is in
                cache = getattr(model, "prompt_cache", None)
                ctx.progress(Prefill(fitted.n_prompt or 0,
                                     int(getattr(cache, "reused", 0) or 0), ev.ttft_s))
            ctx.progress(ev)
            reading = ctx.models.sample(model, force=False)
            if reading is not None:
                ctx.progress(reading)
        if done is not None and done.memory is not None:
            ctx.progress(MemoryReading(model.backend.name, done.memory))
        return done


def measure(ctx: JobContext, messages: list, limit: int, policy: str) -> Measured | None:
    """Prompt tokens the conversation would send now (the idle context indicator); None
    when there is nothing to count. Quiet: a failure leaves the indicator as it is."""
    from inference.context import ContextFullError, counts_tokens, fit
    from inference.errors import ContextOverflowError

    model = ctx.models.get("causal")
    if model is None or not messages or not counts_tokens(model):
        return None
    limit = min(limit or model.context_length, model.context_length)
    try:
        fitted = fit(model, messages, policy, limit, 1)
        return Measured(fitted.n_prompt, fitted.limit, fitted.note())
    except ContextFullError as exc:  # "stop": counted whole, with the refusal to come
        try:
            used = len(model.plan(messages=messages, max_tokens=1)[0])
        except ContextOverflowError:
            used = model.context_length
        return Measured(max(used, limit), limit, str(exc))
    except Exception:  # noqa: BLE001 - an estimate for a label, never an error
        log.debug("measure failed", exc_info=True)
        return None


def embed(ctx: JobContext, sentences: list, batch_size: int = 32) -> EmbedResult:
    from inference.errors import CancelledError, InvalidInputError

    if not sentences:
        raise InvalidInputError("Paste at least one sentence, one per line.")
    with ctx.models.using("encoder", NO_ENCODER) as model:
        t0 = time.perf_counter()

        def progress(done: int, total: int) -> None:
            ctx.progress(Progress(done, total))
            reading = ctx.models.sample(model, force=False)
            if reading is not None:
                ctx.progress(reading)

        vectors = model.embed(sentences, batch_size=batch_size, progress=progress,
                              cancel=ctx.cancel)
        if ctx.cancel.is_set():
            raise CancelledError("Embedding cancelled.")
        elapsed = time.perf_counter() - t0
        vectors = np.asarray(vectors, dtype=np.float32)
        heat, block = analysis.heatmap(vectors)
        ctx.models.sentences, ctx.models.vectors = list(sentences), vectors
        return EmbedResult(list(sentences), vectors, heat, block,
                           analysis.project_2d(vectors), elapsed,
                           _cut_rows(model, sentences), getattr(model, "max_seq_length", None))


def query(ctx: JobContext, text: str, k: int = 10) -> Neighbours:
    from inference.errors import InvalidInputError

    with ctx.models.using("encoder", NO_ENCODER) as model:
        if ctx.models.vectors is None:
            raise InvalidInputError("Embed some sentences before searching them.")
        q = np.asarray(model.embed([text]), dtype=np.float32)[0]
    hits = analysis.nearest(ctx.models.vectors, q, k)
    return Neighbours([(ctx.models.sentences[i], score, i) for i, score in hits])


def export(ctx: JobContext, path: str) -> str:
    from inference.errors import InvalidInputError

    if ctx.models.vectors is None:
        raise InvalidInputError("Nothing to export yet: embed some sentences first.")
    if path.endswith(".csv"):
        _write_csv(Path(path), ctx.models.sentences, ctx.models.vectors)
    else:
        np.save(path, ctx.models.vectors)
    return path


def download(ctx: JobContext, repo_id: str, filename: str = "") -> str:
    from inference import store
    from inference.errors import CancelledError

    def progress(*args: Any) -> None:
        if len(args) >= 2:
            ctx.progress(Progress(int(args[0] or 0), int(args[1] or 0)))

    path = store.download(repo_id, filename or None, progress=progress, cancel=ctx.cancel)
    if ctx.cancel.is_set():
        raise CancelledError("Download cancelled.")
    return str(path)


def search(ctx: JobContext, text: str) -> tuple[str, list]:
    from gui import hub

    return text, hub.search_models(text)


def list_repo(ctx: JobContext, repo_id: str) -> tuple[str, list]:
    from gui import hub

    return repo_id, hub.repo_files(repo_id)


def _cut_rows(model: Any, sentences: list[str]) -> list[int]:
    """Rows whose text holds more tokens than the model's window (embedded from their
    start only); none known for a model that does not tokenize here (a remote one)."""
    window, tokenizer = getattr(model, "max_seq_length", None), getattr(model, "tokenizer", None)
    if not window or tokenizer is None:
        return []
    from inference.tokenizer.bounded import encode_bounded

    # A token covers at least one byte: a line of fewer bytes than the window (with room
    # for the special tokens) fits without being tokenized again.
    def longer(s: str) -> bool:
        ids, complete = encode_bounded(tokenizer, s, window)
        return not complete or len(ids) > window

    return [i for i, s in enumerate(sentences) if len(s.encode("utf-8")) + 8 > window
            and longer(s)]


def _write_csv(path: Path, sentences: list[str], vectors: np.ndarray) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentence"] + [f"d{i}" for i in range(vectors.shape[1])])
        for s, row in zip(sentences, vectors, strict=True):
            w.writerow([s] + [f"{x:.6g}" for x in row])


