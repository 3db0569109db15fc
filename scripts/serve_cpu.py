"""CPU seconds per streamed token of `inferdesk serve` (cpu backend) and of its clients:
the server in a process of its own (this script as a child, serving as `inferdesk serve
--model smollm2 --backend cpu --parallel 8` does), N streams in this one (as
`bench --serve`). For each round: the server's CPU split by thread (/proc/<pid>/task)
and this process's CPU, each over the round's streamed tokens; the gaps between a
stream's tokens (``gap_summary``); the server's garbage collections by generation
(count, time, the longest; timed with ``gc.callbacks``).

Threads: the event loop is the main thread (tid == pid); the Python threads (the
scheduler, the kernels' helper ``cpu-share-0``) are named from ``py-spy dump``; "other
threads" are the rest (numba's native workers). CPU time is less noisy than wall time on
a shared machine (it does not count the time another process held the core), except
that the kernels' threads spin while they wait for each other, so with 2 threads the
server's CPU is about 2 x its wall time whatever the work.
With ``--pyspy`` the last round is also sampled (200 Hz, raw stacks by thread) and the
samples are counted by where they are (``pyspy_samples``): the scheduler thread in the
decode step, in prefill, or outside both (sampling, detokenizing, handing events on, and
waiting for the GIL there), the event loop at work or in ``select``.

``--fake-step``: the server's decode step runs no model: it sums a 64 MB buffer (a few
ms on one core, GIL released, evicting the caches as streaming the weights does) and
returns fixed logits choosing the bench prompt's tokens in turn; the prompt is short.
The step's own CPU is counted apart (``fake_step_cpu_ms_per_token``), so the scheduler
thread's remaining CPU is what a token costs it outside the forward pass (sampling,
detokenizing, stop strings, the hand-off to the event loop). Run it at ``--threads 1``:
no kernel thread then spins waiting for a partner that another process holds off its
core, which on a loaded machine inflates the real step's CPU many times.

``--client``: how the streams read the SSE lines: ``stdlib`` (the bench's:
``http.client`` and ``json.loads``), ``httpx`` (httpx's line iterator and ``json.loads``)
or ``openai`` (the official client, which builds a pydantic object per chunk), to see
what the client costs the machine it shares with the server.

Usage: ``PYTHONPATH=<tree> python scripts/serve_cpu.py [--streams 4] [--tokens 128]
[--rounds 3] [--threads 2] [--fake-step] [--client stdlib|httpx|openai] [--pyspy out.txt]``
(the tree on PYTHONPATH is the code measured; prints JSON; py-spy from $PYSPY, else the
PATH)."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PYSPY = os.environ.get("PYSPY", "py-spy")
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def thread_names(pid: int) -> dict[int, str]:
    """Python threads' names by native id, from ``py-spy dump`` (none without py-spy)."""
    try:
        text = subprocess.run([PYSPY, "dump", "--nonblocking", "-p", str(pid)],
                              capture_output=True, text=True, timeout=60).stdout
    except FileNotFoundError:
        return {}
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', text)}


def _shared(port: int, create: bool = False) -> Any:
    """Counters the server child shares with the parent: the fake step's CPU seconds and
    calls, then for each GC generation 0-2: collections, seconds, the longest."""
    import numpy as np

    return np.memmap(f"/tmp/serve_cpu_{port}.step", np.float64, "w+" if create else "r+",
                     shape=(11,))


def _time_gc(shared: Any) -> None:
    """Count the server's garbage collections and their time into ``shared``."""
    import gc

    t0 = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            t0[0] = time.perf_counter()
            return
        at, took = 2 + 3 * info["generation"], time.perf_counter() - t0[0]
        shared[at] += 1
        shared[at + 1] += took
        shared[at + 2] = max(shared[at + 2], took)

    gc.callbacks.append(timed)


