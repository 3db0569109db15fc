"""`inferdesk bench --serve`: the server under 1, 4 and 8 concurrent streams.

Each stream is the same greedy completion of the bench prompt; a round starts all its
streams together. A "token" is a streamed chunk with text (one per token on both servers).
The streams read the SSE lines through the standard library's ``http.client`` and
``json.loads`` (as vLLM's serving benchmark reads them raw): on a 2-core machine the
clients share the cores with the server, and the `openai` client's parsing (0.62-1.6 ms
of CPU a token, against 0.08-0.10 here; docs/server.md) came out of the server's steps.
Before each stream count's timed round an untimed one (``WARM_TOKENS`` each) pays what a
server does once in its life: compiling, first-touch allocations, checking a captured
step of each batch size. (Not all of them first: llama-cpp-python's server, once it has
queued 8 requests, ran every later stream at ~35 ms a token against ~11 before.)
Reported per stream count:

- ``aggregate_tok_s``: all streams' tokens over the round's wall time (from the start of
  the round to the last stream's end: prefill, queueing and HTTP included);
- ``decode_tok_s``: the aggregate decode rate, the tokens after each stream's first over
  the time from the round's earliest first token to its latest last token (so a stream
  still prefilling while others decode counts against it, and time to first token does
  not count at all);
- ``ttft_p50_ms``: the median over the streams of the time from a stream's request to its
  first token;
- ``itl_p50_ms``/``itl_p99_ms``: percentiles of the gaps between consecutive tokens of a
  stream, over all streams' gaps (inter-token latency).

Every round sends the same prompt, so a server that keeps prompt prefixes across requests
(both do: Inferdesk's prompt cache, llama-cpp-python's reuse of its last prompt) prefills
only what it does not hold. With ``--compare`` and llama-cpp-python's server installed,
the same requests go to it (same model file, same thread count) in a subprocess.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

STREAMS = (1, 4, 8)
# Appended to the bench prompt: a numbered list that greedy decoding on SmolLM2 keeps
# going past 128 tokens on both engines (the bare prompt ends with EOS after ~21 tokens on
# llama.cpp), so both sides time the same number of tokens. A side that stops early
# anyway is flagged in its row ("short": fewer text chunks than streams x max_tokens).
CONTINUATION = "\n\nHis entries, numbered from the first day: 1, 2, 3, 4, 5,"


WARM_TOKENS = 8  # per stream of each untimed round


def _stream_times(url: str, model: str, prompt: str, max_tokens: int) -> list[float]:
    """One streamed completion: the arrival time of each chunk with text."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=900)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    try:
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as httpx does
        conn.request("POST", f"{parts.path}/completions", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"the server answered {r.status}: {r.read()[:200]!r}")
        times = []
        for line in r:  # SSE: one "data: {json}" line per chunk
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:]).get("choices")
                if choices and choices[0].get("text"):
                    times.append(time.perf_counter())
        return times
    finally:
        conn.close()


def decode_rate(streams: list[list[float]]) -> float | None:
    """Tokens after each stream's first, per second from the earliest first token to the
    latest last one (``streams``: each stream's token times); None without such tokens."""
    timed = [t for t in streams if len(t) > 1]
    if not timed:
        return None
    span = max(t[-1] for t in timed) - min(t[0] for t in timed)
    return round(sum(len(t) - 1 for t in timed) / span, 2) if span > 0 else None


def measure(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    rows = {}
    for n in STREAMS:
        _round(url, model, prompt, WARM_TOKENS, n)  # untimed: first-use costs (docstring)
        results, starts, wall = _round(url, model, prompt, max_tokens, n)
        gaps = np.concatenate([np.diff(r) for r in results if len(r) > 1] or [np.zeros(0)])
        tokens = sum(len(r) for r in results)
        ttft = [r[0] - s for r, s in zip(results, starts, strict=True) if r]
        rows[str(n)] = {
            "aggregate_tok_s": round(tokens / wall, 2), "tokens": tokens,
            "short": tokens < n * max_tokens,
            "wall_s": round(wall, 3),
            "decode_tok_s": decode_rate(results),
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)) * 1e3, 2) if ttft else None,
            "itl_p50_ms": round(float(np.percentile(gaps, 50)) * 1e3, 2) if gaps.size else None,
            "itl_p99_ms": round(float(np.percentile(gaps, 99)) * 1e3, 2) if gaps.size else None,
        }
    one_stream = rows["1"]["aggregate_tok_s"] or 1.0
    for n in STREAMS[1:]:
        rows[str(n)]["speedup_vs_1"] = round(rows[str(n)]["aggregate_tok_s"] / one_stream, 2)
    return rows


