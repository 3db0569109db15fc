"""The ASGI app: OpenAI's /v1 endpoints over an :class:`Engine` (loaded models, the chat
scheduler and the embedding batcher)."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inference.events import DoneEvent, TokenEvent
from inference.sampling import SamplingParams
from inference.server import errors
from inference.server.embed_batcher import EmbedBatcher
from inference.server.errors import APIError
from inference.server.prefix_pool import PROMPT_CACHE_IDLE, PROMPT_CACHE_MB
from inference.server.scheduler import Outbox, Scheduler, TokenLogprobs, emit_each
from inference.server.scheduler import Request as SeqRequest
from inference.server.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    rng_seed,
)

MAX_BODY_BYTES = 4 << 20  # a request body past this is refused with 413
MAX_EMBED_INPUTS = 2048  # as OpenAI
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
# Threads that tokenize prompts, render chat templates and build embedding replies, so a
# long prompt keeps neither /health nor other clients waiting on the event loop.
PREP_THREADS = 2
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
T = TypeVar("T")


class Engine:
    """What the server serves: a causal model and/or an encoder, each under its name and
    the aliases it was asked for by, plus the threads that batch their work."""

    def __init__(self, llm: Any = None, encoder: Any = None, parallel: int = 4,
                 max_waiting: int = 16, aliases: dict[str, str] | None = None,
                 prompt_cache_mb: int = PROMPT_CACHE_MB,
                 prompt_cache_idle: float = PROMPT_CACHE_IDLE,
                 locks: dict[str, Any] | None = None):
        # locks: {"causal"|"encoder": lock} held per forward pass, for models an app shares.
        locks = locks or {}
        if llm is None and encoder is None:
            raise APIError(400, "The server needs a model or an embedding model.")
        self.llm, self.encoder = llm, encoder
        self.created = int(time.time())
        self.scheduler = (Scheduler(llm, parallel, max_waiting,
                                    prompt_cache_bytes=prompt_cache_mb << 20,
                                    prompt_cache_idle=prompt_cache_idle, deliver=_deliver,
                                    step_lock=locks.get("causal"))
                          if llm is not None else None)
        self.embedder = (EmbedBatcher(encoder, lock=locks.get("encoder"))
                         if encoder is not None else None)
        self.aliases = dict(aliases or {})
        self.prep = ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="inferdesk-prep")
        ready = threading.Barrier(PREP_THREADS)  # all threads now: a fixed count under load
        for _ in range(PREP_THREADS):
            self.prep.submit(ready.wait, 30)

    def fault(self) -> str | None:
        """Why a worker cannot take requests (a stopped thread), or None: all can."""
        for part in (self.scheduler, self.embedder):
            why = part.fault() if part is not None else None
            if why is not None:
                return why
        return None

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a preparation thread (CPU-bound work: tokenizing, rendering)."""
        return await asyncio.get_running_loop().run_in_executor(self.prep, fn, *args)

    def models(self) -> list[Any]:
        return [m for m in (self.llm, self.encoder) if m is not None]

    def find(self, name: str, kind: str) -> Any:
        name = self.aliases.get(name, name)
        model = next((m for m in self.models() if m.name == name), None)
        if model is None:
            have = ", ".join(m.name for m in self.models())
            raise APIError(404, f"The model '{name}' does not exist here; this server has: "
                                f"{have}.", code="model_not_found", param="model")
        if model.kind != kind:
            what = "an embedding model" if model.kind == "encoder" else "a chat model"
            raise APIError(400, f"'{name}' is {what}; use the matching endpoint.",
                           param="model")
        return model

    def close(self) -> None:
        for part in (self.scheduler, self.embedder):
            if part is not None:
                part.close()
        self.prep.shutdown(wait=False, cancel_futures=True)


def _deliver(outbox: Outbox) -> None:
    """The scheduler's hand-off of one step's events (on its thread): one
    ``call_soon_threadsafe`` per event loop (a server has one), which puts every event on
    its stream's queue in the step's order. One wake-up of the loop per step instead of one
    per token per stream: each is a write to the loop's self-pipe and a GIL hand-off
    between the scheduler thread and the loop."""
    by_loop: dict[Any, Outbox] = {}
    for item in outbox:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, items in by_loop.items():
        if loop is None:  # not a _Stream's request: its emit takes events on any thread
            emit_each(items)
            continue
        try:
            loop.call_soon_threadsafe(emit_each, items)
        except RuntimeError:  # the loop is gone (server stopped): nobody is listening
            for req, _, _ in items:
                req.cancel.set()