def spy_summary(path: str) -> dict[str, Any]:
    """Samples of a raw py-spy record by where they are (see the module docstring), and
    the functions the scheduler thread was in outside the step."""
    where: dict[str, int] = {}
    outside: dict[str, int] = {}
    for line in Path(path).read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        raw = stack.split(";")
        name, frames = raw[0].split(": ")[-1], [f.split(" (")[0] for f in raw]
        if name == "inferdesk-scheduler":
            if any("StepReplayer" in f or "_FakeStep" in f for f in frames):
                k = "scheduler: decode step"
            elif any(f in ("Scheduler._prefill", "Scheduler._start_chunk") for f in frames):
                k = "scheduler: prefill"
            elif "Condition.wait" in frames:
                k = "scheduler: idle"
            else:
                k = "scheduler: outside the step"
                at = [i for i, f in enumerate(frames) if f.startswith("Scheduler.")]
                fn = frames[min(at[-1] + 1, len(frames) - 1)] if at else frames[-1]
                outside[fn] = outside.get(fn, 0) + int(n)
        elif name == "MainThread":
            k = "event loop: select" if frames[-1] == "EpollSelector.select" else \
                "event loop: work"
        else:
            k = name
        where[k] = where.get(k, 0) + int(n)
    return {"where": dict(sorted(where.items(), key=lambda kv: -kv[1])),
            "scheduler_outside_by_function": dict(sorted(outside.items(),
                                                         key=lambda kv: -kv[1])[:12])}


class _FakeStep:
    """A decode step that runs no model: a pass over 64 MB (its CPU added to ``cpu``),
    then logits (rows, vocab) choosing ``ids`` in turn (the same id for every row)."""

    def __init__(self, vocab: int, ids: list[int], cpu: Any):
        import numpy as np

        self.np, self.vocab, self.ids, self.n, self.cpu = np, vocab, ids, 0, cpu
        self.bufs: dict[int, Any] = {}
        self.big = np.ones(16 << 20, np.float32)

    def __call__(self, model: Any, ids: Any, cache: Any) -> Any:
        t0 = time.thread_time()
        self.big.sum()
        self.cpu[0] += time.thread_time() - t0
        self.cpu[1] += 1
        rows = len(ids)
        out = self.bufs.get(rows)
        if out is None:
            out = self.bufs[rows] = self.np.zeros((rows, self.vocab), self.np.float32)
        out[:] = 0.0
        out[:, self.ids[self.n % len(self.ids)]] = 1.0
        self.n += 1
        return out

    def release(self) -> None:
        pass


def child(port: int, threads: int, fake: bool) -> None:
    """The server as `inferdesk serve --model smollm2 --backend cpu --parallel 8` runs it,
    its garbage collections timed, and with ``fake`` the decode step replaced."""
    from inference.bench import workloads
    from inference.server.run import load_engine, serve
    from inference.threads import set_threads

    shared = _shared(port, create=True)
    engine = load_engine("smollm2", None, "cpu", parallel=8)
    set_threads(threads, engine.llm.backend)
    if fake:
        tok = engine.llm.tokenizer
        ids = [i for i in tok.encode(workloads()[0]) if i not in tok.eos_ids]
        engine.scheduler._decode = _FakeStep(engine.llm.args.vocab_size, ids, shared)
    _time_gc(shared)
    serve(engine, port=port)


def _openai_stream(url: str, model: str, prompt: str, max_tokens: int) -> list[float]:
    """``bench_serve._stream_times`` through the openai client."""
    import openai

    with openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=900) as c:
        times = []
        for ch in c.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True):
            if ch.choices and ch.choices[0].text:
                times.append(time.perf_counter())
        return times


def _httpx_stream(url: str, model: str, prompt: str, max_tokens: int) -> list[float]:
    """``bench_serve._stream_times`` through httpx's line iterator."""
    import httpx2 as httpx

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    times = []
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices")
                if choices and choices[0].get("text"):
                    times.append(time.perf_counter())
    return times


def one_round(url: str, model: str, prompt: str, n: int, tokens: int, client: str
              ) -> list[list[float]]:
    """Each stream's token times (``bench_serve._round`` with the chosen client)."""
    from inference.server.bench_serve import _round, _stream_times

    stream = {"stdlib": _stream_times, "httpx": _httpx_stream, "openai": _openai_stream}[client]
    return _round(url, model, prompt, tokens, n, stream)[0]


def gap_summary(times: list[list[float]]) -> dict[str, Any]:
    """The gaps between a stream's consecutive tokens, all streams together: p50, mean,
    p99, and the gaps longer than 1.5x the p50: how many, where in their stream (the
    first 4 gaps, where the round's prefills fall, or later), and their time past the
    p50 spread over all gaps (what lifts the mean above the median)."""
    import numpy as np

    pos = [(j, g) for t in times for j, g in enumerate(np.diff(t) * 1e3)]
    if not pos:
        return {}
    gaps = np.array([g for _, g in pos])
    p50 = float(np.median(gaps))
    long = [(j, g) for j, g in pos if g > 1.5 * p50]
    return {"gaps": len(pos), "p50_ms": round(p50, 2), "mean_ms": round(float(gaps.mean()), 2),
            "p99_ms": round(float(np.percentile(gaps, 99)), 2), "long": len(long),
            "long_in_first_4": sum(j < 4 for j, _ in long),
            "long_excess_ms_per_gap": round(sum(g - p50 for _, g in long) / len(pos), 3)}


