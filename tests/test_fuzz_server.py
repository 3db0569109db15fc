"""Schema-driven fuzzing of `inferdesk serve`: Schemathesis draws requests from the app's
own OpenAPI document, valid ones (positive) and ones that break it (negative), for every
endpoint, and each goes over HTTP to a real server on 127.0.0.1. Whatever is sent, the
answer is never a 5xx and every worker stays up (/health).

The default suite sends a few dozen; the long run (``long`` marker, or this file run as a
script: ``python -m tests.test_fuzz_server --requests 10000 --out run.json``) sends at
least 10^4 to a server in its own process and also records its memory (RSS) when warm,
at its peak and after the run, idle (docs/fuzz.md).

Traffic is bounded: chat and completion requests are given ``max_tokens`` of at most
``MAX_TOKENS`` (a valid request without it would generate to the end of the context),
and three requests in four name a model the server has (a random name is a 404 before
anything else is checked).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.server_support import engine, server  # noqa: F401

MAX_TOKENS = 4
TIMEOUT_S = 120.0  # one request; a hung server fails the run, not the test runner


def openapi_document(engine: Any) -> dict[str, Any]:  # noqa: F811
    from inference.server.app import create_app

    return create_app(engine).openapi()


def _adjust(case: Any, models: dict[str, str], pick: int) -> None:
    """Keep the traffic bounded and make most requests reach the engine (docstring);
    ``models``: the served model of each kind, "causal" and "encoder"."""
    body = case.body
    if not isinstance(body, dict):
        return
    if "model" in body and pick % 4 != 3:
        body["model"] = models["encoder" if case.path.endswith("/embeddings") else "causal"]
    if case.path.endswith(("/chat/completions", "/completions")):
        for key in ("max_tokens", "max_completion_tokens"):
            v = body.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > MAX_TOKENS:
                body[key] = MAX_TOKENS
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_TOKENS


def fuzz(base: str, doc: dict[str, Any], models: dict[str, str],
         per_operation: int | tuple[int, int], seed: int = 0, rss: Any = None,
         health_every: int = 100, progress: Any = None) -> dict[str, Any]:
    """Send ``per_operation`` drawn requests per endpoint and mode (one count, or one for
    valid requests and one for invalid ones: the invalid are cheaper) to
    the server at ``base`` (its origin, no /v1); a summary of what came back. ``rss()``,
    if given, reads the server's resident memory (sampled with each /health);
    ``progress(summary)`` is called with the summary so far at each /health."""
    import httpx2 as httpx
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_dict(doc)
    statuses: collections.Counter[str] = collections.Counter()
    errors: list[dict[str, Any]] = []
    unhealthy: list[dict[str, Any]] = []
    peak = [rss() if rss else 0]
    sent = [0]
    client = httpx.Client(base_url=base, timeout=TIMEOUT_S)

    def check_health() -> None:
        h = client.get("/health")
        statuses[f"GET /health {h.status_code}"] += 1
        sent[0] += 1
        if h.status_code != 200 or h.json().get("status") != "ok":
            unhealthy.append({"after": sent[0], "status": h.status_code, "body": h.text[:500]})
        if rss:
            peak[0] = max(peak[0], rss())

    def send(case: Any) -> None:
        _adjust(case, models, sent[0])
        kw = case.as_transport_kwargs(base_url=base)
        try:
            r = client.request(kw["method"], kw["url"], headers=kw.get("headers"),
                               params=kw.get("params"), content=_content(kw))
            status = r.status_code
        except httpx.TimeoutException:
            status, r = 0, None
        sent[0] += 1
        statuses[f"{case.method.upper()} {case.path} {status}"] += 1
        if status == 0 or status >= 500:
            errors.append({"request": {k: v for k, v in kw.items() if k != "headers"},
                           "status": status, "body": r.text[:1000] if r is not None else ""})
        if sent[0] % health_every == 0:
            check_health()
            if progress is not None:
                progress(summary())

    t0 = time.monotonic()
    counts = per_operation if isinstance(per_operation, tuple) else (per_operation,) * 2

    def summary() -> dict[str, Any]:
        return {"requests": sent[0], "seconds": round(time.monotonic() - t0, 1),
                "statuses": dict(sorted(statuses.items())), "server_errors": errors,
                "unhealthy": unhealthy, "rss_peak": peak[0]}

    check_health()
    for op in schema.get_all_operations():
        op = op.ok()
        for mode, n in zip((GenerationMode.POSITIVE, GenerationMode.NEGATIVE), counts,
                           strict=True):
            @hseed(seed)
            @settings(max_examples=n, database=None, deadline=None,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                send(case)

            try:
                run()
            except Exception as e:  # noqa: BLE001 - a mode the schema cannot violate
                statuses[f"{op.method.upper()} {op.path} not generated ({mode.value}): "
                         f"{type(e).__name__}"] += 1
    check_health()
    client.close()
    return summary()


def _content(kw: dict[str, Any]) -> bytes | None:
    if "json" in kw:
        return json.dumps(kw["json"]).encode()
    data = kw.get("data")
    return data.encode() if isinstance(data, str) else data


def test_fuzz_every_endpoint(engine, server):  # noqa: F811
    """A few requests per endpoint and mode: no 5xx, every worker up."""
    doc = openapi_document(engine)
    models = {"causal": engine.llm.name, "encoder": engine.encoder.name}
    out = fuzz(server.url.removesuffix("/v1"), doc, models, per_operation=3, seed=1)
    assert not out["server_errors"], out["server_errors"][:3]
    assert not out["unhealthy"], out["unhealthy"]
    assert out["requests"] >= 20


def _rss_reader(pid: int) -> Any:
    import psutil

    proc = psutil.Process(pid)
    return lambda: proc.memory_info().rss


def long_run(per_operation: int | tuple[int, int], seed: int = 0, idle_s: float = 5.0,
             progress: Any = None) -> dict[str, Any]:
    """A fresh `inferdesk serve` (smollm2 and minilm on cpu, 127.0.0.1) in its own process:
    warm-up, then the fuzz run, then its RSS after ``idle_s`` idle seconds.
    ``progress(summary)``: as :func:`fuzz`, with the warm figures."""
    import httpx2 as httpx

    proc = subprocess.Popen([sys.executable, "-m", "inference.cli", "serve", "--model",
                             "smollm2", "--embed-model", "minilm", "--backend", "cpu",
                             "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        # Its access log goes on: read it, or a full pipe stops the server's event loop.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        base = line.split(" at ")[-1].strip().removesuffix("/v1")
        rss = _rss_reader(proc.pid)
        with httpx.Client(base_url=base, timeout=TIMEOUT_S) as c:
            models = {m["kind"]: m["id"] for m in c.get("/v1/models").json()["data"]}
        from inference.server.app import Engine, create_app

        class _Named:  # the document only needs the routes: a stand-in encoder
            name, kind, dim = "stand-in", "encoder", 1

        stand_in = Engine(None, _Named())
        doc = create_app(stand_in).openapi()
        stand_in.close()
        warm_up = fuzz(base, doc, models, per_operation=20, seed=seed + 1)
        time.sleep(idle_s)
        warm = rss()
        head = {"rss_warm": warm, "warm_up_requests": warm_up["requests"],
                "warm_up_server_errors": warm_up["server_errors"]}
        out = fuzz(base, doc, models, per_operation=per_operation, seed=seed, rss=rss,
                   progress=progress and (lambda s: progress({**s, **head})))
        time.sleep(idle_s)
        after = rss()
        out.update(warm_up_requests=warm_up["requests"],
                   warm_up_server_errors=warm_up["server_errors"], rss_warm=warm,
                   rss_after=after, rss_after_over_warm=round(after / warm, 3),
                   alive=proc.poll() is None, per_operation=per_operation, seed=seed)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.long
def test_fuzz_long_run():
    out = long_run(per_operation=(800, 2600))
    assert out["requests"] >= 10_000
    assert not out["server_errors"] and not out["warm_up_server_errors"]
    assert not out["unhealthy"] and out["alive"]
    assert out["rss_after"] <= 1.2 * out["rss_warm"]


def main(argv: list[str] | None = None) -> int:
    import platform

    p = argparse.ArgumentParser(description="The long server fuzz run; JSON to --out.")
    p.add_argument("--valid", type=int, default=800, help="valid requests per endpoint")
    p.add_argument("--invalid", type=int, default=2600, help="invalid requests per endpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    info = {"commit": commit, "python": platform.python_version(),
            "command": "python -m tests.test_fuzz_server " + " ".join(argv or sys.argv[1:])}

    def write(out: dict[str, Any]) -> None:
        with open(a.out, "w") as f:
            json.dump({**out, **info}, f, indent=1)

    out = long_run((a.valid, a.invalid), a.seed,
                   progress=lambda s: write({**s, "finished": False}))
    out["finished"] = True
    write(out)
    print(json.dumps({k: v for k, v in out.items() if k != "statuses"}, indent=1)[:3000])
    ok = (not out["server_errors"] and not out["unhealthy"] and out["alive"]
          and out["rss_after"] <= 1.2 * out["rss_warm"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