class _Stream:
    """One generation's events, carried from the scheduler thread to the event loop
    (:func:`_deliver`; ``req.emit`` runs on the loop)."""

    def __init__(self, scheduler: Scheduler, ids: list[int], max_tokens: int,
                 sampling: SamplingParams, stop: list[str], top_logprobs: int | None):
        self._queue: asyncio.Queue[tuple[Any, TokenLogprobs | None]] = asyncio.Queue()
        self.req = SeqRequest(ids, max_tokens, sampling, self._emit, stop, top_logprobs,
                              loop=asyncio.get_running_loop())
        scheduler.submit(self.req)

    def _emit(self, item: Any, lp: TokenLogprobs | None) -> None:
        self._queue.put_nowait((item, lp))

    async def events(self) -> AsyncIterator[tuple[TokenEvent | DoneEvent, TokenLogprobs | None]]:
        """Until the DoneEvent. Leaving early (a client gone) cancels the generation: the
        scheduler drops it before its next step."""
        try:
            while True:
                item, lp = await self._queue.get()
                if isinstance(item, BaseException):
                    raise errors.from_engine(item)
                yield item, lp
                if isinstance(item, DoneEvent):
                    return
        finally:
            self.req.cancel.set()


async def _watch_disconnect(request: Request, cancel: threading.Event | Any,
                            on_leave: Callable[[], None] | None = None) -> None:
    while not cancel.is_set():
        if await request.is_disconnected():
            (on_leave or cancel.set)()
            return
        await asyncio.sleep(0.1)


class _Watch:
    """``async with _Watch(request, cancel)``: ``cancel`` is set if the client hangs up
    or the handler is cancelled (a server shutting down) before the block ends."""

    def __init__(self, request: Request, cancel: threading.Event,
                 on_leave: Callable[[], None] | None = None):
        self.cancel, self.on_leave = cancel, on_leave or cancel.set
        self.task = asyncio.create_task(_watch_disconnect(request, cancel, self.on_leave))

    async def __aenter__(self) -> _Watch:
        return self

    async def __aexit__(self, kind: Any, *_: Any) -> None:
        self.task.cancel()
        if kind is not None:  # the request failed or was cancelled: its work is not wanted
            self.on_leave()


async def _collect(request: Request, stream: _Stream) -> list[tuple[Any, Any]]:
    """A whole generation; a client that hangs up cancels it."""
    async with _Watch(request, stream.req.cancel):
        return [x async for x in stream.events()]


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _usage(done: DoneEvent) -> dict[str, int]:
    return {"prompt_tokens": done.n_prompt, "completion_tokens": done.n_generated,
            "total_tokens": done.n_prompt + done.n_generated}


@dataclass
class _Job:
    kind: str  # "chat" | "text"
    model: Any
    body: Any
    stream: _Stream
    id: str
    created: int


def _token_entry(tok: Any, tid: int, lp: float) -> dict[str, Any]:
    text = tok.decode([tid])
    return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}


def _chat_logprobs(model: Any, lps: list[TokenLogprobs]) -> dict[str, Any]:
    tok = model.tokenizer
    return {"content": [
        {**_token_entry(tok, lp.token_id, lp.logprob),
         "top_logprobs": [_token_entry(tok, t, v) for t, v in lp.top]} for lp in lps]}


def _text_logprobs(model: Any, lps: list[TokenLogprobs], offset: int = 0) -> dict[str, Any]:
    tok = model.tokenizer
    tokens = [tok.decode([lp.token_id]) for lp in lps]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{tok.decode([t]): v for t, v in lp.top} for lp in lps],
            "text_offset": offsets}


def _choice(job: _Job, text: str, lps: list[TokenLogprobs] | None, finish: str | None,
            delta: bool) -> dict[str, Any]:
    if job.kind == "chat":
        c: dict[str, Any] = {"index": 0}
        if delta:
            c["delta"] = {"content": text} if text else {}
        else:
            c["message"] = {"role": "assistant", "content": text}
        c["logprobs"] = _chat_logprobs(job.model, lps) if lps else None
    else:
        c = {"index": 0, "text": text,
             "logprobs": _text_logprobs(job.model, lps) if lps else None}
    c["finish_reason"] = finish
    return c


