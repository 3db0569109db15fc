"""Inter-token gaps of the batching scheduler alone (no HTTP): one stream, then four
started together, each a greedy completion of the bench prompt. Prints JSON with p50/p99
gaps, p50 time to first token and the p99 ratio (4 streams / 1). Usage:
``PYTHONPATH=<tree> python scripts/serve_itl.py [tokens] [step_budget] [burst_hold]
[prompt_cache_mb]`` (the tree on PYTHONPATH is the code measured; the others default to
the scheduler's STEP_BUDGET, BURST_HOLD and PROMPT_CACHE_MB; 0 turns the burst rule or
the prompt cache off)."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from inference.api import load_model
from inference.bench import workloads
from inference.events import DoneEvent, TokenEvent
from inference.sampling import SamplingParams
from inference.server.bench_serve import CONTINUATION
from inference.server.prefix_pool import PROMPT_CACHE_MB
from inference.server.scheduler import BURST_HOLD, STEP_BUDGET, Request, Scheduler
from inference.threads import set_threads


def run(sched: Scheduler, ids: list[int], n: int, tokens: int) -> dict[str, float]:
    times: list[list[float]] = [[] for _ in range(n)]
    done = [threading.Event() for _ in range(n)]

    def emit_for(i: int):
        def emit(ev, _lp) -> None:
            if isinstance(ev, TokenEvent):
                times[i].append(time.perf_counter())
            if isinstance(ev, DoneEvent | BaseException):
                done[i].set()
        return emit

    t0 = time.perf_counter()
    for i in range(n):
        sched.submit(Request(list(ids), tokens, SamplingParams(temperature=0.0), emit_for(i)))
    for d in done:
        d.wait(1200)
    gaps = np.concatenate([np.diff(t) for t in times]) * 1e3
    ttft = [(t[0] - t0) * 1e3 for t in times]
    return {"streams": n, "gaps": int(gaps.size),
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1),
            "p50_ms": round(float(np.percentile(gaps, 50)), 1),
            "p99_ms": round(float(np.percentile(gaps, 99)), 1),
            "max_ms": round(float(gaps.max()), 1), "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else STEP_BUDGET
    hold = int(sys.argv[3]) if len(sys.argv) > 3 else BURST_HOLD
    cache_mb = int(sys.argv[4]) if len(sys.argv) > 4 else PROMPT_CACHE_MB
    llm = load_model("smollm2", backend="cpu")
    set_threads(2, llm.backend)
    ids = llm.plan(prompt=workloads()[0] + CONTINUATION, max_tokens=tokens)[0]
    sched = Scheduler(llm, parallel=8, step_budget=budget, burst_hold=hold,
                      prompt_cache_bytes=cache_mb << 20)
    try:
        run(sched, ids, 1, tokens)  # warm-up: JIT, first touch
        out = [run(sched, ids, 1, tokens), run(sched, ids, 4, tokens)]
    finally:
        sched.close()
    print(json.dumps({"prompt_tokens": len(ids), "step_budget": budget, "burst_hold": hold,
                      "prompt_cache_mb": sched.pool.max_bytes >> 20, "rounds": out,
                      "ratio_p99_4_over_1": round(out[1]["p99_ms"] / out[0]["p99_ms"], 2)}))


if __name__ == "__main__":
    main()
