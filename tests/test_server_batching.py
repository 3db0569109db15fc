"""Continuous batching is exact on `cpu`: a request's tokens do not depend on what runs
beside it. Each of 8 concurrent requests (greedy and seeded) yields the very tokens the
same request yields alone (scheduler/module docstring: why bitwise equality holds here)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from inference.errors import InferdeskError
from inference.events import DoneEvent
from inference.sampling import SamplingParams
from inference.server.scheduler import PrefillBudget, Request, Scheduler
from tests.server_support import alone, engine, server  # noqa: F401

TOPICS = ["rivers", "owls", "bread", "chess", "rain", "glass", "tea", "maps"]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write one sentence about {TOPICS[i]}."}]


def _sampling(i: int) -> SamplingParams:
    # Even: greedy; odd: seeded sampling with a top-p cut.
    return (SamplingParams(temperature=0.0) if i % 2 == 0
            else SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i))


class WorkClock:
    """A clock that moves only with the model's work: ``decode`` per layer of a decode
    step, ``prefill`` per layer per prompt token. The scheduler's prefill budget then
    plans the same steps on any machine, however busy."""

    def __init__(self, llm, monkeypatch, decode: float = 1.0, prefill: float = 0.05):
        self.now = 0.0
        self.decode, self.prefill = decode, prefill
        monkeypatch.setattr(llm.model, "layers", [_Timed(la, self) for la in llm.model.layers])

    def __call__(self) -> float:
        return self.now


class _Timed:
    """A decoder layer that advances a WorkClock by its work when called."""

    def __init__(self, layer, clock: WorkClock):
        self.layer, self.clock = layer, clock

    def __call__(self, x, cache):
        t = x.shape[1]
        self.clock.now += self.clock.decode if t == 1 else self.clock.prefill * t
        return self.layer(x, cache)

    def __getattr__(self, name):
        return getattr(self.layer, name)


def _run_together(sched: Scheduler, prompts: list[list[int]], max_tokens: int,
                  samplings: list[SamplingParams]) -> list[DoneEvent]:
    done: list[DoneEvent | None] = [None] * len(prompts)
    finished = [threading.Event() for _ in prompts]

    def emit_for(i: int):
        def emit(ev, _lp):
            if isinstance(ev, BaseException) or isinstance(ev, DoneEvent):
                done[i] = ev
                finished[i].set()
        return emit

    for i, ids in enumerate(prompts):  # all queued before the first step can finish
        sched.submit(Request(ids, max_tokens, samplings[i], emit_for(i)))
    for f in finished:
        assert f.wait(600)
    for d in done:
        assert isinstance(d, DoneEvent), d
    return done  # type: ignore[return-value]


def test_eight_concurrent_requests_equal_each_alone(engine, monkeypatch):  # noqa: F811
    llm = engine.llm
    prompts = [llm.plan(messages=_messages(i), max_tokens=4)[0] for i in range(8)]
    ref = [alone(llm, _messages(i), max_tokens=4, temperature=s.temperature, top_p=s.top_p,
                 seed=s.seed).token_ids for i, s in enumerate(map(_sampling, range(8)))]
    # Prefill cheap next to a decode step: each short prompt (~36 tokens) fits the budget
    # of one step, so the 4-token answers overlap and share decode steps.
    sched = Scheduler(llm, parallel=8, clock=WorkClock(llm, monkeypatch, prefill=0.01))
    try:
        got = _run_together(sched, prompts, 4, [_sampling(i) for i in range(8)])
    finally:
        sched.close()
    assert [d.token_ids for d in got] == ref
    assert sched.max_rows >= 3  # the decode steps really were shared


def test_chunked_prefill_is_the_same_alone_or_in_company(engine, monkeypatch):  # noqa: F811
    """A prompt longer than the chunk is prefilled in chunks at fixed positions, one
    sequence per forward pass, so company changes nothing (24-token chunks keep this
    cheap). In company a chunk's pass is spread over steps, a few layers per step beside
    the others' decode steps, as the budget plans; alone each chunk runs in one step."""
    llm = engine.llm
    n_layers = len(llm.model.layers)
    long = [{"role": "user", "content": "List the planets of the solar system in order from "
                                         "the sun, with one fact about each of them."}]
    ids = llm.plan(messages=long, max_tokens=6)[0]
    assert len(ids) > 2 * 24
    others = [llm.plan(messages=_messages(i), max_tokens=6)[0] for i in range(3)]
    samplings = [_sampling(1)] + [_sampling(i) for i in range(3)]
    solo = Scheduler(llm, parallel=4, prefill_chunk=24)
    try:
        by_itself = _run_together(solo, [ids], 6, samplings[:1])[0]
    finally:
        solo.close()
    # A decode step costs 30 units, one layer of a 24-token chunk 1.2: with a budget of one
    # decode step, 25 layers fit. No burst hold: the others decode while it prefills.
    mixed = Scheduler(llm, parallel=4, prefill_chunk=24, step_budget=1.0,
                      clock=WorkClock(llm, monkeypatch), burst_hold=0)
    try:
        # The others go first, so the long prompt's chunks run between their decode steps.
        together = _run_together(mixed, others + [ids], 6, samplings[1:] + samplings[:1])
    finally:
        mixed.close()
    assert together[-1].token_ids == by_itself.token_ids
    assert mixed.max_rows >= 2
    assert all(p.chunk_done for p in solo.plans if p.chunk_tokens)
    assert all(p.chunk_done for p in mixed.plans if p.chunk_tokens and not p.decode_rows)
    beside = [p for p in mixed.plans if p.chunk_tokens == 24 and p.decode_rows]
    assert beside and all(p.layers <= 25 for p in beside)
    assert any(not p.chunk_done for p in beside)  # a chunk really was split
    assert sum(p.layers for p in mixed.plans if p.chunk_tokens) % n_layers == 0