def _envelope(job: _Job, chunk: bool) -> dict[str, Any]:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if job.kind == "chat" \
        else "text_completion"
    return {"id": job.id, "object": obj, "created": job.created, "model": job.model.name}


async def _respond(request: Request, job: _Job) -> Any:
    want_lp = job.stream.req.top_logprobs is not None
    if not job.body.stream:
        items = await _collect(request, job.stream)
        done = items[-1][0]
        lps = [lp for _, lp in items if lp is not None] if want_lp else None
        return {**_envelope(job, False),
                "choices": [_choice(job, done.text, lps, FINISH[done.finish_reason], False)],
                "usage": _usage(done)}
    usage = bool(job.body.stream_options and job.body.stream_options.include_usage)

    async def sse() -> AsyncIterator[str]:
        head = _envelope(job, True)
        try:
            if job.kind == "chat":
                first = _choice(job, "", None, None, True)
                first["delta"] = {"role": "assistant", "content": ""}
                yield _sse({**head, "choices": [first]})
            async for ev, lp in job.stream.events():
                if isinstance(ev, TokenEvent):
                    if ev.text or lp is not None:
                        choice = _choice(job, ev.text, [lp] if lp else None, None, True)
                        yield _sse({**head, "choices": [choice]})
                    continue
                yield _sse({**head, "choices": [
                    _choice(job, "", None, FINISH[ev.finish_reason], True)]})
                if usage:
                    yield _sse({**head, "choices": [], "usage": _usage(ev)})
        except APIError as e:
            yield _sse(e.body())
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