def _round(url: str, model: str, prompt: str, max_tokens: int, n: int,
           stream: Callable[[str, str, str, int], list[float]] | None = None
           ) -> tuple[list[list[float]], list[float], float]:
    """``n`` streams started together: each one's token times, its start, the round's wall
    time. ``stream``: how one stream is read (default :func:`_stream_times`)."""
    stream = stream or _stream_times
    results: list[list[float]] = [[] for _ in range(n)]
    starts = [0.0] * n
    barrier = threading.Barrier(n + 1)

    def one(i: int) -> None:
        barrier.wait()
        starts[i] = time.perf_counter()
        results[i] = stream(url, model, prompt, max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return results, starts, time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(argv: list[str], port: int) -> Iterator[tuple[str, str]]:
    """A server started as ``argv`` in a process of its own, listening on loopback ``port``:
    its base URL and the first model it lists, once it answers. Its output goes to a file
    (a pipe nobody reads would block a chatty server once full)."""
    import tempfile

    import httpx2 as httpx

    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            for _ in range(3000):  # loading and compiling can take minutes on a cold cache
                if proc.poll() is not None:
                    log.seek(0)
                    err = log.read().decode(errors="replace").strip().splitlines()
                    raise RuntimeError(f"{argv[2]} exited: {err[-1] if err else proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    r = httpx.get(f"{url}/models", timeout=1)
                    if r.status_code == 200:
                        yield url, r.json()["data"][0]["id"]
                        return
                time.sleep(0.2)
            raise RuntimeError(f"{argv[2]} did not answer on port {port}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _inferdesk_argv(path: str, backend: str, threads: int, port: int,
                    kv_dtype: str | None = None) -> list[str]:
    return [sys.executable, "-m", "inference.cli", "serve", "--model", path,
            "--backend", backend, "--threads", str(threads), "--port", str(port),
            "--parallel", str(max(STREAMS)), *(["--kv-dtype", kv_dtype] if kv_dtype else [])]


def _llama_cpp_argv(path: str, threads: int, port: int) -> list[str] | None:
    """llama-cpp-python's OpenAI server, or None if it is not installed."""
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "llama_cpp.server", "--model", path, "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", str(threads), "--n_ctx", "2048",
            # By default a new request interrupts the running one (its stream just ends);
            # queued, each completes. It runs one request at a time either way.
            "--interrupt_requests", "False"]


def bench_serve(args: Any, out: dict[str, Any]) -> None:
    """Each side is a server process of its own, at the same thread count, and the streams
    are clients in this process: neither server shares its interpreter with the clients."""
    from inference.bench.workloads import workloads
    from inference.store import resolve

    prompt = workloads()[0] + CONTINUATION
    path = str(resolve(args.llm_model).path)
    out["serve_mode"] = "one server process per side; clients in the bench process"
    port = _free_port()
    argv = _inferdesk_argv(path, args.backend, args.threads, port, args.kv_dtype)
    with _server(argv, port) as (url, name):
        # One untimed request per side: JIT compilation, first-touch allocations.
        _stream_times(url, name, prompt, 4)
        out["serve"] = {"inferdesk": measure(url, name, prompt, args.decode_tokens)}
    if args.compare:
        port = _free_port()
        argv = _llama_cpp_argv(path, args.threads, port)
        if argv is None:
            out["serve"]["llama-cpp-python"] = "not installed"
            return
        with _server(argv, port) as (url, name):
            _stream_times(url, name, prompt, 4)
            out["serve"]["llama-cpp-python"] = measure(url, name, prompt, args.decode_tokens)