def main() -> None:
    from inference.bench import workloads
    from inference.server.bench_serve import (
        CONTINUATION,
        _free_port,
        _server,
        _stream_times,
    )

    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fake-step", action="store_true",
                   help="the server's decode step costs nothing; a short prompt")
    p.add_argument("--client", choices=["stdlib", "httpx", "openai"], default="stdlib",
                   help="how the streams read the SSE lines (the bench's: stdlib)")
    p.add_argument("--pyspy", help="also record the last round with py-spy (raw, by thread)")
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)  # the server child's port
    a = p.parse_args()
    if a.child:
        return child(a.child, a.threads, a.fake_step)
    prompt = "Once upon a time" if a.fake_step else workloads()[0] + CONTINUATION
    port = _free_port()
    argv = [sys.executable, __file__, "--child", str(port), "--threads", str(a.threads),
            *(["--fake-step"] if a.fake_step else [])]
    rounds = []
    with _server(argv, port) as (url, name):
        pid = next(int(q) for q in os.listdir("/proc") if q.isdigit() and _is_server(q, port))
        _stream_times(url, name, prompt, 4)  # JIT, first touch
        names = thread_names(pid)
        for r in range(a.rounds):
            spy = None
            if a.pyspy and r == a.rounds - 1:
                spy = subprocess.Popen([PYSPY, "record", "-r", "200", "--nonblocking",
                                        "--threads", "-p", str(pid), "-o", a.pyspy,
                                        "-f", "raw"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            shared = _shared(port)
            shared[4::3] = 0.0  # the longest collections: this round's
            f0 = shared.copy()
            s0, c0, t0 = thread_cpu(pid), own_cpu(), time.perf_counter()
            times = one_round(url, name, prompt, a.streams, a.tokens, a.client)
            n_tok = sum(map(len, times))
            s1, c1, wall = thread_cpu(pid), own_cpu(), time.perf_counter() - t0
            counts = shared - f0
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            by: dict[str, float] = {}
            for tid, cpu in s1.items():
                what = ("event loop" if tid == pid else names.get(tid, "other threads"))
                by[what] = by.get(what, 0.0) + cpu - s0.get(tid, 0.0)
            server = sum(by.values())
            row: dict[str, Any] = {
                "tokens": n_tok, "wall_s": round(wall, 3),
                "server_cpu_s": round(server, 3), "client_cpu_s": round(c1 - c0, 3),
                "server_cpu_ms_per_token": round(server / n_tok * 1e3, 3),
                "client_cpu_ms_per_token": round((c1 - c0) / n_tok * 1e3, 3),
                "server_threads_ms_per_token": {k: round(v / n_tok * 1e3, 3)
                                                for k, v in sorted(by.items())},
                "gaps": gap_summary(times)}
            row["gc"] = {f"gen{g}": {"collections": int(counts[2 + 3 * g]),
                                     "ms": round(counts[3 + 3 * g] * 1e3, 2),
                                     "longest_ms": round(float(shared[4 + 3 * g]) * 1e3, 2)}
                         for g in range(3)}
            fake = counts[:2]
            if a.fake_step and fake[1]:
                # The round's wall time that was not the fake step's CPU, per step: the
                # critical path's cost outside the step (prefill and HTTP setup included).
                row["fake_steps"] = int(fake[1])
                row["fake_step_cpu_ms_per_token"] = round(fake[0] / n_tok * 1e3, 3)
                row["wall_beyond_step_ms_per_step"] = round((wall - fake[0]) / fake[1] * 1e3,
                                                            3)
            if spy is not None:
                row["pyspy_samples"] = spy_summary(a.pyspy)
            rounds.append(row)
    Path(f"/tmp/serve_cpu_{port}.step").unlink(missing_ok=True)
    print(json.dumps({"streams": a.streams, "tokens_per_stream": a.tokens,
                      "fake_step": a.fake_step, "client": a.client,
                      "threads": a.threads, "code": os.environ.get("PYTHONPATH", "."),
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "loadavg_1m": round(os.getloadavg()[0], 2), "rounds": rounds},
                     indent=1))


def _is_server(pid: str, port: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (b"serve" in cmd or b"--child" in cmd) and str(port).encode() in cmd


if __name__ == "__main__":
    sys.exit(main())