def test_a_burst_prefills_every_prompt_before_the_first_decode_step(engine):  # noqa: F811
    """Four requests arriving together: the first one's first token waits while the other
    prompts prefill in whole chunks, then all four decode together; each gets the tokens
    it gets alone. Without the hold (burst_hold=0) the first decodes alone at once."""
    llm = engine.llm
    prompts = [llm.plan(messages=_messages(i), max_tokens=4)[0] for i in range(4)]
    samplings = [_sampling(i) for i in range(4)]
    solo = []
    for p, sp in zip(prompts, samplings, strict=True):
        one = Scheduler(llm, parallel=1, prefill_chunk=24, prompt_cache_bytes=0)
        try:
            solo.append(_run_together(one, [p], 4, [sp])[0].token_ids)
        finally:
            one.close()
    first_rows = {}
    for hold in (0, 4 * 128):
        sched = Scheduler(llm, parallel=4, prefill_chunk=24, burst_hold=hold,
                          prompt_cache_bytes=0)
        try:
            got = _run_together(sched, prompts, 4, samplings)
        finally:
            sched.close()
        assert [d.token_ids for d in got] == solo
        plans = list(sched.plans)
        first = next(i for i, p in enumerate(plans) if p.decode_rows)
        first_rows[hold] = plans[first].decode_rows
        if hold:  # every chunk before it ran whole, and none after it
            assert all(p.chunk_done for p in plans[:first + 1] if p.chunk_tokens)
            assert not any(p.chunk_tokens for p in plans[first + 1:])
    assert first_rows == {0: 1, 4 * 128: 4}


def test_the_prefill_budget_fits_layers_into_a_share_of_a_decode_step():
    full, half = PrefillBudget(share=1.0), PrefillBudget(share=0.5)
    for b in (full, half):
        assert b.layers(128) == 1  # nothing measured yet
        b.decoded(0.030)
        b.prefilled(0.512, 32, 128)  # 1/8 ms per token and layer: 16 ms per 128-token layer
    assert full.layers(128) == 1
    assert (full.layers(24), half.layers(24)) == (10, 5)
    assert full.layers(1000) == 1  # never nothing: the prompt must progress
    full.decoded(0.130)  # a slower decode step (more rows) leaves room for more
    assert full.layers(24) == 20
    with pytest.raises(InferdeskError):
        PrefillBudget(share=0)


