"""A remote engine: a model served by any OpenAI-compatible server (vLLM, a llama.cpp
server, Ollama, LM Studio, another Inferdesk), shaped like a local CausalLM or Encoder so
the app's chat, embedding and performance panes use it unchanged.

``load_model("http://host:port/v1#model-id", api_key=...)`` connects: the fragment names a
model from the server's ``/v1/models`` (it may be left out when the server has one). The
kind (chat or embeddings) is what an Inferdesk server reports; for other servers it is
chat unless the id says "embed" or ``kind="encoder"`` is given.

What the remote side cannot tell us is ``None``: the device memory in :meth:`memory` (the
performance pane says so instead of drawing it). Time to first token and tokens/s are
measured here from the stream, so they include the network. A connection lost
mid-stream ends the answer with what arrived and ``finish_reason="interrupted"``; a
stream that is not valid OpenAI chunks raises :class:`RemoteError`.

The server is not trusted to keep its word: a stream is cut after ``max_tokens`` text
chunks (a server that keeps sending would otherwise never end), and embeddings must be
finite numbers.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urldefrag, urlsplit

import numpy as np

from inference.backends.base import Backend, host_rss
from inference.errors import (
    BackendUnavailableError,
    CancelledError,
    InferdeskError,
    InvalidInputError,
    ModelNotFoundError,
)
from inference.events import DoneEvent, GenerationEvent, MemorySample
from inference.generate import Generation
from inference.store import ModelSpec
from inference.validate import GenerateArgs, Generates

SPARE_CHUNKS = 16  # chunks without text (role, finish, usage) read past max_tokens at most
TIMEOUT_S = 600.0  # one request, stream included; a token may take long on a busy server
CONNECT_S = 10.0  # opening the connection: a host that does not answer is an error soon


class RemoteError(InferdeskError):
    """The remote server answered with something that is not the OpenAI API."""


def is_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(("http://", "https://"))


class RemoteBackend(Backend):
    """Stands where a local backend would: a name, a device and a memory sample."""

    name = "remote"

    def __init__(self, url: str):
        self.device = f"OpenAI-compatible server at {url}"
        self.url = url

    def memory(self) -> MemorySample:
        # This process's RSS is real; the server's device memory is not ours to see.
        return MemorySample(device_used=None, device_total=None, device_peak=None,
                            host_rss=host_rss())


class _StatusError(Exception):
    """The server answered a request with an HTTP error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _http_error(e: BaseException, url: str) -> InferdeskError:
    """An HTTP status or transport failure as the one sentence the app shows."""
    import httpx2

    if isinstance(e, _StatusError):
        if e.status == 401:
            return InvalidInputError(f"{url} refused the API key: {e.message}")
        if e.status == 404:
            return ModelNotFoundError(f"{url}: {e.message}")
        return RemoteError(f"{url} answered {e.status}: {e.message}")
    if isinstance(e, httpx2.TransportError):
        return BackendUnavailableError(f"Cannot reach {url}: {e or type(e).__name__}.")
    return RemoteError(f"{url} sent something that is not the OpenAI API "
                       f"({type(e).__name__}: {e}).")


