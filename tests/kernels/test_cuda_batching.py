"""The server's continuous batching on the CUDA backend, on the emulated device.

Batched decode steps are captured (one graph per set of sequences, a device position per
row) and replayed; each sequence samples on the device and its token is read only after
the next step is queued (one step behind). Requests served together get the tokens they
get alone through eager steps: the tiny float32 model's mat-vecs compute each row of a
tile by the one-row arithmetic, attention runs per row, and sampling draws the same
uniforms, so equality is exact here (float32 weights and cache).
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inference.backends as backends
from inference import load_model
from inference.backends.cuda import CudaBackend, CudaSampler, CudaSteps
from inference.events import DoneEvent
from inference.sampling import SamplingParams
from inference.server.scheduler import Request, Scheduler
from tests.kernels.emulator.device import EmulatedDevice

TINY = Path(__file__).resolve().parents[1] / "goldens" / "tiny"
PROMPTS = [[5, 17, 33, 2, 90, 41], [7, 7, 120, 3], [250, 11, 64, 8, 19, 23, 5, 44]]
SAMPLINGS = [SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.9, top_p=0.9, seed=11),
             SamplingParams(temperature=0.7, top_k=20, repetition_penalty=1.2, seed=3)]
MAX_TOKENS = [10, 5, 8]  # sequences leave the batch at different steps


@pytest.fixture(scope="module")
def gemma2() -> Any:
    # Gemma 2's tiny model: sliding layers (window 8, passed by every request here),
    # attention and final soft-caps, sandwich norms, the embedding scale.
    mod = types.ModuleType("cuda_emulated_for_tests")
    mod.probe = lambda: (True, "CUDA emulator (host)")
    mod.create = lambda: CudaBackend(EmulatedDevice(), kv_dtype=np.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, mod.__name__, mod)
        mp.setitem(backends._MODULES, "cuda-emulated", mod.__name__)
        yield load_model(str(TINY / "gemma2"), backend="cuda-emulated")


def _serve(llm: Any, which: list[int], parallel: int, top_logprobs: int | None = None
           ) -> tuple[list[list[int]], Scheduler, list[Any]]:
    """Requests ``which`` (indices of PROMPTS) submitted together: their token ids, the
    scheduler, and every log-probability record delivered."""
    done: dict[int, Any] = {}
    lps: list[Any] = []
    finished = threading.Event()

    def emit_for(i: int) -> Any:
        def emit(ev: Any, lp: Any) -> None:
            if lp is not None:
                lps.append(lp)
            if isinstance(ev, (DoneEvent, BaseException)):
                done[i] = ev
                if len(done) == len(which):
                    finished.set()
        return emit

    sched = Scheduler(llm, parallel=parallel, prompt_cache_bytes=0)
    try:
        for i in which:
            sched.submit(Request(PROMPTS[i], MAX_TOKENS[i], SAMPLINGS[i], emit_for(i),
                                 top_logprobs=top_logprobs))
        assert finished.wait(300)
    finally:
        sched.close()
    assert all(isinstance(done[i], DoneEvent) for i in which), done
    return [done[i].token_ids for i in which], sched, lps


def test_batched_steps_replay_and_equal_each_request_alone_and_eager(
        gemma2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    B = gemma2.backend
    B.graphs = False  # the reference: each request alone, every step eager
    alone = [_serve(gemma2, [i], 1)[0][0] for i in range(len(PROMPTS))]

    # Instrumented: the decode steps (the runner's calls) and, for each token read, how
    # many steps were queued between its sampling and its read.
    calls, behind = [0], []
    run, sample, read = CudaSteps.__call__, CudaSampler.sample, CudaSampler.read

    def counted(self: CudaSteps, *a: Any) -> Any:
        calls[0] += 1
        return run(self, *a)

    def tagged(self: CudaSampler, row: Any) -> Any:
        tok = sample(self, row)
        tok.step = calls[0]
        return tok

    def reading(self: CudaSampler, tok: Any) -> int:
        behind.append(calls[0] - tok.step)
        return read(self, tok)

    monkeypatch.setattr(CudaSteps, "__call__", counted)
    monkeypatch.setattr(CudaSampler, "sample", tagged)
    monkeypatch.setattr(CudaSampler, "read", reading)
    monkeypatch.setattr(CudaBackend, "sample", None)  # the synchronous read is not used
    B.graphs = True
    together, sched, _ = _serve(gemma2, [0, 1, 2], 3)
    assert together == alone
    assert [len(t) for t in together] == MAX_TOKENS
    steps = sched._decode
    assert isinstance(steps, CudaSteps) and steps.eager_reason is None
    # Batches of 3, 2 and 1 (as sequences leave): a capture each, every step a replay.
    assert sched.max_rows == 3 and steps.captures == 3 and steps.replays == calls[0]
    assert behind and min(behind) == 1  # every token read after the next step was queued


def test_a_request_with_logprobs_reads_its_token_at_once(gemma2: Any) -> None:
    # Its row is read with its token (the log-probabilities need it); the tokens are
    # those of the lazy path, and greedy picks the top one.
    gemma2.backend.graphs = True
    ids, _, lps = _serve(gemma2, [0], 1, top_logprobs=2)
    assert [lp.token_id for lp in lps] == ids[0] == _serve(gemma2, [0], 1)[0][0]
    assert all(lp.top[0][0] == lp.token_id for lp in lps)


def test_a_batch_whose_members_change_replays_one_graph(
        gemma2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two rows at a time for three requests: the second leaves after 5 tokens and the third
    # takes its row. The rows read their tokens, positions and KV buffers through the
    # table one copy writes before each replay, so the new pair replays the graph captured
    # for the first (a graph per set of sequences captured anew here).
    B = gemma2.backend
    B.graphs = False
    alone = [_serve(gemma2, [i], 1)[0][0] for i in range(len(PROMPTS))]

    sets: list[list[Any]] = []
    run = CudaSteps.__call__

    def recorded(self: CudaSteps, model: Any, ids: Any, cache: Any) -> Any:
        sets.append(list(getattr(cache, "caches", [cache])))  # kept alive: ids stay unique
        return run(self, model, ids, cache)

    monkeypatch.setattr(CudaSteps, "__call__", recorded)
    B.graphs = True
    together, sched, _ = _serve(gemma2, [0, 1, 2], 2)
    assert together == alone
    steps = sched._decode
    assert steps.eager_reason is None and steps.replays == len(sets)
    pairs = {tuple(map(id, s)) for s in sets if len(s) == 2}
    assert len(pairs) == 2  # the batch's members changed while it stayed two rows
    # One capture for both pairs, one for the last sequence alone.
    assert steps.captures == 2
