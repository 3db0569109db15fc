"""The inference worker: a QObject living on its own QThread.

The GUI asks for work through :class:`WorkerHandle` (queued signals into the worker's
thread) and hears back through the handle's signals, which are re-emitted on the GUI thread.
The worker never touches a widget; widgets never call the engine. One job runs at a time
per worker; jobs queue in the thread's event loop. Cancellation uses ``threading.Event``s
that the GUI sets directly, since a busy worker cannot process queued requests.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

from gui import analysis

log = logging.getLogger(__name__)
MEMORY_SAMPLE_S = 0.2  # worker-side memory samples feed the >= 4 Hz graphs


@dataclass
class GenerateRequest:
    messages: list[dict]
    max_tokens: int = 256
    sampling: dict = field(default_factory=dict)  # SamplingParams fields
    profile: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)
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


def release_memory() -> None:
    """Give freed model memory back: collect cycles, then return free heap pages to the
    OS (glibc's ``malloc_trim``; elsewhere the collection alone)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim with
        pass


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


def user_message(exc: BaseException) -> str:
    """One sentence for the window. Engine errors already are one; others get a prefix."""
    from inference.errors import InferdeskError

    if isinstance(exc, InferdeskError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "Out of memory: close other programs or choose a smaller model."
    return f"Unexpected error ({type(exc).__name__}): {exc}"


def _record(r: Any, attr: str, index: int) -> Any:
    return getattr(r, attr) if hasattr(r, attr) else r[index]


def free_memory(backend: str) -> int | None:
    """Memory a model may still take on ``backend``: the device's free memory on CUDA,
    available RAM elsewhere (the CPU backends, and MLX, whose GPU shares the RAM)."""
    import psutil

    if backend == "cuda":
        try:
            import cupy

            return int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:  # noqa: BLE001 - no device figure: say unknown, not RAM
            return None
    return int(psutil.virtual_memory().available)


class Worker(QObject):
    discovered = Signal(list)  # list[ModelSpec]
    backends = Signal(list)  # list[BackendInfo]
    load_started = Signal(str)  # name
    load_progress = Signal(int, int)  # weight bytes converted, total
    loaded = Signal(object)  # LoadedInfo
    unloaded = Signal(str)  # kind
    # backend asked for, context, KV cache type asked for ("": the backend's), {path: estimate}
    estimated = Signal(str, int, str, dict)
    remote_listed = Signal(str, list)  # server URL, list[inference.remote.RemoteModel]
    planned = Signal(object)  # inference.context.Fitted: what the model is sent
    # prompt tokens of a conversation, the context it may use, what the policy would do
    measured = Signal(int, int, str)
    prefilled = Signal(object)  # Prefill: the prompt is in, the first token is coming
    token = Signal(object)  # inference.events.TokenEvent
    generated = Signal(object)  # inference.events.DoneEvent
    embed_progress = Signal(int, int)
    embedded = Signal(object)  # EmbedResult
    neighbours = Signal(object)  # list[(sentence, score)]
    exported = Signal(str)
    download_progress = Signal(int, int)
    downloaded = Signal(str)
    found = Signal(str, list)  # query, list[gui.hub.HubModel]
    repo_listed = Signal(str, list)  # repo id, list[gui.hub.HubFile]
    memory = Signal(str, object)  # backend name, MemorySample
    cancelled = Signal(str)  # job kind
    failed = Signal(str, str)  # job kind, one-sentence message
    busy = Signal(str)  # job kind, "" when idle

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, Any] = {}  # kind -> CausalLM | Encoder
        self._last_sample = 0.0
        self._sentences: list[str] = []
        self._vectors: np.ndarray | None = None

    # --- helpers ---------------------------------------------------------------------
    def _run(self, kind: str, fn, *args) -> None:
        self.busy.emit(kind)
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message
            from inference.errors import CancelledError

            if isinstance(exc, CancelledError):
                self.cancelled.emit(kind)
            else:
                if not _is_engine_error(exc):
                    log.exception("%s failed", kind)
                self.failed.emit(kind, user_message(exc))
        finally:
            self._sample_memory(force=True)
            self.busy.emit("")

    def _sample_memory(self, force: bool = False, model: Any = None) -> None:
        now = time.monotonic()
        if not force and now - self._last_sample < MEMORY_SAMPLE_S:
            return
        self._last_sample = now
        model = model or self.models.get("causal") or self.models.get("encoder")
        try:
            if model is not None:
                self.memory.emit(model.backend.name, model.backend.memory())
        except Exception:  # noqa: BLE001 - a missing sample must not end a job
            log.debug("memory sample failed", exc_info=True)

    # --- jobs ------------------------------------------------------------------------
    @Slot(list)
    def discover(self, extra_paths: list) -> None:
        def job() -> None:
            import inference

            try:
                # Unreadable files are listed with the reason, as `inferdesk models` does.
                specs = inference.discover(extra_paths=tuple(extra_paths),
                                           include_unreadable=True)
            except Exception:
                # One unreadable added file must not hide the bundled models.
                specs = inference.discover()
                raise_later = True
            else:
                raise_later = False
            self.discovered.emit(list(specs))
            if raise_later and extra_paths:
                self.failed.emit("discover", "Some added model files could not be read.")

        self._run("discover", job)

    @Slot()
    def probe(self) -> None:
        def job() -> None:
            from inference.backends import probe_all

            infos = []
            for r in probe_all():
                name, ok, reason = _record(r, "name", 0), _record(r, "available", 1), \
                    _record(r, "reason", 2)
                infos.append(BackendInfo(name, bool(ok), str(reason),
                                         free_memory(name) if ok else None))
            self.backends.emit(infos)

        self._run("probe", job)

    @Slot(object, str, str, object)
    def load(self, target: Any, backend: str, kv_dtype: str, cancel: threading.Event) -> None:
        """Load ``target`` on ``backend`` with its KV cache in ``kv_dtype`` ("": the
        backend's own); a backend without that type refuses in one sentence."""
        def job() -> None:
            import inference
            from inference.backends.base import host_rss

            name = getattr(target, "name", None) or Path(str(target)).name
            self.load_started.emit(name)
            rss_before = host_rss()
            if isinstance(target, RemoteTarget):
                from inference.remote import connect

                model = connect(f"{target.url}#{target.model_id}", target.api_key,
                                target.kind)
            else:
                # Cancel stops the load between tensors (CancelledError -> cancelled).
                model = inference.load_model(target, backend=backend, cancel=cancel,
                                             progress=self.load_progress.emit,
                                             kv_dtype=kv_dtype or None)
            old = self.models.pop(model.kind, None)
            if old is not None:
                old.close()
                del old
                release_memory()
                self.unloaded.emit(model.kind)
            self.models[model.kind] = model
            sample = model.backend.memory()
            if model.backend.name == "remote":
                used = None  # held by the server, which does not say
            elif sample.device_used is not None and sample.device_total is not None \
                    and model.backend.name not in ("numpy", "cpu"):
                used = sample.device_used
            else:
                used = max(0, sample.host_rss - rss_before)
            spec = model.spec
            self.loaded.emit(LoadedInfo(
                model.kind, spec.name, str(spec.path), model.backend.name,
                model.backend_reason, spec.est_memory, used,
                getattr(model, "context_length", None),
                str(getattr(getattr(model, "template", None), "template_source", "") or "")))
            self._sample_memory(force=True, model=model)

        self._run("load", job)

    @Slot(str, str)
    def list_remote(self, url: str, api_key: str) -> None:
        def job() -> None:
            from inference.remote import list_models

            self.remote_listed.emit(url, list_models(url, api_key or None))

        self._run("connect", job)

    @Slot(list, str, int, str)
    def estimate(self, specs: list, backend: str, context: int, kv_dtype: str = "") -> None:
        """Memory each model would take on ``backend`` ("auto": the one the engine would
        pick for it) with a KV cache of ``context`` tokens in ``kv_dtype`` ("": the
        backend's own). Quiet, like :meth:`measure`."""
        from inference.backends import select_backend
        from inference.memory_estimate import estimate
        from inference.models import architecture

        out = {}
        for spec in specs:
            try:
                mod = architecture(spec.architecture, spec.path.name)
                B, _ = select_backend(backend, mod.REQUIRED_OPS, set(spec.quant_types),
                                      spec.architecture)
                if kv_dtype:
                    B.use_kv_dtype(kv_dtype)
                out[str(spec.path)] = estimate(spec, B, context or None)
            except Exception:  # noqa: BLE001 - the stored allowance stays shown
                log.debug("estimate failed for %s", spec.path, exc_info=True)
        self.estimated.emit(backend, context, kv_dtype, out)

    @Slot(str)
    def unload(self, kind: str) -> None:
        def job() -> None:
            model = self.models.pop(kind, None)
            if model is not None:
                model.close()
                if kind == "encoder":
                    self._vectors, self._sentences = None, []
                del model
                release_memory()
                self.unloaded.emit(kind)

        self._run("unload", job)

    @Slot(object)
    def generate(self, req: GenerateRequest) -> None:
        def job() -> None:
            from inference.context import fit
            from inference.errors import InvalidInputError
            from inference.events import DoneEvent
            from inference.sampling import SamplingParams

            model = self.models.get("causal")
            if model is None:
                raise InvalidInputError("Load a chat model first (Models tab).")
            fitted = fit(model, req.messages, req.policy,
                         req.context_limit or getattr(model, "context_length", None),
                         req.max_tokens, req.continue_final, req.cancel)
            self.planned.emit(fitted)
            done = None
            # The ids the fit counted: the chat is templated and tokenized once per Send.
            prompt = ({"prompt_ids": fitted.ids} if fitted.ids is not None else
                      {"messages": fitted.messages, "continue_final": req.continue_final})
            for ev in model.generate(**prompt,
                                     max_tokens=fitted.reply_tokens(req.max_tokens),
                                     sampling=SamplingParams(**req.sampling),
                                     cancel=req.cancel, profile=req.profile):
                if isinstance(ev, DoneEvent):
                    done = ev
                else:
                    if ev.index == 0 and ev.token_id != -1:  # the prompt is in
                        cache = getattr(model, "prompt_cache", None)
                        self.prefilled.emit(Prefill(
                            fitted.n_prompt or 0, int(getattr(cache, "reused", 0) or 0),
                            ev.ttft_s))
                    self.token.emit(ev)
                    self._sample_memory(model=model)
            if done is not None:
                if done.memory is not None:
                    self.memory.emit(model.backend.name, done.memory)
                self.generated.emit(done)

        self._run("generate", job)

    @Slot(list, int, str)
    def measure(self, messages: list, limit: int, policy: str) -> None:
        """Prompt tokens the conversation would send now (the idle context indicator).
        Quiet: no busy signal and no banner; a failure just leaves the indicator as is."""
        from inference.context import ContextFullError, counts_tokens, fit
        from inference.errors import ContextOverflowError

        model = self.models.get("causal")
        if model is None or not messages or not counts_tokens(model):
            return
        limit = min(limit or model.context_length, model.context_length)
        try:
            fitted = fit(model, messages, policy, limit, 1)
            self.measured.emit(fitted.n_prompt, fitted.limit, fitted.note())
        except ContextFullError as exc:  # "stop": counted whole, with the refusal to come
            try:
                used = len(model.plan(messages=messages, max_tokens=1)[0])
            except ContextOverflowError:
                used = model.context_length
            self.measured.emit(max(used, limit), limit, str(exc))
        except Exception:  # noqa: BLE001 - an estimate for a label, never an error
            log.debug("measure failed", exc_info=True)

    @Slot(list, int, object)
    def embed(self, sentences: list, batch_size: int, cancel: threading.Event) -> None:
        def job() -> None:
            from inference.errors import CancelledError, InvalidInputError

            model = self.models.get("encoder")
            if model is None:
                raise InvalidInputError("Load an embedding model first (Models tab).")
            if not sentences:
                raise InvalidInputError("Paste at least one sentence, one per line.")
            t0 = time.perf_counter()

            def progress(done: int, total: int) -> None:
                self.embed_progress.emit(done, total)
                self._sample_memory(model=model)

            vectors = model.embed(sentences, batch_size=batch_size, progress=progress,
                                  cancel=cancel)
            if cancel.is_set():
                raise CancelledError("Embedding cancelled.")
            elapsed = time.perf_counter() - t0
            vectors = np.asarray(vectors, dtype=np.float32)
            heat, block = analysis.heatmap(vectors)
            self._sentences, self._vectors = list(sentences), vectors
            window = getattr(model, "max_seq_length", None)
            self.embedded.emit(EmbedResult(list(sentences), vectors, heat, block,
                                           analysis.project_2d(vectors), elapsed,
                                           _cut_rows(model, sentences), window))

        self._run("embed", job)

    @Slot(str, int)
    def query(self, text: str, k: int) -> None:
        def job() -> None:
            from inference.errors import InvalidInputError

            model = self.models.get("encoder")
            if model is None or self._vectors is None:
                raise InvalidInputError("Embed some sentences before searching them.")
            q = np.asarray(model.embed([text]), dtype=np.float32)[0]
            hits = analysis.nearest(self._vectors, q, k)
            self.neighbours.emit([(self._sentences[i], score, i) for i, score in hits])

        self._run("query", job)

    @Slot(str)
    def export(self, path: str) -> None:
        def job() -> None:
            from inference.errors import InvalidInputError

            if self._vectors is None:
                raise InvalidInputError("Nothing to export yet: embed some sentences first.")
            if path.endswith(".csv"):
                _write_csv(Path(path), self._sentences, self._vectors)
            else:
                np.save(path, self._vectors)
            self.exported.emit(path)

        self._run("export", job)

    @Slot(str, str, object)
    def download(self, repo_id: str, filename: str, cancel: threading.Event) -> None:
        def job() -> None:
            from inference import store

            def progress(*args: Any) -> None:
                if len(args) >= 2:
                    self.download_progress.emit(int(args[0] or 0), int(args[1] or 0))

            path = store.download(repo_id, filename or None, progress=progress, cancel=cancel)
            if cancel.is_set():
                self.cancelled.emit("download")
                return
            self.downloaded.emit(str(path))

        self._run("download", job)

    @Slot(str)
    def search(self, query: str) -> None:
        def job() -> None:
            from gui import hub

            self.found.emit(query, hub.search_models(query))

        self._run("search", job)

    @Slot(str)
    def list_repo(self, repo_id: str) -> None:
        def job() -> None:
            from gui import hub

            self.repo_listed.emit(repo_id, hub.repo_files(repo_id))

        self._run("list_repo", job)

    @Slot()
    def shutdown(self) -> None:
        for model in self.models.values():
            try:
                model.close()
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                log.debug("close failed", exc_info=True)
        self.models.clear()
        QThread.currentThread().quit()


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


def _is_engine_error(exc: BaseException) -> bool:
    from inference.errors import InferdeskError

    return isinstance(exc, InferdeskError)


def _write_csv(path: Path, sentences: list[str], vectors: np.ndarray) -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["sentence"] + [f"d{i}" for i in range(vectors.shape[1])])
        for s, row in zip(sentences, vectors, strict=True):
            w.writerow([s] + [f"{x:.6g}" for x in row])