def _message(body: bytes) -> str:
    """The error message of an OpenAI error body ``{"error": {"message": ...}}``, else the
    body's first 200 characters."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error", data)
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if isinstance(inner.get(key), str) and inner[key]:
                    return inner[key]
    text = body.decode("utf-8", "replace").strip()
    return text[:200] or "no message"


class _Client:
    """The OpenAI API's four requests over HTTP: list models, completions (streamed as
    server-sent events), chat completions (the same) and embeddings."""

    def __init__(self, base: str, api_key: str | None, timeout: float):
        import httpx2

        self.http = httpx2.Client(
            base_url=base, headers={"Authorization": f"Bearer {api_key or 'none'}"},
            timeout=httpx2.Timeout(timeout, connect=min(timeout, CONNECT_S)))

    def get(self, path: str) -> Any:
        """The JSON body of GET ``path``, or None when the body is not JSON."""
        return _json_or_none(self._checked(self.http.get(path)))

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return _json_or_none(self._checked(self.http.post(path, json=body)))

    @contextmanager
    def events(self, path: str, body: dict[str, Any]) -> Iterator[Iterator[Any]]:
        """POST ``path`` and the JSON data of each server-sent event until ``[DONE]``; a
        data line that is not JSON raises ValueError."""
        headers = {"Accept": "text/event-stream"}
        with self.http.stream("POST", path, json=body, headers=headers) as r:
            if r.status_code >= 400:
                r.read()
            yield _sse_data(self._checked(r).iter_lines())

    @staticmethod
    def _checked(r: Any) -> Any:
        if r.status_code >= 400:
            raise _StatusError(r.status_code, _message(r.content))
        return r

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_or_none(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _sse_data(lines: Iterator[str]) -> Iterator[Any]:
    """Server-sent events' data fields (lines joined by newlines), parsed as JSON, up to
    the ``[DONE]`` event; comments and other fields are skipped."""
    data: list[str] = []
    for line in lines:
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)
            continue
        if not data:
            continue
        text, data = "\n".join(data), []
        if text.strip() == "[DONE]":
            return
        yield json.loads(text)
    if data and "\n".join(data).strip() != "[DONE]":
        yield json.loads("\n".join(data))


@dataclass
class _Conn:
    url: str
    model_id: str
    client: _Client


class _Remote:
    kind = "model"

    def __init__(self, conn: _Conn):
        self.conn = conn
        self.backend = RemoteBackend(conn.url)
        self.backend_reason = f"remote: {conn.model_id} on the OpenAI-compatible server {conn.url}"
        self.spec = ModelSpec(name=conn.model_id, path=conn.url, format="remote",  # type: ignore[arg-type]
                              architecture="remote", kind=self.kind, quant_types=[],
                              n_params=0, file_size=0, est_memory=0, source="remote")

    @property
    def name(self) -> str:
        return self.conn.model_id

    def memory(self) -> MemorySample:
        return self.backend.memory()

    def close(self) -> None:
        self.conn.client.close()


class RemoteLM(_Remote, Generates):
    kind = "causal"

    def _generate(self, a: GenerateArgs) -> Iterator[GenerationEvent]:
        """``profile`` is accepted and ignored: the server's op times are not ours to see."""
        if a.continue_final:
            raise InvalidInputError("A remote engine cannot continue a reply: the OpenAI API "
                                    "has no such request; regenerate it with more max tokens.")
        if a.prompt_ids is not None or a.ignore_eos:
            raise InvalidInputError("A remote engine takes text and ends where the server "
                                    "does: the OpenAI API has no prompt token ids and no "
                                    "ignore-eos.")
        prompt, messages, max_tokens, sp, stop = (a.prompt, a.messages, a.max_tokens,
                                                  a.sampling, a.stop)
        if sp.top_k or sp.min_p or sp.repetition_penalty != 1.0:
            # The OpenAI API has no such fields; say so rather than sample differently.
            raise InvalidInputError("A remote engine takes temperature, top-p and seed only; "
                                    "set top-k, min-p and repetition penalty to off.")
        args: dict[str, Any] = dict(model=self.conn.model_id, max_tokens=max_tokens,
                                    temperature=sp.temperature, top_p=sp.top_p, stream=True,
                                    stream_options={"include_usage": True})
        if sp.seed is not None:
            args["seed"] = sp.seed
        if stop:
            args["stop"] = list(stop)
        return self._stream(args, messages, prompt, max_tokens, a.cancel)

    def _stream(self, args: dict[str, Any], messages: Sequence[dict[str, str]] | None,
                prompt: str | None, max_tokens: int, cancel: threading.Event | None
                ) -> Iterator[GenerationEvent]:
        c, url = self.conn.client, self.conn.url
        # The server applies max_tokens and stop strings; chunks are counted as tokens
        # (servers send one per chunk), and more text than max_tokens ends the stream.
        gen = Generation(None, 0, sys.maxsize, set())
        chunks = 0
        if messages is not None:
            path, args = "/chat/completions", {"messages": list(messages), **args}
        else:
            path, args = "/completions", {"prompt": prompt, **args}
        reason = usage = None
        answering = False  # the server accepted the request and its stream began
        try:
            with c.events(path, args) as stream:
                answering = True
                for chunk in stream:
                    if cancel is not None and cancel.is_set():
                        reason = "cancelled"
                        break
                    chunks += 1
                    if chunks > max_tokens + SPARE_CHUNKS:
                        reason = "length"  # a server that never ends its stream
                        break
                    try:
                        text, finish, chunk_usage = _read_chunk(chunk, messages is not None)
                    except (AttributeError, IndexError, KeyError, TypeError) as e:
                        raise RemoteError(f"{url} sent a malformed stream chunk ({e}).") from None
                    usage = chunk_usage or usage
                    if text and gen.steps >= max_tokens:
                        reason = "length"  # text past max_tokens: the server ignored it
                        break
                    if text:  # servers stream one token per chunk: count chunks as tokens
                        yield from gen.push(-1, text)
                    reason = _FINISH.get(finish, reason) if finish else reason
        except InferdeskError:
            raise
        except ValueError as e:  # a data line that is not JSON
            raise RemoteError(f"{url} sent a malformed stream chunk ({e}).") from None
        except Exception as e:  # noqa: BLE001 - a status, or the transport failing
            if answering and _is_connection_loss(e):
                reason = "interrupted"  # the partial answer stands; the reason says why
            else:
                raise _http_error(e, url) from None
        for ev in gen.close(reason or "length", memory=self.memory()):
            if isinstance(ev, DoneEvent):
                ev.token_ids = []  # the server sends text, not ids
                if isinstance(usage, dict):  # exact counts when the server reports them
                    ev.n_prompt = int(usage.get("prompt_tokens") or 0)
                    ev.n_generated = int(usage.get("completion_tokens") or ev.n_generated)
            yield ev