def test_a_shared_prompt_prefix_is_copied_and_changes_no_token(engine, monkeypatch):  # noqa: F811
    """Requests that start with the same long system prompt copy its whole prefill chunks
    from the one already prefilled, and still get exactly the tokens they get alone; on
    `cpu` their batched decode steps read the copied rows from one sequence's buffers."""
    from inference.backends.cpu import backend as cpu_backend

    llm = engine.llm
    reads = []
    real = cpu_backend._prefix_sources
    monkeypatch.setattr(cpu_backend, "_prefix_sources",
                        lambda cs: reads.append(real(cs)) or reads[-1])
    system = {"role": "system", "content": "You are a careful assistant for a museum of "
              "natural history. Answer in one short sentence, plainly, without lists, and "
              "mention one exhibit of the museum when it fits the question."}
    convs = [[system, *_messages(i)] for i in range(4)]
    prompts = [llm.plan(messages=c, max_tokens=5)[0] for c in convs]
    assert min(len(p) for p in prompts) > 2 * 24
    samplings = [_sampling(i) for i in range(4)]
    alone_tokens = []
    for p, sp in zip(prompts, samplings, strict=True):
        solo = Scheduler(llm, parallel=1, prefill_chunk=24)
        try:
            alone_tokens.append(_run_together(solo, [p], 5, [sp])[0].token_ids)
        finally:
            solo.close()
        assert solo.shared_tokens == 0
    sched = Scheduler(llm, parallel=4, prefill_chunk=24)
    try:
        together = _run_together(sched, prompts, 5, samplings)
    finally:
        sched.close()
    assert [d.token_ids for d in together] == alone_tokens
    assert sched.shared_tokens >= 3 * 48  # each later request copied >= 2 whole chunks
    if llm.backend.name == "cpu":
        assert max(min(shared[1:]) for _, shared in reads if len(shared) == 4) >= 48


def test_concurrent_http_clients_get_what_they_get_alone(engine, server,  # noqa: F811
                                                         monkeypatch):
    """Through the server: 8 clients at once, each answer equal to the same request made
    through CausalLM.generate by itself."""
    llm = engine.llm
    ref = []
    for i in range(8):
        s = _sampling(i)
        ref.append(alone(llm, _messages(i), max_tokens=4, temperature=s.temperature,
                         top_p=s.top_p, seed=s.seed).text)
    before = engine.scheduler.max_rows
    engine.scheduler.max_rows = 0
    # 4-token answers: with the default budget one may end before the next is prefilled;
    # prefill whole chunks instead, so the answers overlap (exactness is the point here).
    monkeypatch.setattr(engine.scheduler.budget, "share", 1e6)
    barrier = threading.Barrier(8)

    def ask(i: int) -> str:
        s = _sampling(i)
        with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600) as c:
            barrier.wait()
            r = c.chat.completions.create(model=llm.name, messages=_messages(i), max_tokens=4,
                                          temperature=s.temperature, top_p=s.top_p,
                                          seed=s.seed)
        return r.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(ask, range(8)))
    assert got == ref
    assert engine.scheduler.max_rows >= 2
    engine.scheduler.max_rows = max(before, engine.scheduler.max_rows)


def test_a_batch_size_is_checked_once_per_scheduler(engine):  # noqa: F811
    """The scheduler drops its captured step when the last sequence leaves (it holds
    their caches), but keeps the record of batch sizes whose replay agreed with an eager
    step: the next burst of the same size replays without running that check again (a
    step that costs an eager step plus a replay)."""
    from inference.backends.cpu.replay import StepReplayer

    llm = engine.llm
    prompts = [llm.plan(messages=_messages(i), max_tokens=5)[0] for i in range(2)]
    greedy = [SamplingParams(temperature=0.0)] * 2
    sched = Scheduler(llm, parallel=2)
    steps = sched._decode
    assert isinstance(steps, StepReplayer)
    checks: list[int] = []
    verify = steps._verify
    steps._verify = lambda model, ids, cache, caches: (checks.append(len(caches)),
                                                        verify(model, ids, cache, caches))[1]
    try:
        first = _run_together(sched, prompts, 5, greedy)
        assert sched._decode is steps and steps.replay is None  # released, not replaced
        again = _run_together(sched, prompts, 5, greedy)
    finally:
        sched.close()
    assert [d.token_ids for d in again] == [d.token_ids for d in first]
    assert 2 in steps.verified and checks.count(2) == 1 and steps.captures >= 2