class WorkerHandle(QObject):
    """GUI-side face of one worker thread: request methods plus GUI-thread signals."""

    # Requests (queued into the worker's thread).
    _discover = Signal(list)
    _probe = Signal()
    _load = Signal(object, str, str, object)
    _unload = Signal(str)
    _generate = Signal(object)
    _measure = Signal(list, int, str)
    _estimate = Signal(list, str, int, str)
    _list_remote = Signal(str, str)
    _embed = Signal(list, int, object)
    _query = Signal(str, int)
    _export = Signal(str)
    _download = Signal(str, str, object)
    _search = Signal(str)
    _list_repo = Signal(str)
    _shutdown = Signal()

    # Results, re-emitted on the GUI thread (signal-to-signal connections are queued by
    # the receiver's thread, so any slot or lambda connected here runs on the GUI thread).
    discovered = Signal(list)
    backends = Signal(list)
    load_started = Signal(str)
    load_progress = Signal(int, int)
    loaded = Signal(object)
    unloaded = Signal(str)
    estimated = Signal(str, int, str, dict)
    remote_listed = Signal(str, list)
    planned = Signal(object)
    measured = Signal(int, int, str)
    prefilled = Signal(object)
    token = Signal(object)
    generated = Signal(object)
    embed_progress = Signal(int, int)
    embedded = Signal(object)
    neighbours = Signal(object)
    exported = Signal(str)
    download_progress = Signal(int, int)
    downloaded = Signal(str)
    found = Signal(str, list)
    repo_listed = Signal(str, list)
    memory = Signal(str, object)
    cancelled = Signal(str)
    failed = Signal(str, str)
    busy = Signal(str)

    def __init__(self, name: str = "inferdesk-worker", parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName(name)
        self.worker = Worker()
        self.worker.moveToThread(self.thread)
        for req in ("discover", "probe", "load", "unload", "generate", "measure", "estimate",
                    "list_remote", "embed", "query", "export", "download", "search", "list_repo",
                    "shutdown"):
            getattr(self, "_" + req).connect(getattr(self.worker, req))
        for sig in ("discovered", "backends", "load_started", "load_progress", "loaded",
                    "unloaded", "estimated", "remote_listed", "planned", "measured",
                    "prefilled", "token",
                    "generated", "embed_progress", "embedded", "neighbours", "exported",
                    "download_progress", "downloaded", "found", "repo_listed", "memory",
                    "cancelled", "failed",
                    "busy"):
            getattr(self.worker, sig).connect(getattr(self, sig))
        self.busy.connect(self._set_busy)
        self.job = ""  # what the worker is doing, as last reported
        self._cancels: dict[str, threading.Event] = {}
        self.thread.start()

    def _set_busy(self, kind: str) -> None:
        self.job = kind

    def _event(self, kind: str) -> threading.Event:
        ev = threading.Event()
        self._cancels[kind] = ev
        return ev

    # --- requests --------------------------------------------------------------------
    def discover(self, extra_paths: list[str]) -> None:
        self._discover.emit(list(extra_paths))

    def probe(self) -> None:
        self._probe.emit()

    def load(self, target: Any, backend: str = "auto", kv_dtype: str = "") -> None:
        self._load.emit(target, backend, kv_dtype, self._event("load"))

    def unload(self, kind: str) -> None:
        self._unload.emit(kind)

    def list_remote(self, url: str, api_key: str = "") -> None:
        """The models an OpenAI-compatible server at ``url`` lists (remote_listed)."""
        self._list_remote.emit(url, api_key)

    def generate(self, req: GenerateRequest) -> None:
        self._cancels["generate"] = req.cancel
        self._generate.emit(req)

    def estimate(self, specs: list, backend: str, context: int, kv_dtype: str = "") -> None:
        self._estimate.emit(list(specs), backend, int(context), kv_dtype)

    def measure(self, messages: list[dict], limit: int | None, policy: str) -> None:
        self._measure.emit(list(messages), int(limit or 0), policy)

    def embed(self, sentences: list[str], batch_size: int = 32) -> None:
        self._embed.emit(list(sentences), batch_size, self._event("embed"))

    def query(self, text: str, k: int = 10) -> None:
        self._query.emit(text, k)

    def export(self, path: str) -> None:
        self._export.emit(path)

    def download(self, repo_id: str, filename: str = "") -> None:
        self._download.emit(repo_id, filename, self._event("download"))

    def search(self, query: str) -> None:
        self._search.emit(query)

    def list_repo(self, repo_id: str) -> None:
        self._list_repo.emit(repo_id)

    def cancel(self, kind: str) -> None:
        """Ask a running or queued job of ``kind`` to stop (generation stops within a token)."""
        ev = self._cancels.get(kind)
        if ev is not None:
            ev.set()

    def shutdown(self, timeout_ms: int = 20000) -> bool:
        """Cancel what is running, close the models and stop the thread, waiting at most
        ``timeout_ms``. A job that ignores its cancel is detached (see :func:`_detach`)
        rather than waited for; False then."""
        for ev in self._cancels.values():
            ev.set()
        if self.thread.isRunning():
            self._shutdown.emit()
            if not self.thread.wait(timeout_ms):
                log.warning("worker thread did not stop within %d ms; detached", timeout_ms)
                _detach(self.thread, self.worker)
                return False
        return True


_DETACHED: list[tuple[QThread, QObject]] = []


def _detach(thread: QThread, worker: QObject) -> None:
    """Let a still-running worker thread outlive its window. Qt aborts the process
    ("QThread: Destroyed while thread is still running") if a running QThread is deleted,
    and PySide deletes every object Python owns at exit; a QThread parented to the main
    thread's own QThread object is owned by Qt instead, is never deleted, and the OS ends
    the stuck job with the process."""
    thread.setParent(QThread.currentThread())
    _DETACHED.append((thread, worker))