_FINISH = {"stop": "stop", "length": "length", "eos": "eos"}


def _read_chunk(chunk: Any, chat: bool) -> tuple[str, str | None, Any]:
    """(text, finish reason, usage) of one chunk; a chunk not shaped like OpenAI's raises
    AttributeError, IndexError, KeyError or TypeError."""
    if isinstance(chunk, dict) and "error" in chunk:  # an error event mid-stream
        raise RemoteError(f"the server reported an error mid-stream: "
                          f"{_message(json.dumps(chunk).encode())}")
    usage = chunk.get("usage")
    choices = chunk["choices"]
    if not isinstance(choices, list):
        raise TypeError("'choices' is not a list")
    if not choices:
        return "", None, usage
    ch = choices[0]
    text = (ch["delta"].get("content") if chat else ch.get("text")) or ""
    if not isinstance(text, str):
        raise TypeError("content is not text")
    return text, ch.get("finish_reason"), usage


def _is_connection_loss(e: BaseException) -> bool:
    """The peer gone mid-body: httpx2 reports a RemoteProtocolError, ReadError or timeout."""
    import httpx2

    return isinstance(e, (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.ReadTimeout,
                          ConnectionError))


class RemoteEncoder(_Remote):
    kind = "encoder"

    def __init__(self, conn: _Conn):
        super().__init__(conn)
        self.dim = int(self._embed(["dimension probe"]).shape[1])

    def _embed(self, batch: list[str]) -> np.ndarray:
        try:
            r = self.conn.client.post("/embeddings", {"model": self.conn.model_id,
                                                      "input": batch,
                                                      "encoding_format": "float"})
            rows = sorted(r["data"], key=lambda d: d["index"])
            out = np.asarray([d["embedding"] for d in rows], dtype=np.float32)
        except InferdeskError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise RemoteError(f"{self.conn.url} sent malformed embeddings ({e}).") from None
        except Exception as e:  # noqa: BLE001 - a status, or the transport failing
            raise _http_error(e, self.conn.url) from None
        if out.ndim != 2 or out.shape[0] != len(batch):
            raise RemoteError(f"{self.conn.url} sent {out.shape[0]} embeddings for "
                              f"{len(batch)} inputs.")
        if not np.isfinite(out).all():
            raise RemoteError(f"{self.conn.url} sent embeddings that are not finite numbers "
                              "(NaN or infinity).")
        return out

    def embed(self, sentences: Sequence[str], batch_size: int = 32,
              progress: Callable[[int, int], None] | None = None,
              cancel: threading.Event | None = None) -> np.ndarray:
        if isinstance(sentences, str):
            raise InvalidInputError("embed() takes a list of sentences, not one string.")
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1.")
        parts = []
        for i in range(0, len(sentences), batch_size):
            if cancel is not None and cancel.is_set():
                raise CancelledError("Embedding was cancelled.")
            parts.append(self._embed(list(sentences[i: i + batch_size])))
            if progress is not None:
                progress(min(i + batch_size, len(sentences)), len(sentences))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)