class _BodyLimit:
    """ASGI middleware: refuses bodies over ``limit`` bytes with 413 (declared or sent),
    and reports each request to ``log`` (method, path, status, seconds)."""

    def __init__(self, app: Any, limit: int, log: Callable[[dict[str, Any]], None] | None):
        self.app, self.limit, self.log = app, limit, log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [0]

        async def send_status(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        headers = dict(scope["headers"])
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        too_large = APIError(413, f"The request body is over {self.limit} bytes.",
                             code="request_too_large")
        try:
            if declared > self.limit:
                await too_large.response()(scope, receive, send_status)
                return
            if b"content-length" not in headers and scope["method"] in ("POST", "PUT"):
                # A chunked body: read it here (up to the limit) and replay it.
                chunks, more = [], True
                while more:
                    msg = await receive()
                    if msg["type"] != "http.request":
                        return
                    chunks.append(msg.get("body", b""))
                    more = msg.get("more_body", False)
                    if sum(map(len, chunks)) > self.limit:
                        await too_large.response()(scope, receive, send_status)
                        return
                replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

                async def replayed() -> Any:
                    return replay.pop() if replay else await receive()

                await self.app(scope, replayed, send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:
            if self.log is not None:
                self.log({"method": scope["method"], "path": scope["path"],
                          "status": status[0], "seconds": time.perf_counter() - t0})


def host_names(hosts: Collection[str], port: int) -> frozenset[str]:
    """The ``Host`` header values a server on ``port`` accepts for the host names
    ``hosts`` (each with and without the port; an IPv6 address in brackets)."""
    out: set[str] = set()
    for h in hosts:
        h = h.strip().lower()
        if ":" in h and not h.startswith("["):
            h = f"[{h}]"
        out |= {h, f"{h}:{port}"}
    return frozenset(out)


class _HostCheck:
    """ASGI middleware: a request whose ``Host`` header is not in ``allowed`` is refused
    (a web page that rebinds its own name to 127.0.0.1 still sends its own name, so it
    cannot read a keyless loopback server). A request without the header (HTTP/1.0,
    sent by no browser) passes."""

    def __init__(self, app: Any, allowed: frozenset[str]):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host")
            if host is not None and host.decode("latin-1").lower() not in self.allowed:
                shown = host.decode("latin-1")[:100]
                await APIError(
                    400, f"The Host header '{shown}' is not one this server answers to; "
                         "use its loopback address (or start it with --allowed-hosts).",
                    code="invalid_host").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: Engine, api_key: str | None = None,
               log: Callable[[dict[str, Any]], None] | None = None,
               max_body_bytes: int = MAX_BODY_BYTES,
               allowed_hosts: frozenset[str] | None = None) -> FastAPI:
    """The server's ASGI app. With ``api_key`` every /v1 request needs
    ``Authorization: Bearer <api_key>``; ``log`` receives one dict per request;
    ``allowed_hosts`` (None: any) the ``Host`` header values answered (:func:`host_names`)."""

    def key_ok(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return api_key is None or hmac.compare_digest(
            given.encode("utf-8", "surrogateescape"), f"Bearer {api_key}".encode())

    async def authorize(request: Request) -> None:
        if not key_ok(request):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer "
                                "<key>'.", code="invalid_api_key")

    app = FastAPI(title="Inferdesk", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine
    errors.install(app)
    app.add_middleware(_BodyLimit, limit=max_body_bytes, log=log)
    if allowed_hosts is not None:
        app.add_middleware(_HostCheck, allowed=allowed_hosts)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    @app.get("/health")
    async def health(request: Request) -> Any:
        """200 and "ok" while every worker takes requests; 503 and the reason when one has
        stopped. The models are listed to those who may use them (the key, if set)."""
        running, waiting = engine.scheduler.load() if engine.scheduler else (0, 0)
        fault = engine.fault()
        body: dict[str, Any] = {"status": "ok" if fault is None else "unhealthy",
                                "running": running, "waiting": waiting}
        if key_ok(request):
            body["models"] = [m.name for m in engine.models()]
        if fault is not None:
            body["error"] = fault
            return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
        return body

    @v1.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": m.name, "object": "model", "created": engine.created, "owned_by": "inferdesk",
             "kind": m.kind} for m in engine.models()]}

    async def start(request: Request, kind: str, model: Any, body: Any, **plan: Any) -> _Job:
        body.check()
        stops = body.stops()
        fault = engine.scheduler.fault()
        if fault is not None:
            raise APIError(503, fault, "server_error", "worker_stopped")
        limit = body.limit() if kind == "chat" else body.max_tokens
        cancel = threading.Event()
        async with _Watch(request, cancel):  # tokenizing a long prompt stops if it leaves
            ids, max_tokens = await engine.off_loop(
                lambda: model.plan(max_tokens=limit or model.context_length, cancel=cancel,
                                   **plan))
        if kind == "chat":
            top = (body.top_logprobs or 0) if body.logprobs else None
        else:
            top = body.logprobs
        sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p,
                                  seed=rng_seed(body.seed))
        stream = _Stream(engine.scheduler, ids, max_tokens, sampling, stops, top)
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        return _Job(kind, model, body, stream, prefix + uuid.uuid4().hex, int(time.time()))

    @v1.post("/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        model = engine.find(body.model, "causal")
        job = await start(request, "chat", model, body, messages=body.turns())
        return await _respond(request, job)

    @v1.post("/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        model = engine.find(body.model, "causal")
        job = await start(request, "text", model, body, prompt=body.text())
        return await _respond(request, job)

    @v1.post("/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        model = engine.find(body.model, "encoder")
        body.check()
        texts = body.texts()
        if len(texts) > MAX_EMBED_INPUTS:
            raise APIError(400, f"At most {MAX_EMBED_INPUTS} inputs per request.",
                           param="input")
        if body.dimensions is not None and body.dimensions != model.dim:
            raise APIError(400, f"{model.name} makes {model.dim}-dimensional embeddings and "
                                "cannot shorten them; omit 'dimensions'.", param="dimensions")
        n_tokens = await engine.off_loop(lambda: sum(len(model.tokenize(t)) for t in texts))
        job = engine.embedder.submit(texts)
        async with _Watch(request, job.cancel, job.abandon):
            try:
                vecs = await asyncio.wrap_future(job.future)
            except asyncio.CancelledError:
                if job.future.cancelled():  # abandoned before it ran: nobody to answer
                    raise APIError(499, "The client went away.") from None
                raise

        def reply() -> JSONResponse:
            data = [{"object": "embedding", "index": i, "embedding": (
                base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
                if body.encoding_format == "base64" else v.tolist())}
                for i, v in enumerate(vecs)]
            return JSONResponse({"object": "list", "data": data, "model": model.name,
                                 "usage": {"prompt_tokens": n_tokens,
                                           "total_tokens": n_tokens}})

        return await engine.off_loop(reply)

    app.include_router(v1)
    return app
