"""Two bench figures that explain the decode speed: where a token's time goes, and how fast
each weight type of the file streams through the backend's mat-vec.

- :func:`decode_breakdown`: greedy decode steps with :class:`OpProfiler` on, so the time
  inside backend ops (kernels, with their Python dispatch) separates from the time outside
  them (model code, sampling, the token loop): the per-token overhead.
- :func:`step_replay`: on a backend that replays a captured decode step (``cpu``), the same
  steps unprofiled, eager against replayed, rounds taking turns: what the model's and the
  ops' Python cost a token, and the kernel calls a replayed token makes.
- :func:`weight_types`: for each weight type in the file, one of its 2-D tensors through
  ``backend.linear`` at one row, as Gweights/s (weights per second, 1e9).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from inference.backends.base import OpProfiler
from inference.generate import generate_step
from inference.sampling import SamplingParams

MIN_SECONDS = 0.2  # per weight type: enough calls to average out a scheduler tick


def decode_breakdown(model: Any, ids: Sequence[int], n_decode: int) -> dict[str, Any]:
    """Per decode token: wall ms, ms inside backend ops, ms outside them, op calls, and the
    ops that take the most. Profiling synchronises after every op and wraps each call, so
    the wall figure is a little above an unprofiled step's; the split is what it is for."""
    B = model.backend
    steps = generate_step(model.model, list(ids), SamplingParams(temperature=0.0),
                          np.random.default_rng(0), max_len=len(ids) + n_decode + 1)
    next(steps)  # prefill and the first token, not profiled
    prof = OpProfiler(B)
    prof.start()
    try:
        t0 = time.perf_counter()
        for _ in range(n_decode):
            next(steps)
        wall = time.perf_counter() - t0
    finally:
        prof.stop()
        steps.close()
    inside = sum(prof.totals.values())
    top = sorted(prof.totals.items(), key=lambda kv: -kv[1])[:6]
    return {
        "tokens": n_decode,
        "ms_per_token": round(wall / n_decode * 1e3, 3),
        "ops_ms_per_token": round(inside / n_decode * 1e3, 3),
        "outside_ops_ms_per_token": round((wall - inside) / n_decode * 1e3, 3),
        "op_calls_per_token": round(sum(prof.counts.values()) / n_decode, 1),
        "top_ops_ms_per_token": {k: round(v / n_decode * 1e3, 3) for k, v in top},
    }


def step_replay(model: Any, ids: Sequence[int], n_decode: int, rounds: int = 3
                ) -> dict[str, Any] | None:
    """ms per decode token with the captured step replayed and without (``None`` where the
    backend has no replay), medians over ``rounds`` turns each, and the replay's calls."""
    B = model.backend
    if not hasattr(B, "step_replay"):
        return None
    samplers: list[Any] = []
    real = B.start_generation

    def start(*args: Any) -> Any:
        samplers.append(real(*args))
        return samplers[-1]

    def ms_per_token(replay: bool) -> float:
        B.step_replay = replay
        steps = generate_step(model.model, list(ids), SamplingParams(temperature=0.0),
                              np.random.default_rng(0), max_len=len(ids) + n_decode + 1)
        next(steps)
        t0 = time.perf_counter()
        for _ in range(n_decode):
            next(steps)
        dt = time.perf_counter() - t0
        steps.close()
        return dt / n_decode * 1e3

    B.start_generation = start
    try:
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for replay in (False, True):
                times[replay].append(ms_per_token(replay))
    finally:
        B.step_replay = True
        del B.start_generation
    last = samplers[-1].steps
    eager, replayed = (float(np.median(times[k])) for k in (False, True))
    return {"eager_ms_per_token": round(eager, 3), "replayed_ms_per_token": round(replayed, 3),
            "python_ms_per_token": round(eager - replayed, 3),
            "replay_calls_per_token": len(last.replay.tape.calls) if last.replay else None,
            "eager_reason": last.eager_reason,
            "samples_ms": {"eager": [round(t, 3) for t in times[False]],
                           "replayed": [round(t, 3) for t in times[True]]}}


def weight_types(ckpt: Any, backend: Any) -> dict[str, Any]:
    """Gweights/s of a one-row ``linear`` for each weight type of ``ckpt``, on the largest
    2-D tensor of that type (the output head when it is the largest: it is read every
    token too)."""
    by_type: dict[str, list[Any]] = {}
    for t in ckpt.tensors.values():
        if len(t.shape) == 2:
            by_type.setdefault(t.qtype, []).append(t)
    largest = {q: max(ts, key=lambda t: t.shape[0] * t.shape[1]) for q, ts in by_type.items()}
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for qtype, t in sorted(largest.items()):
        w = backend.weight(t)
        x = backend.array(rng.standard_normal((1, t.shape[1])).astype(np.float32))
        backend.synchronize(backend.linear(x, w))  # compile, page in
        calls, t0 = 0, time.perf_counter()
        while True:
            y = backend.linear(x, w)
            calls += 1
            if calls % 8 == 0:
                backend.synchronize(y)
                if time.perf_counter() - t0 >= MIN_SECONDS:
                    break
        dt = (time.perf_counter() - t0) / calls
        out[qtype] = {"tensor": t.name, "shape": list(t.shape),
                      "gweights_s": round(t.shape[0] * t.shape[1] / dt / 1e9, 2)}
    return out