@dataclass(frozen=True)
class RemoteModel:
    """One entry of a server's ``/v1/models``."""
    id: str
    kind: str  # "causal" | "encoder"


def _base_url(url: str) -> str:
    base = urldefrag(url)[0].rstrip("/")
    return base if urlsplit(base).path.endswith("/v1") else base + "/v1"


def _client(base: str, api_key: str | None, timeout: float) -> _Client:
    return _Client(base, api_key, timeout)


def _listed(client: _Client, base: str) -> list[RemoteModel]:
    """The models ``base`` serves, each with its kind: Inferdesk's ``kind`` field, else
    chat unless the id says "embed". The answer is checked here: a web page or any other
    JSON is not a list of models."""
    try:
        body = client.get("/models")
    except _StatusError as e:
        if e.status == 404:
            raise RemoteError(f"{base}/models does not exist: this is not an OpenAI-compatible "
                              "server (check the URL and its /v1).") from None
        raise _http_error(e, base) from None
    except Exception as e:  # noqa: BLE001 - the transport failing
        raise _http_error(e, base) from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not all(
            isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"] for m in data):
        raise RemoteError(f"{base}/models answered something that is not OpenAI's list of "
                          "models; is this an OpenAI-compatible server?")
    return [RemoteModel(m["id"], _kind(m)) for m in data]


def _kind(entry: dict) -> str:
    kind = entry.get("kind")
    if kind in ("causal", "encoder"):
        return kind
    return "encoder" if "embed" in entry["id"].lower() else "causal"


def list_models(url: str, api_key: str | None = None,
                timeout: float = CONNECT_S) -> list[RemoteModel]:
    """The models an OpenAI-compatible server lists at ``/v1/models``."""
    base = _base_url(url)
    with _client(base, api_key, timeout) as client:
        return _listed(client, base)


def connect(target: str, api_key: str | None = None, kind: str | None = None,
            timeout: float = TIMEOUT_S) -> RemoteLM | RemoteEncoder:
    """A model on an OpenAI-compatible server: ``http(s)://host:port[/v1][#model-id]``."""
    base, model_id = _base_url(target), urldefrag(target)[1]
    client = _client(base, api_key, timeout)
    try:
        listed = _listed(client, base)
    except BaseException:
        client.close()
        raise
    ids = [m.id for m in listed]
    if not model_id:
        if len(ids) != 1:
            client.close()
            raise InvalidInputError(f"{base} serves {len(ids)} models; name one after '#': "
                                    f"{', '.join(ids) or '(none)'}.")
        model_id = ids[0]
    entry = next((m for m in listed if m.id == model_id), None)
    if entry is None:
        client.close()
        raise ModelNotFoundError(f"{base} has no model '{model_id}'; it has: "
                                 f"{', '.join(ids) or '(none)'}.")
    conn = _Conn(base, model_id, client)
    try:
        return RemoteEncoder(conn) if (kind or entry.kind) == "encoder" else RemoteLM(conn)
    except BaseException:
        client.close()
        raise
